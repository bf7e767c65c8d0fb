"""Preflight against the live model: the same target, a drafter's tokenizer, a KV group size
that divides the head dimension, whether the runtime loads it, memory. Pure: the facts are
written out as preflight receives them from ``state.owncatalog.model_facts``."""

from __future__ import annotations

from mcp_infra.contracts import FolderFacts, Manifest, ModelShape, TokenizerFacts
from mcp_infra.core.preflight import CHECKS, HostFacts, preflight
from mcp_infra.state.catalog import load_policy

POLICY = load_policy("default")
LIVE = "/models/mine"
TOKENS = TokenizerFacts(
    source="tokenizer.json", vocab_size=700, vocab_sha256="a" * 64, special={"eos": 2}
)


def folder(path: str, tokenizer: TokenizerFacts = TOKENS, **shape: object) -> FolderFacts:
    return FolderFacts(
        path=path,
        shape=ModelShape.model_validate({"model_type": "llama", "head_dim": 32, **shape}),
        tokenizer=tokenizer,
        weights_bytes=1_000_000,
        loaders=["mlx_lm_server", "mlx_lm_distributed"],
    )


def host(**folders: FolderFacts) -> HostFacts:
    live = folder(LIVE)
    return HostFacts(
        platform="linux-x86_64",
        packages={"mlx": "0.32.4", "mlx-lm": "0.32.2"},
        memory_gb=24,
        free_disk_gb=100,
        target=live,
        artifact_paths={f"path:{f.path}": f.path for f in folders.values()}
        | {f"path:{LIVE}": LIVE},
        folders={LIVE: live, **{f.path: f for f in folders.values()}},
    )


def manifest(target: str = LIVE, drafter: str | None = None, **knobs: object) -> Manifest:
    return Manifest.model_validate(
        {
            "id": "mine",
            "title": "t",
            "class": "acceleration_plugin" if drafter else "kv_cache",
            "semantics": "lossless" if drafter else "lossy",
            "license_reviewed": True,
            "runtime": {"template": "mlx_lm_server", "platforms": ["linux-x86_64"]},
            "target": {"role": "target", "path": target},
            "artifacts": [{"role": "draft", "path": drafter}] if drafter else [],
            "variants": [{"id": "v", "knobs": knobs}],
        }
    )


def failures(m: Manifest, facts: HostFacts) -> dict[str, str]:
    result = preflight(m, m.variants[0], POLICY, facts, require_artifacts=True)
    return {c.name: c.detail for c in result.checks if not c.passed}


def test_every_check_is_a_short_named_function_of_the_table() -> None:
    import inspect

    for check in CHECKS:
        lines = inspect.getsource(check).count("\n")
        assert lines <= 30, f"{check.__name__} is {lines} lines"


def test_a_candidate_for_the_live_model_passes() -> None:
    facts = host(draft=folder("/hub/draft"))
    assert failures(manifest(drafter="/hub/draft", draft=True, num_draft_tokens=2), facts) == {}


def test_another_model_s_candidate_is_refused() -> None:
    facts = host(other=folder("/models/other"))
    said = failures(manifest(target="/models/other", kv_bits=8, kv_group_size=32), facts)
    assert said == {
        "same_target": "another model's candidate: its target is /models/other, not the live model"
    }


def test_a_drafter_with_another_tokenizer_is_refused_with_the_reason() -> None:
    other = TOKENS.model_copy(update={"vocab_size": 600, "vocab_sha256": "b" * 64})
    facts = host(draft=folder("/hub/draft", tokenizer=other))
    said = failures(manifest(drafter="/hub/draft", draft=True, num_draft_tokens=2), facts)
    assert said == {
        "drafter_tokenizer": "the drafter's tokenizer disagrees with the target's: another "
        "vocabulary (600 tokens against the target's 700)"
    }


def test_a_kv_group_size_that_does_not_divide_the_head_dimension_is_refused() -> None:
    facts = host()
    said = failures(manifest(kv_bits=4, quantized_kv_start=0), facts)  # the runtime's 64
    assert said == {
        "kv_group": "KV group size 64 does not divide the live model's head dimension 32: every "
        "request would fail in mx.quantize (groups that divide it: 32)"
    }
    assert failures(manifest(kv_bits=4, kv_group_size=32), facts) == {}


def test_a_model_the_runtime_cannot_load_is_refused() -> None:
    odd = folder("/hub/draft").model_copy(update={"loaders": []})
    said = failures(manifest(drafter="/hub/draft", draft=True), host(draft=odd))
    assert said["loadable:draft"].endswith(
        "cannot load model_type 'llama' (draft /hub/draft): it has no module for it"
    )


def test_models_that_do_not_fit_memory_are_refused() -> None:
    huge = folder("/hub/draft").model_copy(update={"weights_bytes": 30 * 2**30})
    said = failures(manifest(drafter="/hub/draft", draft=True), host(draft=huge))
    assert said["model_memory"].startswith("does not fit: its weights are 30.00 GiB")


def test_a_home_with_no_live_model_compares_nothing() -> None:
    facts = host().model_copy(update={"target": None})
    result = preflight(manifest(kv_bits=4), manifest().variants[0], POLICY, facts)
    same = next(c for c in result.checks if c.name == "same_target")
    assert same.passed and same.detail == "no live model configured to compare with"


def build_manifest(source: str | None = None) -> Manifest:
    return Manifest.model_validate(
        {
            "id": "mine-builds",
            "title": "t",
            "class": "quantization",
            "semantics": "lossy",
            "license_reviewed": True,
            "runtime": {"template": "mlx_lm_server", "platforms": ["linux-x86_64"]},
            "target": {"role": "target", "path": LIVE},
            "artifacts": [{"role": "source", "path": source}] if source else [],
            "variants": [{"id": "q8", "build": {"q_bits": 8, "dtype": "float32"}}],
        }
    )


def test_a_build_starts_from_a_source_of_higher_precision() -> None:
    assert failures(build_manifest(), host()) == {}
    quantized = folder(LIVE).model_copy(
        update={"shape": ModelShape(model_type="llama", head_dim=32, quantized={"bits": 4})}
    )
    facts = host().model_copy(update={"target": quantized, "folders": {LIVE: quantized}})
    assert failures(build_manifest(), facts) == {
        "build_source": "its source is quantized already (4-bit affine): a build starts from a "
        "source of higher precision"
    }
    other = folder("/hub/other", tokenizer=TOKENS.model_copy(update={"vocab_sha256": "c" * 64}))
    said = failures(build_manifest("/hub/other"), host(other=other))
    assert said == {
        "build_source": "its source is not the live model in other weights (architecture, "
        "shapes or tokenizer differ)"
    }
    same = folder("/hub/bf16", dtype="bfloat16")
    assert failures(build_manifest("/hub/bf16"), host(same=same)) == {}
