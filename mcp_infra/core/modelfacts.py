"""Model folders as facts (pure): what a folder must hold, its shapes read from config.json, its
tokenizer read from tokenizer.json / tokenizer_config.json, and the questions preflight and the
catalog ask of them: do two tokenizers agree, which KV group sizes divide the head dimension,
does a model fit this machine's memory.

Everything here takes parsed JSON and file names (the shell reads the files), so each rule is
tested directly.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from mcp_infra.contracts import FolderFacts, JSONValue, ModelShape, Quantized, TokenizerFacts
from mcp_infra.core.digest import canonical_json, sha256_bytes

RUNTIME_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.txt",
    "tokenizer.model",
    "*.tiktoken",
)
"""The files a runtime reads from a model folder (config, tokenizer, template, weights): what
its facts are read from."""

WEIGHT_PATTERN = "*.safetensors"
UNLOADABLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
KV_GROUP_SIZES = (128, 64, 32)
"""Group sizes ``Knobs.kv_group_size`` allows, largest (fewest scales) first."""
RUNTIME_KV_GROUP = 64
"""mlx-lm's default ``--kv-group-size`` (its --help and ``QuantizedKVCache``): what a KV-bits
candidate that names no group size quantizes with."""
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
"""Where a config declares its own multi-token-prediction layers (the fields mlx-vlm's MTP
splitters read: DeepSeek/GLM and Qwen3.5 families)."""
MEMORY_FACTOR = 1.2
MEMORY_OVERHEAD_GB = 0.3
"""A server's memory for a model, as this project estimates it before measuring: its weights
with a fifth on top (KV cache, activations) and the interpreter with mlx loaded. Measured peaks
replace it once a cycle has them (core.admission)."""
GIB = 2**30


def is_runtime_file(name: str) -> bool:
    """Is this relative path one a runtime reads (hidden folders never are)?"""
    if any(part.startswith(".") for part in name.split("/")):
        return False
    base = name.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(base, p) for p in RUNTIME_PATTERNS)


def missing_parts(names: Iterable[str]) -> list[str]:
    """What a folder lacks to be a model folder mlx-lm loads, each said plainly (empty: none)."""
    files = {n.rsplit("/", 1)[-1] for n in names}
    missing = []
    if "config.json" not in files:
        missing.append("config.json (the model's configuration)")
    if not any(fnmatch.fnmatchcase(f, WEIGHT_PATTERN) for f in files):
        other = sorted(
            f for f in files if any(fnmatch.fnmatchcase(f, p) for p in UNLOADABLE_WEIGHTS)
        )
        missing.append(
            "weights (*.safetensors)"
            + (f": {', '.join(other[:3])} cannot be loaded by mlx-lm" if other else "")
        )
    if not any(f in files for f in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    return missing


def _int(value: JSONValue) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text_config(config: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    """The language model's part of a config (multimodal configs nest it as text_config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def shape_of(config: Mapping[str, JSONValue]) -> ModelShape:
    """The facts of config.json the catalog and preflight use."""
    text = text_config(config)

    def field(*names: str) -> int | None:
        for name in names:
            for source in (text, config):
                if (value := _int(source.get(name))) is not None:
                    return value
        return None

    hidden = field("hidden_size", "d_model", "n_embd")
    heads = field("num_attention_heads", "n_head")
    head_dim = field("head_dim") or (hidden // heads if hidden and heads else None)
    quant = config.get("quantization") or config.get("quantization_config")
    quantized = None
    if isinstance(quant, dict) and (_int(quant.get("bits")) or quant.get("mode")):
        quantized = Quantized(
            bits=_int(quant.get("bits")),
            group_size=_int(quant.get("group_size")),
            mode=str(quant.get("mode") or "affine"),
        )
    architectures = config.get("architectures")
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    return ModelShape(
        model_type=str(config.get("model_type") or ""),
        architectures=[str(a) for a in architectures] if isinstance(architectures, list) else [],
        hidden_size=hidden,
        intermediate_size=field("intermediate_size", "ffn_dim", "n_inner"),
        num_layers=field("num_hidden_layers", "n_layer", "num_layers"),
        num_attention_heads=heads,
        num_kv_heads=field("num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab_size=field("vocab_size"),
        dtype=str(dtype) if isinstance(dtype, str) else None,
        quantized=quantized,
        mtp_layers=max((field(name) or 0) for name in MTP_FIELDS),
    )


def _vocab_items(model: Mapping[str, JSONValue]) -> dict[str, int]:
    """token → id of a tokenizer.json ``model`` (BPE/WordPiece/WordLevel: a dict; Unigram: a
    list of [token, score] whose position is the id)."""
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return {str(k): v for k, v in vocab.items() if isinstance(v, int)}
    if isinstance(vocab, list):
        return {
            str(item[0]): index
            for index, item in enumerate(vocab)
            if isinstance(item, list) and item
        }
    return {}


def _token_text(value: JSONValue) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def tokenizer_of(
    tokenizer_json: Mapping[str, JSONValue] | None,
    tokenizer_config: Mapping[str, JSONValue] | None,
    config: Mapping[str, JSONValue],
    *,
    raw_source: tuple[str, str] | None = None,
) -> TokenizerFacts | None:
    """A tokenizer's facts from its parsed files. Without tokenizer.json, ``raw_source`` (a
    file name and the sha256 of its bytes, e.g. tokenizer.model) stands for the vocabulary:
    two such tokenizers agree only when the files are the same bytes."""
    vocab: dict[str, int] = {}
    special: dict[str, int] = {}
    if tokenizer_json is not None:
        model = tokenizer_json.get("model")
        vocab = _vocab_items(model) if isinstance(model, dict) else {}
        for added in tokenizer_json.get("added_tokens") or []:
            if isinstance(added, dict) and (i := _int(added.get("id"))) is not None:
                content = str(added.get("content", ""))
                vocab[content] = i
                if added.get("special"):
                    special[content] = i
    settings = tokenizer_config or {}
    for role in ("bos", "eos", "pad", "unk"):
        text = _token_text(settings.get(f"{role}_token"))
        if text is not None and text in vocab:
            special[role] = vocab[text]
        elif (i := _int(config.get(f"{role}_token_id"))) is not None:
            special[role] = i
    if vocab:
        digest = sha256_bytes(canonical_json(sorted(vocab.items())))
        return TokenizerFacts(
            source="tokenizer.json", vocab_size=len(vocab), vocab_sha256=digest, special=special
        )
    if raw_source is not None:
        return TokenizerFacts(
            source=raw_source[0], vocab_size=0, vocab_sha256=raw_source[1], special=special
        )
    return None


def tokenizer_differences(target: TokenizerFacts, other: TokenizerFacts) -> list[str]:
    """Why a drafter's tokenizer disagrees with the target's (empty: they agree). Read from the
    files, never from a name: the same vocabulary (every token at the same id) and the same
    special tokens at the same ids."""
    problems = []
    if target.vocab_sha256 != other.vocab_sha256:
        sizes = (
            f" ({other.vocab_size} tokens against the target's {target.vocab_size})"
            if other.vocab_size != target.vocab_size
            else " (same size, other tokens or ids)"
            if target.vocab_size
            else f" ({other.source} differs from the target's {target.source})"
        )
        problems.append("another vocabulary" + sizes)
    differ = sorted(
        name
        for name in set(target.special) | set(other.special)
        if target.special.get(name) != other.special.get(name)
    )
    if differ:
        shown = ", ".join(
            f"{name} {other.special.get(name, '-')} vs {target.special.get(name, '-')}"
            for name in differ[:4]
        )
        problems.append(f"special tokens at other ids ({shown})")
    return problems


def kv_groups(head_dim: int | None) -> list[int]:
    """KV group sizes that divide the head dimension, largest first (empty: none does)."""
    if not head_dim:
        return []
    return [g for g in KV_GROUP_SIZES if head_dim % g == 0]


def memory_need_gb(weights_bytes: int) -> float:
    """One server's estimated memory for weights of this size (``MEMORY_FACTOR``)."""
    return round(weights_bytes / GIB * MEMORY_FACTOR + MEMORY_OVERHEAD_GB, 3)


def fit_problem(weights_bytes: int, memory_gb: float, fraction: float) -> str | None:
    """Why a model does not fit this machine (None: it fits): its estimated need against the
    share of memory the policy lets servers use."""
    need = memory_need_gb(weights_bytes)
    allowed = memory_gb * fraction
    if need <= allowed:
        return None
    return (
        f"its weights are {weights_bytes / GIB:.2f} GiB, so one server needs about {need:.1f} GiB; "
        f"this machine has {memory_gb:.1f} GiB and the policy lets servers use "
        f"{fraction:.0%} of it ({allowed:.1f} GiB)"
    )


def same_model(target: FolderFacts, other: FolderFacts) -> bool:
    """Is ``other`` the target's model in other weights: its architecture, shapes and
    tokenizer (read from the files)?"""
    a, b = target.shape, other.shape
    if a is None or b is None or target.tokenizer is None or other.tokenizer is None:
        return False
    fields = ("model_type", "hidden_size", "intermediate_size", "num_layers", "vocab_size")
    same = all(getattr(a, f) == getattr(b, f) for f in fields)
    return same and not tokenizer_differences(target.tokenizer, other.tokenizer)
