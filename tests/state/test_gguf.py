"""GGUF → MLX folder: names, config, tokenizer, quantized layers, determinism and refusals, on a
tiny llama GGUF written by MLX itself (the real file is tested in tests/state/test_real_model.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mcp_infra.state import gguf as gguf_module
from mcp_infra.state.gguf import (
    GgufError,
    convert_gguf,
    ensure_converted,
    mlx_name,
    mlx_weights,
    record_path,
)

HIDDEN, HEADS, KV_HEADS, INNER, LAYERS = 64, 2, 1, 128, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (as byte-level BPE vocabularies hold them)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = 0
    chars = {}
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def metadata(**over: Any) -> dict[str, Any]:
    tokens = SPECIAL + byte_tokens() + ["Ġt", "he"]
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.attention.head_count": mx.array(HEADS, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(KV_HEADS, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.block_count": mx.array(LAYERS, dtype=mx.uint32),
        "llama.context_length": mx.array(512, dtype=mx.uint32),
        "llama.embedding_length": mx.array(HIDDEN, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(INNER, dtype=mx.uint32),
        "llama.rope.dimension_count": mx.array(HIDDEN // HEADS, dtype=mx.uint32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (len(tokens) - 3), dtype=mx.int32),
        "tokenizer.ggml.merges": ["Ġ t", "h e"],
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.chat_template": CHAT,
    }
    meta.update(over)
    return meta


def tensors(vocab: int) -> dict[str, mx.array]:
    mx.random.seed(7)
    head = HIDDEN // HEADS
    shapes = {
        "token_embd.weight": (vocab, HIDDEN),
        "output_norm.weight": (HIDDEN,),
    }
    for i in range(LAYERS):
        shapes |= {
            f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.attn_k.weight": (KV_HEADS * head, HIDDEN),
            f"blk.{i}.attn_v.weight": (KV_HEADS * head, HIDDEN),
            f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.ffn_gate.weight": (INNER, HIDDEN),
            f"blk.{i}.ffn_up.weight": (INNER, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, INNER),
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.ffn_norm.weight": (HIDDEN,),
        }
    return {k: (mx.random.normal(s) * 0.05).astype(mx.float16) for k, s in shapes.items()}


def write_gguf(path: Path, **over: Any) -> Path:
    meta = metadata(**over)
    mx.save_gguf(str(path), tensors(len(meta["tokenizer.ggml.tokens"])), meta)
    return path


def test_llama_cpp_names_become_mlx_lm_names() -> None:
    assert mlx_name("token_embd.weight") == "model.embed_tokens.weight"
    assert mlx_name("output_norm.weight") == "model.norm.weight"
    assert mlx_name("blk.12.attn_q.scales") == "model.layers.12.self_attn.q_proj.scales"
    assert mlx_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(GgufError, match="not a llama tensor"):
        mlx_name("blk.0.ssm_conv.weight")


def test_quantized_tensors_keep_their_bits_or_dequantize() -> None:
    mx.random.seed(1)
    embed, proj = mx.random.normal((64, 64)), mx.random.normal((32, 64))
    raw: dict[str, Any] = {"output_norm.weight": mx.ones((64,))}
    for name, weight, bits in (("token_embd", embed, 8), ("blk.0.attn_q", proj, 4)):
        packed, scales, biases = mx.quantize(weight, group_size=32, bits=bits)
        raw |= {f"{name}.weight": packed, f"{name}.scales": scales, f"{name}.biases": biases}
    shipped, bits_of = mlx_weights(raw, None)
    assert bits_of == {"model.embed_tokens": 8, "model.layers.0.self_attn.q_proj": 4}
    assert shipped["model.embed_tokens.scales"].shape == (64, 2)
    full, none = mlx_weights(raw, "float32")
    assert none == {} and "model.embed_tokens.scales" not in full
    assert full["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32
    assert mx.abs(full["model.embed_tokens.weight"] - embed).max().item() < 0.05  # 8-bit
    assert mx.abs(full["model.layers.0.self_attn.q_proj.weight"] - proj).max().item() < 0.5


def test_a_converted_folder_loads_in_mlx_lm_and_is_byte_identical_twice(tmp_path: Path) -> None:
    from mlx_lm.utils import load

    gguf = write_gguf(tmp_path / "tiny.gguf")
    one = convert_gguf(gguf, tmp_path / "one", dequantize="bfloat16", extra_files={"LICENSE": b"L"})
    two = convert_gguf(gguf, tmp_path / "two", dequantize="bfloat16", extra_files={"LICENSE": b"L"})
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir())
    assert all((one / n).read_bytes() == (two / n).read_bytes() for n in names)
    config = json.loads((one / "config.json").read_text())
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    assert (config["head_dim"], config["num_key_value_heads"], config["rms_norm_eps"]) == (
        HIDDEN // HEADS,
        KV_HEADS,
        1e-05,
    )
    assert config["torch_dtype"] == "bfloat16" and "quantization" not in config
    model, tokenizer = load(str(one))
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.encode("he 12") == [
        len(SPECIAL) + 256 + 1,  # "he": a merge
        *(len(SPECIAL) + b for b in b" 12"),  # a space, then single digits
    ]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n"
    logits = model(mx.array([[5, 6, 7]]))
    assert logits.shape == (1, 3, len(SPECIAL) + 258)


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"general.architecture": "qwen2"}, "only llama is converted"),
        ({"tokenizer.ggml.model": "llama"}, "only byte-level BPE"),
        ({"tokenizer.ggml.pre": "qwen2"}, "pre-tokenizer 'qwen2'"),
        (
            {"llama.rope.dimension_count": mx.array(16, dtype=mx.uint32)},
            "rotary dimensions 16",
        ),
    ],
)
def test_what_cannot_be_converted_is_refused_and_nothing_written(
    tmp_path: Path, over: dict[str, Any], reason: str
) -> None:
    gguf = write_gguf(tmp_path / "x.gguf", **over)
    with pytest.raises(GgufError, match=reason):
        convert_gguf(gguf, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]


def test_a_converted_folder_is_reused_refused_when_changed_and_redone_for_a_new_converter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "models" / "tiny"
    first = ensure_converted(gguf, out)
    assert record_path(out).is_file() and first.folder == str(out)
    assert ensure_converted(gguf, out) == first  # reused: the same record, nothing redone

    monkeypatch.setattr(gguf_module, "CONVERTER", "gguf-llama-next")
    again = ensure_converted(gguf, out)
    assert again.converter == "gguf-llama-next" and again.digest == first.digest

    (out / "config.json").write_text("{}")
    with pytest.raises(GgufError, match=r"differs from its record: config\.json: "):
        ensure_converted(gguf, out)

    record_path(out).unlink()
    with pytest.raises(GgufError, match="exists without a record"):
        ensure_converted(gguf, out)
