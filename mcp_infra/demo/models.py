"""Offline, deterministic builder of a tiny target model and its draft model.

Why: the demo needs a real ``mlx_lm.server`` to tune, on machines with no Hugging Face hub and no
GPU. We therefore generate a small Qwen3-architecture pair from a seed, in seconds, byte for byte
the same on every run:

* ``draft``: a few random decoder layers over a shared tokenizer.
* ``target``: the draft's weights plus extra decoder layers whose output projections (``o_proj``,
  ``down_proj``) are scaled by a small factor. The extra layers only nudge the residual stream, so
  the draft predicts the target well (speculative decoding gives a real, measurable speedup) but
  not perfectly (acceptance is below 100%, so the losslessness check is not vacuous).

The tokenizer is a small BPE over printable ASCII with no byte fallback, so any token sequence
decodes to valid text (no U+FFFD). The special tokens keep ChatML working, and their ``lm_head``
rows (and ``<unk>``'s) are zero, so the random model in practice never emits them: every request
runs to exactly ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Bump whenever the bytes written by build_demo_models change (spec, tokenizer, file layout).
DEMO_SPEC_VERSION = "demo-3"

MARKER_NAME = "demo_spec.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DemoSpec:
    """Everything that determines the built bytes (besides the code itself)."""

    seed: int = 20240607
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    # 64 = mlx_lm's default --kv-group-size: --kv-bits 4/8 needs head_dim divisible by it.
    head_dim: int = 64
    draft_layers: int = 2
    target_extra_layers: int = 30
    # s = 0 makes target == draft (every draft accepted). 0.25: about 60% of drafted tokens are
    # accepted at K=2 (45% at K=4), like a real draft, and still a clear speedup; s = 1 loses.
    extra_layer_scale: float = 0.25
    lm_head_std: float = 1.0
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6


DEFAULT_SPEC = DemoSpec()

_COMMON_WORDS_TEXT = (
    "the a an of to and in is it you that for on with as be this was are at by not or from "
    "have user assistant system hello world model fast slow speed token cache draft target "
    "server request answer question data time make good new first last long great little "
    "own other old right big high different small large next early young important few "
    "public bad same able"
)
_COMMON_WORDS = _COMMON_WORDS_TEXT.split()
_SYLLABLES_TEXT = (
    "ka to ri en an the ing er on st al mo lu ve ex qu ion ar ol ne sa di pe ur ta li co "
    "ma ra so mi de"
)
_SYLLABLES = _SYLLABLES_TEXT.split()


def _training_lines(seed: int) -> list[str]:
    """Seeded pseudo-English text: gives the BPE word-like merges, so output looks like text."""
    rng = random.Random(seed)
    pseudo = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    words = pseudo + _COMMON_WORDS * 4
    lines = []
    for _ in range(2000):
        n = rng.randint(3, 12)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            sentence = sentence.capitalize()
        lines.append(sentence + rng.choice([".", ",", "!", "?", "", ":", ";"]))
        if rng.random() < 0.05:
            lines.append(str(rng.randint(0, 99999)))
    return lines


def _build_tokenizer(spec: DemoSpec) -> Any:
    """Character-level BPE without byte fallback: every token decodes to printable ASCII."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex(r" ?[A-Za-z]+| ?[0-9]+| ?[^A-Za-z0-9\s]+|\s"), behavior="isolated"
    )
    # Fuse joins tokens without separators; no Replace/ByteFallback, so no U+FFFD is possible.
    tok.decoder = decoders.Fuse()
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(_training_lines(spec.seed), trainer=trainer)
    if tok.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, not {spec.vocab_size}")
    return tok


def _layer_weights(
    rng: np.random.Generator, spec: DemoSpec, index: int, out_scale: float
) -> dict[str, np.ndarray]:
    """One Qwen3 decoder layer, uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) like mlx's nn.Linear."""
    d, f, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    nq, nkv = spec.num_attention_heads, spec.num_key_value_heads

    def lin(out_dim: int, in_dim: int, scale: float = 1.0) -> np.ndarray:
        bound = 1.0 / np.sqrt(in_dim)
        w = rng.uniform(-bound, bound, size=(out_dim, in_dim)).astype(np.float32)
        return (w * np.float32(scale)).astype(np.float32)

    p = f"model.layers.{index}."
    return {
        p + "self_attn.q_proj.weight": lin(nq * hd, d),
        p + "self_attn.k_proj.weight": lin(nkv * hd, d),
        p + "self_attn.v_proj.weight": lin(nkv * hd, d),
        p + "self_attn.o_proj.weight": lin(d, nq * hd, out_scale),
        p + "self_attn.q_norm.weight": np.ones(hd, dtype=np.float32),
        p + "self_attn.k_norm.weight": np.ones(hd, dtype=np.float32),
        p + "mlp.gate_proj.weight": lin(f, d),
        p + "mlp.up_proj.weight": lin(f, d),
        p + "mlp.down_proj.weight": lin(d, f, out_scale),
        p + "input_layernorm.weight": np.ones(d, dtype=np.float32),
        p + "post_attention_layernorm.weight": np.ones(d, dtype=np.float32),
    }


def _build_weights(
    spec: DemoSpec, banned_ids: list[int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return (draft, target) weights; the target starts with exactly the draft's tensors."""
    rng = np.random.default_rng(spec.seed)
    v, d = spec.vocab_size, spec.hidden_size
    shared: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((v, d), dtype=np.float32),
        "model.norm.weight": np.ones(d, dtype=np.float32),
    }
    lm_head = (rng.standard_normal((v, d), dtype=np.float32) * np.float32(spec.lm_head_std)).astype(
        np.float32
    )
    # A zero row gives logit 0, below the max of ~500 random logits in practice: never emitted.
    lm_head[banned_ids] = 0.0
    shared["lm_head.weight"] = lm_head
    draft = dict(shared)
    for i in range(spec.draft_layers):
        draft.update(_layer_weights(rng, spec, i, 1.0))
    target = dict(draft)
    for j in range(spec.target_extra_layers):
        target.update(_layer_weights(rng, spec, spec.draft_layers + j, spec.extra_layer_scale))
    return draft, target


def _config(spec: DemoSpec, num_layers: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "num_hidden_layers": num_layers,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "bos_token_id": None,
    }


def _dump_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_model(
    folder: Path,
    spec: DemoSpec,
    role: str,
    weights: dict[str, np.ndarray],
    num_layers: int,
    tokenizer_json: str,
    ids: dict[str, int],
) -> None:
    import mlx.core as mx

    folder.mkdir(parents=True)
    eos_id, pad_id = ids[EOS_TOKEN], ids[PAD_TOKEN]
    arrays = {k: mx.array(weights[k]) for k in sorted(weights)}
    mx.save_safetensors(str(folder / "model.safetensors"), arrays, metadata={"format": "mlx"})
    _dump_json(folder / "config.json", _config(spec, num_layers, eos_id, pad_id))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    _dump_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
            "unk_token": UNK_TOKEN,
            "bos_token": None,
            "chat_template": CHATML_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.max_position_embeddings,
            "added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        },
    )
    _dump_json(
        folder / "special_tokens_map.json",
        {
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
            "unk_token": UNK_TOKEN,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        },
    )
    _dump_json(
        folder / "generation_config.json",
        {"eos_token_id": eos_id, "pad_token_id": pad_id, "do_sample": False},
    )
    # Written last: its presence with the right version is what makes a folder reusable.
    _dump_json(folder / MARKER_NAME, {"version": DEMO_SPEC_VERSION, "role": role, **asdict(spec)})


def _marker_ok(folder: Path, spec: DemoSpec) -> bool:
    """True when folder was fully built by this DEMO_SPEC_VERSION with this spec."""
    try:
        data = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("version") != DEMO_SPEC_VERSION:
        return False
    return all(data.get(k) == v for k, v in asdict(spec).items())


@contextlib.contextmanager
def _build_lock(models_dir: Path) -> Iterator[None]:
    """Serialize builders of one models_dir (parallel test workers, concurrent sessions)."""
    with open(models_dir / ".demo_build.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _replace_dir(src: Path, dst: Path) -> None:
    """Move src to dst; an existing dst (stale spec) is moved aside first, then deleted."""
    if dst.exists() or dst.is_symlink():
        trash = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, trash / dst.name)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(src, dst)


def build_demo_models(models_dir: Path, spec: DemoSpec = DEFAULT_SPEC) -> dict[str, Path]:
    """Build (or reuse if already built with the same spec) models_dir/'target' and 'draft'.

    Both are written into a temporary sibling folder first and renamed into place, so a crash
    never leaves a half-written model under the final name. Returns {"target": ..., "draft": ...}.
    """
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    out = {"target": models_dir / "target", "draft": models_dir / "draft"}
    if all(_marker_ok(p, spec) for p in out.values()):
        return out
    with _build_lock(models_dir):
        if all(_marker_ok(p, spec) for p in out.values()):
            return out
        tok = _build_tokenizer(spec)
        ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        tokenizer_json = tok.to_str(pretty=True) + "\n"
        draft_w, target_w = _build_weights(spec, sorted(ids.values()))
        staging = Path(tempfile.mkdtemp(prefix=".demo-build-", dir=models_dir))
        try:
            _write_model(
                staging / "draft", spec, "draft", draft_w, spec.draft_layers, tokenizer_json, ids
            )
            _write_model(
                staging / "target",
                spec,
                "target",
                target_w,
                spec.draft_layers + spec.target_extra_layers,
                tokenizer_json,
                ids,
            )
            for role, dst in out.items():
                _replace_dir(staging / role, dst)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


# A target that tensor parallelism can split over 2 ranks: mlx_lm shards attention by heads, so
# its query and KV heads must be divisible by the rank count (the demo target has one KV head).
# Fewer layers than the demo target, so two ranks load in seconds on a small machine.
SPLIT_SPEC = DemoSpec(num_attention_heads=2, num_key_value_heads=2, target_extra_layers=6)
SPLIT_NAME = "split-target"


def build_split_target(models_dir: Path, spec: DemoSpec = SPLIT_SPEC) -> Path:
    """Build (or reuse) ``models_dir/split-target``: built only where a split recipe needs it,
    so the demo target and everything that uses it stay as they are."""
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    out = models_dir / SPLIT_NAME
    if _marker_ok(out, spec):
        return out
    with _build_lock(models_dir):
        if _marker_ok(out, spec):
            return out
        tok = _build_tokenizer(spec)
        ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        _, target_w = _build_weights(spec, sorted(ids.values()))
        staging = Path(tempfile.mkdtemp(prefix=".demo-build-", dir=models_dir))
        try:
            _write_model(
                staging / SPLIT_NAME,
                spec,
                SPLIT_NAME,
                target_w,
                spec.draft_layers + spec.target_extra_layers,
                tok.to_str(pretty=True) + "\n",
                ids,
            )
            _replace_dir(staging / SPLIT_NAME, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out
