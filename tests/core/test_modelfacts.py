"""Model folders as facts: what a folder must hold, shapes from config.json, tokenizers compared
from their files (never by name), KV group sizes and the memory rule."""

from __future__ import annotations

from mcp_infra.contracts import TokenizerFacts
from mcp_infra.core import modelfacts as mf

COMPLETE = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_a_complete_folder_lacks_nothing() -> None:
    assert mf.missing_parts(COMPLETE) == []
    assert (
        mf.missing_parts(["config.json", "model-00001-of-00002.safetensors", "tokenizer.model"])
        == []
    )


def test_each_missing_part_is_named() -> None:
    assert mf.missing_parts(COMPLETE[1:]) == ["config.json (the model's configuration)"]
    no_weights = mf.missing_parts(["config.json", "tokenizer.json"])
    assert no_weights == ["weights (*.safetensors)"]
    assert mf.missing_parts(["config.json", "tokenizer.json", "pytorch_model.bin"]) == [
        "weights (*.safetensors): pytorch_model.bin cannot be loaded by mlx-lm"
    ]
    no_tokenizer = mf.missing_parts(["config.json", "model.safetensors"])
    assert no_tokenizer == ["a tokenizer (tokenizer.json, tokenizer.model or vocab.json)"]
    assert len(mf.missing_parts([])) == 3


def test_runtime_files_are_config_tokenizer_template_and_weights() -> None:
    assert mf.is_runtime_file("model.safetensors")
    assert mf.is_runtime_file("chat_template.jinja")
    assert mf.is_runtime_file("sub/config.json")
    assert not mf.is_runtime_file("README.md")
    assert not mf.is_runtime_file(".cache/huggingface/x.json")
    assert not mf.is_runtime_file("modeling_custom.py")


def test_shape_reads_head_dim_or_derives_it() -> None:
    stated = mf.shape_of(
        {
            "model_type": "llama",
            "hidden_size": 64,
            "num_attention_heads": 2,
            "head_dim": 32,
            "num_hidden_layers": 4,
        }
    )
    assert (stated.head_dim, stated.num_kv_heads, stated.num_layers) == (32, 2, 4)
    derived = mf.shape_of(
        {
            "model_type": "qwen2",
            "hidden_size": 896,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
        }
    )
    assert (derived.head_dim, derived.num_kv_heads) == (64, 2)


def test_shape_of_a_nested_text_config_quantization_and_mtp() -> None:
    shape = mf.shape_of(
        {
            "model_type": "qwen3_5",
            "text_config": {
                "hidden_size": 128,
                "num_attention_heads": 4,
                "mtp_num_hidden_layers": 1,
                "torch_dtype": "bfloat16",
            },
            "quantization": {"bits": 4, "group_size": 64},
        }
    )
    assert shape.head_dim == 32
    assert shape.mtp_layers == 1
    assert shape.dtype == "bfloat16"
    assert shape.quantized is not None and (shape.quantized.bits, shape.quantized.mode) == (
        4,
        "affine",
    )
    assert mf.shape_of({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}).mtp_layers == 1
    assert mf.shape_of({"model_type": "llama"}).mtp_layers == 0


def _tokenizer(vocab: dict[str, int], added: list[tuple[str, int]], eos: str) -> TokenizerFacts:
    facts = mf.tokenizer_of(
        {
            "model": {"type": "BPE", "vocab": vocab},
            "added_tokens": [{"id": i, "content": t, "special": True} for t, i in added],
        },
        {"eos_token": eos},
        {},
    )
    assert facts is not None
    return facts


BASE = {"a": 3, "b": 4, "c": 5}


def test_tokenizers_agree_only_on_the_same_tokens_at_the_same_ids() -> None:
    one = _tokenizer(BASE, [("<s>", 0), ("</s>", 1)], "</s>")
    same = _tokenizer(dict(BASE), [("<s>", 0), ("</s>", 1)], "</s>")
    assert mf.tokenizer_differences(one, same) == []
    swapped = _tokenizer({"a": 4, "b": 3, "c": 5}, [("<s>", 0), ("</s>", 1)], "</s>")
    assert mf.tokenizer_differences(one, swapped) == [
        "another vocabulary (same size, other tokens or ids)"
    ]
    bigger = _tokenizer({**BASE, "d": 6}, [("<s>", 0), ("</s>", 1)], "</s>")
    assert mf.tokenizer_differences(one, bigger)[0] == (
        "another vocabulary (6 tokens against the target's 5)"
    )


def test_special_token_ids_are_compared_not_names() -> None:
    one = _tokenizer(BASE, [("<s>", 0), ("</s>", 1)], "</s>")
    other_eos = _tokenizer(BASE, [("<s>", 0), ("</s>", 1)], "<s>")
    problems = mf.tokenizer_differences(one, other_eos)
    assert problems == ["special tokens at other ids (eos 0 vs 1)"]


def test_a_sentencepiece_file_stands_for_its_vocabulary() -> None:
    a = mf.tokenizer_of(None, None, {"eos_token_id": 2}, raw_source=("tokenizer.model", "a" * 64))
    b = mf.tokenizer_of(None, None, {"eos_token_id": 2}, raw_source=("tokenizer.model", "b" * 64))
    assert a is not None and b is not None
    assert a.special == {"eos": 2}
    assert mf.tokenizer_differences(a, b) == [
        "another vocabulary (tokenizer.model differs from the target's tokenizer.model)"
    ]
    assert mf.tokenizer_of(None, None, {}) is None


def test_kv_groups_divide_the_head_dimension() -> None:
    assert mf.kv_groups(128) == [128, 64, 32]
    assert mf.kv_groups(32) == [32]
    assert mf.kv_groups(24) == []
    assert mf.kv_groups(None) == []


def test_a_model_fits_the_share_of_memory_the_policy_allows() -> None:
    gib = 2**30
    assert mf.memory_need_gb(10 * gib) == 12.3
    assert mf.fit_problem(10 * gib, 24, 0.8) is None
    problem = mf.fit_problem(20 * gib, 24, 0.8)
    assert problem is not None and "needs about 24.3 GiB" in problem and "19.2 GiB" in problem
