"""The catalog generated for a model (pure): from facts and the runtimes' recorded ``--help``
texts to manifests, and a note for whatever is left out."""

from __future__ import annotations

from mcp_infra.contracts import (
    CatalogFacts,
    FolderFacts,
    ModelShape,
    Recipe,
    RuntimeHelp,
    TokenizerFacts,
)
from mcp_infra.core import catalog, modelfacts
from mcp_infra.core.templates import TEMPLATES, help_choices, help_flags, unknown_flags
from tests.helpers.paths import REPO

HELP = REPO / "tests" / "data" / "runtime-help"
TOKENIZER = TokenizerFacts(source="tokenizer.json", vocab_size=700, vocab_sha256="a" * 64)


def recorded(name: str, file: str, version: str) -> RuntimeHelp:
    text = (HELP / file).read_text()
    return RuntimeHelp(
        name=name, version=version, flags=help_flags(text), choices=help_choices(text)
    )


LM = recorded("mlx_lm_server", "mlx-lm-0.32.2-server.txt", "0.32.2")
VLM = recorded("mlx_vlm_server", "mlx-vlm-0.7.10-server.txt", "0.7.10")
CONVERT = recorded("mlx_lm.convert", "mlx-lm-0.32.2-convert.txt", "0.32.2")


def folder(path: str, weights: int, head_dim: int = 32, **shape: object) -> FolderFacts:
    return FolderFacts(
        path=path,
        origin=f"folder {path}",
        shape=ModelShape.model_validate(
            {
                "model_type": "llama",
                "head_dim": head_dim,
                "num_layers": 4,
                "num_kv_heads": 1,
                **shape,
            }
        ),
        tokenizer=TOKENIZER,
        weights_bytes=weights,
        files_bytes=weights,
        loaders=["mlx_lm_server"],
        digest="b" * 64,
    )


TARGET = folder("/models/mine", 1_000_000).model_copy(update={"digest": "c" * 64})


def facts(**update: object) -> CatalogFacts:
    base = CatalogFacts(
        target=TARGET,
        runtimes=[LM, VLM, CONVERT],
        others=[folder("/hub/small", 200_000), folder("/hub/big", 900_000)],
        memory_gb=24,
        platform="linux-x86_64",
    )
    return base.model_copy(update=update)


def test_a_model_gets_settings_kv_bits_and_its_smaller_drafters() -> None:
    manifests, notes = catalog.generate(facts())
    ids = {m.id for m in manifests}
    assert ids == {"own-settings", "own-kv", "own-builds", "own-draft-small"}
    counts = catalog.candidate_count(manifests)
    assert counts == {
        "server_tuning": 8,
        "kv_cache": 2,
        "quantization": 7,
        "acceleration_plugin": 2,
    }
    assert all(m.target.configured for m in manifests)
    subjects = [n.subject for n in notes]
    assert subjects == ["own MTP head"]  # the big model is no drafter and needs no note


def test_only_flags_the_runtime_lists_are_offered() -> None:
    manifests, _ = catalog.generate(facts())
    settings = next(m for m in manifests if m.id == "own-settings")
    for variant in settings.variants:
        assert unknown_flags("mlx_lm_server", variant.knobs, LM.flags) == []
    fewer = LM.model_copy(
        update={
            "flags": [
                f for f in LM.flags if f not in {"--decode-concurrency", "--prompt-cache-bytes"}
            ]
        }
    )
    made, _ = catalog.settings_manifest(facts(runtimes=[fewer]))
    assert made is not None
    gone = {v.id for v in settings.variants} - {v.id for v in made.variants}
    assert gone == {"decode-c4", "decode-c16", "pcache-4mib"}
    older = recorded("mlx_lm_server", "mlx-lm-0.31.3-server.txt", "0.31.3")
    no_kv, notes = catalog.kv_manifest(facts(runtimes=[older]))
    assert no_kv is None and notes[0].reason == "the runtime lists no --kv-bits"


def test_the_prompt_cache_bytes_are_the_kv_cache_of_its_tokens() -> None:
    manifests, _ = catalog.generate(facts())
    settings = next(m for m in manifests if m.id == "own-settings")
    bound = next(v for v in settings.variants if v.knobs.prompt_cache_bytes)
    # 2 (keys, values) x 4 layers x 1 KV head x 32 dims x 2 bytes x 8192 tokens = 4 MiB
    assert bound.knobs.prompt_cache_bytes == 4 << 20 and bound.id == "pcache-4mib"


def test_kv_bits_use_a_group_that_divides_the_head_dimension() -> None:
    made, _ = catalog.kv_manifest(facts())
    assert made is not None and made.semantics.value == "lossy"
    assert {(v.knobs.kv_bits, v.knobs.kv_group_size) for v in made.variants} == {(8, 32), (4, 32)}
    wide, _ = catalog.kv_manifest(facts(target=folder("/m", 10, head_dim=128)))
    assert wide is not None and {v.knobs.kv_group_size for v in wide.variants} == {128}
    none, notes = catalog.kv_manifest(facts(target=folder("/m", 10, head_dim=24)))
    assert none is None
    assert notes[0].reason == "no KV group size (128, 64, 32) divides the model's head dimension 24"


def test_drafters_run_with_the_prompt_cache_off_and_a_few_lengths() -> None:
    made, _ = catalog.drafter_manifests(facts())
    (drafter,) = made
    assert drafter.artifacts[0].path == "/hub/small" and drafter.artifacts[0].digest == "b" * 64
    assert [(v.knobs.num_draft_tokens, v.knobs.prompt_cache_size) for v in drafter.variants] == [
        (2, 0),
        (4, 0),
    ]
    many = [folder(f"/hub/d{i}", 100_000 + i) for i in range(6)]
    made, notes = catalog.drafter_manifests(facts(others=many))
    assert len(made) == catalog.MAX_DRAFTERS
    assert [n.reason for n in notes] == ["more than 4 drafters found"] * 2
    made, notes = catalog.drafter_manifests(facts(others=[]))
    assert made == [] and "no model folder smaller" in notes[0].reason


def test_the_same_name_twice_gets_two_ids() -> None:
    twins = [folder("/a/small", 100_000), folder("/b/small", 100_001)]
    twins[1] = twins[1].model_copy(update={"digest": "d" * 64})
    made, _ = catalog.drafter_manifests(facts(others=twins))
    assert [m.id for m in made] == ["own-draft-small", "own-draft-small-dddddd"]


def test_a_model_with_an_mtp_head_gets_its_own_drafter_through_mlx_vlm() -> None:
    config = {  # a Qwen3.5-style config declaring its own MTP layer
        "model_type": "qwen3_5",
        "text_config": {"hidden_size": 128, "num_attention_heads": 4, "mtp_num_hidden_layers": 1},
    }
    target = TARGET.model_copy(update={"path": "/models/mtp", "shape": modelfacts.shape_of(config)})
    made, notes = catalog.mtp_manifest(facts(target=target))
    assert made is not None and notes == []
    assert made.runtime.template == "mlx_vlm_server" and made.runtime.platforms == ["darwin-arm64"]
    assert made.artifacts[0].configured and made.artifacts[0].role == "draft"
    variant = made.variants[1]
    recipe = Recipe(
        candidate_id=f"{made.id}:{variant.id}",
        template="mlx_vlm_server",
        model_path="/models/mtp",
        draft_path="/models/mtp",
        knobs=variant.knobs,
    )
    argv = TEMPLATES["mlx_vlm_server"](recipe, "127.0.0.1", 8100, "python")
    assert argv[argv.index("--draft-model") + 1] == "/models/mtp"
    assert argv[argv.index("--draft-kind") + 1] == "mtp"
    assert argv[argv.index("--draft-block-size") + 1] == "2"
    assert unknown_flags("mlx_vlm_server", variant.knobs, VLM.flags) == []
    missing, said = catalog.mtp_manifest(facts(target=target, runtimes=[LM]))
    assert missing is None and said[0].reason == "mlx-vlm is not installed"


def test_builds_of_an_unquantized_target_in_the_fastest_dtype() -> None:
    made, notes = catalog.builds_manifest(
        facts(
            target=folder(
                "/models/mine", 1_000_000, hidden_size=64, intermediate_size=128, dtype="float32"
            ),
            compute_dtype="float32",
        )
    )
    assert made is not None and notes == []
    assert made.semantics.value == "lossy" and made.candidate_class.value == "quantization"
    assert made.artifacts == []  # built from the target itself
    assert [v.id for v in made.variants] == [
        "q8-g64-affine-f32",
        "q6-g64-affine-f32",
        "q4-g64-affine-f32",
        "mixed_3_6-g64-affine-f32",
        "q4-g32-mxfp4-f32",
        "q4-g16-nvfp4-f32",
        "q8-g32-mxfp8-f32",
    ]
    assert made.resources.disk_gb > 0


def test_a_converter_without_the_mx_formats_offers_affine_only() -> None:
    old = CONVERT.model_copy(update={"choices": {"--dtype": ["float32", "bfloat16"]}})
    made, notes = catalog.builds_manifest(
        facts(target=folder("/m", 10, hidden_size=64, intermediate_size=128), runtimes=[LM, old])
    )
    assert made is not None and {v.build.q_mode for v in made.variants if v.build} == {"affine"}
    assert [n.reason for n in notes] == [
        f"{m}: mlx_lm.convert offers no --q-mode {m}" for m in ("mxfp4", "nvfp4", "mxfp8")
    ]


def test_a_quantized_target_is_built_only_from_a_source_of_higher_precision() -> None:
    four_bit = {"bits": 4, "group_size": 64}
    target = folder(
        "/models/q4", 300_000, hidden_size=64, intermediate_size=128, quantized=four_bit
    )
    made, notes = catalog.builds_manifest(facts(target=target, others=[]))
    assert made is None
    assert notes[0].reason.startswith("the model is quantized already (4-bit affine)")
    source = folder("/hub/bf16", 2_000_000, hidden_size=64, intermediate_size=128, dtype="bfloat16")
    other = folder("/hub/other", 2_000_000, hidden_size=96, intermediate_size=128)
    made, _ = catalog.builds_manifest(facts(target=target, others=[other, source]))
    assert made is not None
    assert [(a.role, a.path) for a in made.artifacts] == [("source", "/hub/bf16")]
