"""Tests for the offline demo model builder: determinism, reuse, crash safety, valid output."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mcp_infra.demo import models as demo_models  # noqa: E402
from mcp_infra.demo.models import DEFAULT_SPEC, DEMO_SPEC_VERSION, MARKER_NAME, build_demo_models
from mcp_infra.state.hostfacts import model_fingerprint

REQUIRED_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_demo_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def loaded(built: dict[str, Path]):  # type: ignore[no-untyped-def]
    from mlx_lm import load

    target, tokenizer = load(str(built["target"]))
    draft, _ = load(str(built["draft"]))
    return target, draft, tokenizer


def _chat_prompt(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def _greedy(model, tokenizer, prompt: list[int], n: int, **kw) -> list[int]:  # type: ignore[no-untyped-def]
    from mlx_lm.generate import stream_generate

    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=n, **kw)]


def test_layout_and_marker(built: dict[str, Path]) -> None:
    assert set(built) == {"target", "draft"}
    for role, path in built.items():
        names = {p.name for p in path.iterdir()}
        assert names >= REQUIRED_FILES
        marker = json.loads((path / MARKER_NAME).read_text())
        assert marker["version"] == DEMO_SPEC_VERSION
        assert marker["role"] == role
    # The two share one tokenizer, byte for byte.
    assert (built["target"] / "tokenizer.json").read_bytes() == (
        built["draft"] / "tokenizer.json"
    ).read_bytes()
    tcfg = json.loads((built["target"] / "tokenizer_config.json").read_text())
    assert tcfg["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tcfg["chat_template"]
    layers = json.loads((built["target"] / "config.json").read_text())["num_hidden_layers"]
    assert layers == DEFAULT_SPEC.draft_layers + DEFAULT_SPEC.target_extra_layers


def test_build_is_deterministic(tmp_path: Path, built: dict[str, Path]) -> None:
    again = build_demo_models(tmp_path / "other")
    for role in ("target", "draft"):
        assert model_fingerprint(again[role]) == model_fingerprint(built[role])
    assert model_fingerprint(built["target"]) != model_fingerprint(built["draft"])


def test_reuse_skips_rebuild_and_stale_marker_rebuilds(tmp_path: Path) -> None:
    paths = build_demo_models(tmp_path)
    weights = paths["target"] / "model.safetensors"
    before = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    fp = model_fingerprint(paths["target"])
    assert build_demo_models(tmp_path) == paths
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == before

    # A marker from another spec version means the folder is stale: rebuilt, same bytes again.
    marker = paths["draft"] / MARKER_NAME
    data = json.loads(marker.read_text())
    marker.write_text(json.dumps({**data, "version": "old"}))
    build_demo_models(tmp_path)
    assert json.loads(marker.read_text())["version"] == DEMO_SPEC_VERSION
    assert model_fingerprint(paths["target"]) == fp
    # A folder without a marker (e.g. hand-made) is not trusted either.
    (paths["target"] / MARKER_NAME).unlink()
    build_demo_models(tmp_path)
    assert model_fingerprint(paths["target"]) == fp
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in {"target", "draft"}]
    assert all(name == ".demo_build.lock" for name in leftovers)


def test_other_spec_is_not_reused(tmp_path: Path) -> None:
    paths = build_demo_models(tmp_path)
    fp = model_fingerprint(paths["target"])
    other = dataclasses.replace(DEFAULT_SPEC, target_extra_layers=3)
    build_demo_models(tmp_path, other)
    assert model_fingerprint(paths["target"]) != fp
    cfg = json.loads((paths["target"] / "config.json").read_text())
    assert cfg["num_hidden_layers"] == DEFAULT_SPEC.draft_layers + 3


def test_crash_leaves_no_half_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in, and why: a crash after the target is written but before the build is renamed
    into place cannot be provoked from outside at that exact instant; the real writer runs,
    then raises, so what is tested is the build's own clean-up of its temporary folder."""
    real = demo_models._write_model

    def crash_on_target(folder: Path, spec, role: str, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        real(folder, spec, role, *args, **kwargs)
        if role == "target":
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(demo_models, "_write_model", crash_on_target)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_demo_models(tmp_path)
    assert not (tmp_path / "target").exists()
    assert not (tmp_path / "draft").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".demo-build-")]

    # A good build survives a crashing rebuild for another spec.
    monkeypatch.setattr(demo_models, "_write_model", real)
    good = build_demo_models(tmp_path)
    fp = model_fingerprint(good["target"])
    monkeypatch.setattr(demo_models, "_write_model", crash_on_target)
    with pytest.raises(RuntimeError):
        build_demo_models(tmp_path, dataclasses.replace(DEFAULT_SPEC, target_extra_layers=3))
    assert model_fingerprint(good["target"]) == fp


def test_fingerprint_sees_names_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"xy")
    fp = model_fingerprint(tmp_path)
    assert model_fingerprint(tmp_path) == fp
    (tmp_path / "a").write_bytes(b"xz")
    assert model_fingerprint(tmp_path) != fp
    (tmp_path / "a").rename(tmp_path / "b")
    assert model_fingerprint(tmp_path) != fp
    with pytest.raises(FileNotFoundError):
        model_fingerprint(tmp_path / "missing")


def test_every_token_decodes_to_valid_text(loaded) -> None:  # type: ignore[no-untyped-def]
    _, _, tokenizer = loaded
    vocab = tokenizer._tokenizer.get_vocab()
    assert len(vocab) == DEFAULT_SPEC.vocab_size
    for token_id in range(DEFAULT_SPEC.vocab_size):
        text = tokenizer.decode([token_id])
        assert "\ufffd" not in text
        assert text.isascii()
    prompt = _chat_prompt(tokenizer, "Hello, how fast is this?")
    assert tokenizer.decode(prompt) == (
        "<|im_start|>user\nHello, how fast is this?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_generates_valid_text_to_max_tokens(loaded) -> None:  # type: ignore[no-untyped-def]
    target, draft, tokenizer = loaded
    special = {tokenizer._tokenizer.convert_tokens_to_ids(t) for t in demo_models.SPECIAL_TOKENS}
    cases = [(draft, t, 64) for t in ("Hello, how fast is this?", "Write a story.", "ünï ✓")]
    cases.append((target, "Hello, how fast is this?", 24))  # the target is the slow one
    for model, text, n in cases:
        ids = _greedy(model, tokenizer, _chat_prompt(tokenizer, text), n)
        assert len(ids) == n  # no EOS: every request runs to max_tokens
        assert not special & set(ids)
        out = tokenizer.decode(ids)
        assert "\ufffd" not in out
        assert out.strip()


def test_target_extends_draft_and_speculation_is_lossless(loaded) -> None:  # type: ignore[no-untyped-def]
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.generate import stream_generate

    target, draft, tokenizer = loaded
    tw = dict(tree_flatten(target.parameters()))
    for name, w in tree_flatten(draft.parameters()):
        assert mx.array_equal(tw[name], w).item(), name

    prompt = _chat_prompt(tokenizer, "What is the capital of France?")
    reference = _greedy(target, tokenizer, prompt, 40)
    accepted = 0
    for k in (2, 4):
        ids = []
        for r in stream_generate(
            target, tokenizer, prompt, max_tokens=40, draft_model=draft, num_draft_tokens=k
        ):
            ids.append(r.token)
            accepted += int(r.from_draft)
        assert ids == reference
    # The draft helps (some tokens come from it) but is not the target in disguise.
    assert accepted > 0
    assert _greedy(draft, tokenizer, prompt, 40) != reference
