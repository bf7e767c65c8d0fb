"""A llama-architecture GGUF file turned into an MLX model folder that ``mlx_lm`` loads.

MLX reads GGUF natively (``mx.load(path, return_metadata=True)``): block-quantized tensors
(Q4_0, Q4_1, Q8_0: blocks of 32) arrive as MLX affine triples (packed ``weight``, ``scales``,
``biases``), float tensors as they are. This module renames llama.cpp's tensors to mlx-lm's llama
layout, writes ``config.json`` from the file's ``llama.*`` metadata, and builds ``tokenizer.json``
with the ``tokenizers`` library from the file's own vocabulary, merges and token types, with its
chat template in ``tokenizer_config.json``. Two forms:

* ``dequantize=None``: the weights as shipped (each tensor keeps its bits; the config names the
  most common width and lists the others per layer);
* ``dequantize="bfloat16"`` (or another float dtype): every tensor dequantized in float32 and
  stored in that dtype, a source that ``mlx_lm.convert`` can quantize again.

llama.cpp stores Q and K rows permuted for interleaved rotary embeddings: the config says
``rope_traditional: true`` rather than undoing it (the same logits). The output is written into a
temporary sibling and renamed into place; the same file gives byte-identical folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from mcp_infra.contracts import ComputeDtype, ConvertedModel, JSONValue
from mcp_infra.errors import McpInfraError
from mcp_infra.state.folders import folder_inventory, inventory_changes
from mcp_infra.state.store import file_sha256, inventory_digest, read_optional, utcnow, write_model

__all__ = [
    "CONVERTER",
    "GGUF_GROUP_SIZE",
    "GgufError",
    "convert_gguf",
    "ensure_converted",
    "llama_config",
    "mlx_name",
    "mlx_weights",
    "tokenizer_files",
]

CONVERTER = "gguf-llama-1"  # bump when the bytes this module writes change: caches convert again
GGUF_GROUP_SIZE = 32  # every GGUF block type MLX reads quantizes blocks of 32 weights

_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)$")

# llama.cpp's pre-tokenizers that mlx-lm can reproduce with the `tokenizers` library: the GPT-2
# split, with single digits first for the code-model family (llama-vocab.cpp's regex lists).
_GPT2_SPLIT = ("gpt2", "default")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell")
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values for special/added tokens


class GgufError(McpInfraError, ValueError):
    """A GGUF file this converter cannot turn into an MLX folder; the message says why."""


def mlx_name(gguf_name: str) -> str:
    """``blk.3.attn_q.scales`` → ``model.layers.3.self_attn.q_proj.scales``."""
    stem, _, part = gguf_name.rpartition(".")
    if part not in {"weight", "scales", "biases"}:
        raise GgufError(f"tensor {gguf_name}: unknown part {part!r}")
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{part}"
    match = _BLOCK.match(stem)
    if not match or match.group(2) not in _BLOCK_NAMES:
        raise GgufError(f"tensor {gguf_name}: not a llama tensor this converter knows")
    return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}.{part}"


def _scalar(meta: dict[str, Any], key: str) -> Any:  # mx.array scalars or plain values
    if key not in meta:
        raise GgufError(f"metadata {key} is missing")
    value = meta[key]
    return value.item() if hasattr(value, "item") else value


def _float32_text(value: float) -> float:
    """A float32 read from the file as its shortest decimal (9.99999974e-06 → 1e-05)."""
    import numpy as np

    return float(str(np.float32(value)))


def llama_config(meta: dict[str, Any], tied: bool, torch_dtype: str | None) -> dict[str, JSONValue]:
    """mlx-lm's llama ``config.json`` from the file's ``llama.*`` metadata."""
    if _scalar(meta, "general.architecture") != "llama":
        raise GgufError(
            f"architecture {_scalar(meta, 'general.architecture')!r}: only llama is converted"
        )
    heads = int(_scalar(meta, "llama.attention.head_count"))
    hidden = int(_scalar(meta, "llama.embedding_length"))
    rotary = int(meta.get("llama.rope.dimension_count", hidden // heads))
    if rotary != hidden // heads:  # mlx-lm's llama rotates whole heads
        raise GgufError(f"rotary dimensions {rotary} of a head of {hidden // heads}: not supported")
    config: dict[str, JSONValue] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_scalar(meta, "llama.feed_forward_length")),
        "num_hidden_layers": int(_scalar(meta, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_scalar(meta, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "rms_norm_eps": _float32_text(_scalar(meta, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_text(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_scalar(meta, "llama.context_length")),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rope_traditional": True,  # llama.cpp's Q/K row order: interleaved rotary pairs
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "bos_token_id": int(_scalar(meta, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_scalar(meta, "tokenizer.ggml.eos_token_id")),
    }
    if torch_dtype is not None:
        config["torch_dtype"] = torch_dtype
    return config


def tokenizer_files(meta: dict[str, Any]) -> dict[str, dict[str, JSONValue]]:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` from the
    file's byte-level BPE (``tokenizer.ggml.model == "gpt2"``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if _scalar(meta, "tokenizer.ggml.model") != "gpt2":
        raise GgufError(
            f"tokenizer {_scalar(meta, 'tokenizer.ggml.model')!r}: only byte-level BPE (gpt2)"
        )
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in _GPT2_SPLIT + _DIGITS_THEN_GPT2:
        raise GgufError(f"pre-tokenizer {pre!r}: not one this converter reproduces")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta["tokenizer.ggml.token_type"].tolist()]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tokenizer = Tokenizer(bpe)
    split: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    ]
    if pre in _DIGITS_THEN_GPT2:
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(split)
    tokenizer.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def name(key: str) -> str | None:
        return tokens[int(_scalar(meta, key))] if key in meta else None

    names = {
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
    }
    config: dict[str, JSONValue] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_scalar(meta, "llama.context_length")),
        "additional_special_tokens": [t for t in special if t not in names.values()],
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = str(meta["tokenizer.chat_template"])
    return {
        "tokenizer.json": json.loads(tokenizer.to_str()),
        "tokenizer_config.json": config,
        "special_tokens_map.json": {k: v for k, v in names.items() if v is not None},
    }


def _bits(weight: Any, scales: Any) -> int:
    """A quantized tensor's width from its shapes: packed columns × 32 / input columns."""
    inputs = scales.shape[-1] * GGUF_GROUP_SIZE
    bits = weight.shape[-1] * 32 // inputs
    if bits * inputs != weight.shape[-1] * 32:
        raise GgufError(f"a quantized tensor of shape {weight.shape} is not in blocks of 32")
    return int(bits)


def mlx_weights(
    raw: dict[str, Any], dequantize: ComputeDtype | None
) -> tuple[dict[str, Any], dict[str, int]]:
    """Renamed tensors (dequantized into ``dequantize`` when given) and each quantized layer's
    bits by its mlx-lm module path."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    bits: dict[str, int] = {}
    for name in sorted(raw):
        if name.endswith((".scales", ".biases")):
            continue
        stem = name.rpartition(".")[0]
        target = mlx_name(name)
        if f"{stem}.scales" not in raw:
            out[target] = raw[name] if dequantize is None else raw[name].astype(_dtype(dequantize))
            continue
        scales, biases = raw[f"{stem}.scales"], raw.get(f"{stem}.biases")
        width = _bits(raw[name], scales)
        module = target.rpartition(".")[0]
        if dequantize is None:
            bits[module] = width
            out[target], out[f"{module}.scales"] = raw[name], scales
            if biases is not None:
                out[f"{module}.biases"] = biases
            continue
        full = mx.dequantize(
            raw[name],
            scales.astype(mx.float32),
            None if biases is None else biases.astype(mx.float32),
            group_size=GGUF_GROUP_SIZE,
            bits=width,
        )
        out[target] = full.astype(_dtype(dequantize))
    return out, bits


def _dtype(name: ComputeDtype) -> Any:
    import mlx.core as mx

    return getattr(mx, name)


def _quantization(bits: dict[str, int]) -> dict[str, JSONValue] | None:
    """The config's ``quantization``: the most common width, and the layers that differ."""
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    entry: dict[str, JSONValue] = {
        "group_size": GGUF_GROUP_SIZE,
        "bits": common,
        "mode": "affine",
    }
    for module in sorted(bits):
        if bits[module] != common:
            entry[module] = {"group_size": GGUF_GROUP_SIZE, "bits": bits[module], "mode": "affine"}
    return entry


def _dump(path: Path, data: JSONValue) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def convert_gguf(
    gguf: Path,
    out: Path,
    *,
    dequantize: ComputeDtype | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write the MLX folder ``out`` from ``gguf`` (see the module notes); ``extra_files`` (a
    licence, say) are written beside the model. ``out`` must not exist: it appears whole or not
    at all."""
    import mlx.core as mx

    if out.exists():
        raise GgufError(f"{out} exists: convert into a new folder")
    try:
        raw, meta = mx.load(str(gguf), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as exc:
        raise GgufError(f"{gguf}: MLX cannot read it as GGUF: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(meta, dict):
        raise GgufError(f"{gguf}: not a GGUF file of named tensors with metadata")
    weights, bits = mlx_weights(raw, dequantize)
    tied = "lm_head.weight" not in weights
    config = llama_config(meta, tied, dequantize)
    quantization = _quantization(bits)
    if quantization is not None:
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    tokenizer = tokenizer_files(meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        mx.save_safetensors(
            str(staging / "model.safetensors"),
            {k: weights[k] for k in sorted(weights)},
            metadata={"format": "mlx"},
        )
        _dump(staging / "config.json", config)
        for name, data in tokenizer.items():
            _dump(staging / name, data)
        _dump(
            staging / "generation_config.json",
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        )
        for name, payload in sorted((extra_files or {}).items()):
            (staging / name).write_bytes(payload)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def record_path(folder: Path) -> Path:
    """Where a converted folder's record lives: beside it, ``<folder>.json``."""
    return folder.with_name(folder.name + ".json")


def ensure_converted(
    gguf: Path,
    out: Path,
    *,
    dequantize: ComputeDtype | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> ConvertedModel:
    """The folder ``out`` converted from ``gguf``, made once: reused while its record names
    this file's sha256, form and converter and its files match the record; refused (naming what
    changed) when its files differ; converted again when the record is of another converter or
    source. The record is written before the folder is renamed into place."""
    sha = file_sha256(gguf)
    record = read_optional(record_path(out), ConvertedModel)
    if record is not None and out.is_dir():
        if (record.source_sha256, record.dequantize, record.converter) == (
            sha,
            dequantize,
            CONVERTER,
        ):
            changes = inventory_changes(record.files, folder_inventory(out))
            if changes:
                raise GgufError(
                    f"{out} differs from its record: {'; '.join(changes[:5])}; remove it and "
                    f"{record_path(out).name} to convert again"
                )
            return record
    elif out.exists():
        raise GgufError(f"{out} exists without a record of its conversion: remove it")
    staging = out.with_name(f".{out.name}.{os.getpid()}.new")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        convert_gguf(gguf, staging, dequantize=dequantize, extra_files=extra_files)
        files = folder_inventory(staging)
        record = ConvertedModel(
            source_file=str(gguf),
            source_sha256=sha,
            dequantize=dequantize,
            converter=CONVERTER,
            folder=str(out),
            files=files,
            digest=inventory_digest(files),
            created_at=utcnow(),
        )
        write_model(record_path(out), record)
        if out.exists():  # an older converter's folder, recorded as such: replaced whole
            shutil.rmtree(out)
        os.replace(staging, out)
        return record
    finally:
        shutil.rmtree(staging, ignore_errors=True)
