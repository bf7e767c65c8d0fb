"""Launch templates: a typed ``Recipe`` becomes an argv list (no shell, no free text from a
plan), and the flags a runtime version accepts, read from its ``--help``.

Pure, so preflight can tell which flags a candidate's knobs would pass before anything starts,
and refuse a flag its runtime version does not know (``unknown_flags``).
"""

from __future__ import annotations

import re

from mcp_infra.contracts import Knobs, Recipe, TemplateName


def _opt(flag: str, value: object | None) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _server_head(template: str, recipe: Recipe, host: str, port: int, python: str) -> list[str]:
    """The start every template shares: the server module (``SERVER_MODULES``), the model and
    the address."""
    module = SERVER_MODULES[template]
    return [python, *module, "--model", recipe.model_path, "--host", host, "--port", str(port)]


def _draft_path(recipe: Recipe) -> str:
    if not recipe.draft_path:
        raise ValueError("recipe asks for a draft but has no draft path")
    return recipe.draft_path


def _kv_quantization(knobs: Knobs) -> list[str]:
    """The KV-cache quantization flags, spelled alike by both servers."""
    return (
        _opt("--kv-bits", knobs.kv_bits)
        + _opt("--kv-group-size", knobs.kv_group_size)
        + _opt("--quantized-kv-start", knobs.quantized_kv_start)
    )


def mlx_lm_server_argv(recipe: Recipe, host: str, port: int, python: str) -> list[str]:
    knobs = recipe.knobs
    argv = _server_head("mlx_lm_server", recipe, host, port, python)
    if knobs.draft:
        argv += ["--draft-model", _draft_path(recipe)]
        argv += _opt("--num-draft-tokens", knobs.num_draft_tokens)
    argv += _kv_quantization(knobs)
    argv += _opt("--prefill-step-size", knobs.prefill_step_size)
    argv += _opt("--prompt-cache-size", knobs.prompt_cache_size)
    argv += _opt("--prompt-cache-bytes", knobs.prompt_cache_bytes)
    argv += _opt("--decode-concurrency", knobs.decode_concurrency)
    argv += _opt("--prompt-concurrency", knobs.prompt_concurrency)
    if knobs.draft_kind or knobs.draft_block_size or knobs.max_kv_size:
        raise ValueError("mlx_lm_server supports no draft_kind, draft_block_size or max_kv_size")
    return argv


def mlx_vlm_server_argv(recipe: Recipe, host: str, port: int, python: str) -> list[str]:
    """``python -m mlx_vlm.server`` with the flags of its real CLI (checked against
    ``--help`` of mlx-vlm 0.6.16 and 0.7.10): ``--model --host --port --draft-model
    --draft-kind {dflash,eagle3,mtp} --draft-block-size --kv-bits --kv-group-size
    --quantized-kv-start --max-kv-size --prefill-step-size``. ``--host`` is always passed: the
    server binds 0.0.0.0 by default. Without ``draft_block_size`` the drafter's own configured
    block size is used; without ``draft_kind`` mlx-vlm detects it from the drafter's config.
    ``--trust-remote-code`` is never passed."""
    knobs = recipe.knobs
    argv = _server_head("mlx_vlm_server", recipe, host, port, python)
    if knobs.draft:
        argv += ["--draft-model", _draft_path(recipe)]
        argv += _opt("--draft-kind", knobs.draft_kind)
        argv += _opt("--draft-block-size", knobs.draft_block_size)
    elif knobs.draft_kind or knobs.draft_block_size:
        raise ValueError("draft_kind and draft_block_size need draft: true")
    argv += _kv_quantization(knobs)
    argv += _opt("--max-kv-size", knobs.max_kv_size)
    argv += _opt("--prefill-step-size", knobs.prefill_step_size)
    lm_only = (knobs.prompt_cache_bytes, knobs.decode_concurrency, knobs.prompt_concurrency)
    if knobs.num_draft_tokens or knobs.prompt_cache_size is not None or any(lm_only):
        raise ValueError(
            "mlx_vlm_server supports no num_draft_tokens, prompt cache or concurrency knobs"
        )
    return argv


TEMPLATES = {"mlx_lm_server": mlx_lm_server_argv, "mlx_vlm_server": mlx_vlm_server_argv}


SERVER_MODULES: dict[str, list[str]] = {
    "mlx_lm_server": ["-m", "mlx_lm", "server"],
    "mlx_vlm_server": ["-m", "mlx_vlm.server"],
    "mlx_lm_distributed": ["-m", "mlx_lm", "server"],  # each rank's server, under mlx.launch
}
"""How each template's server is started from an interpreter (its ``--help`` the same way)."""

_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


def help_flags(text: str) -> list[str]:
    """Every long option an argparse ``--help`` text lists (usage and option lines alike)."""
    return sorted(set(_FLAG.findall(text)) - {"--help"})


_CHOICES = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)[ =]\{([^{}\s]+)\}")


def help_choices(text: str) -> dict[str, list[str]]:
    """The values an argparse ``--help`` lists for each option with choices
    (``--q-mode {affine,mxfp4}`` → ``{"--q-mode": ["affine", "mxfp4"]}``)."""
    return {flag: values.split(",") for flag, values in _CHOICES.findall(text)}


def flags_of(argv: list[str]) -> list[str]:
    """The long options an argv passes, in order, once each."""
    seen: list[str] = []
    for arg in argv:
        if _FLAG.fullmatch(arg) and arg not in seen:
            seen.append(arg)
    return seen


def template_flags(template: TemplateName, knobs: Knobs) -> list[str]:
    """The flags a template passes for these knobs (paths and port are placeholders). Knobs
    the template refuses raise ``ValueError``, as they would at launch."""
    recipe = Recipe(
        candidate_id="x:y",
        template=template,
        model_path="MODEL",
        draft_path="DRAFT" if knobs.draft else None,
        knobs=knobs,
    )
    return flags_of(TEMPLATES[template](recipe, "127.0.0.1", 8080, "python"))


def unknown_flags(template: TemplateName, knobs: Knobs, accepted: list[str]) -> list[str]:
    """The flags these knobs would pass that a runtime's ``--help`` does not list."""
    known = set(accepted)
    return [f for f in template_flags(template, knobs) if f not in known]
