"""Model folders the project did not build: what a user points `init --model` at.

The demo models are Qwen3 with a ChatML template and a 512-token character BPE. A user's own
model differs in everything the product must read rather than assume: a Llama architecture, its
own shapes (head dimension 32, so the runtime's default KV group size of 64 does not divide it),
a tokenizer trained on other text with other special tokens, and a chat template of its own.
Built with the `tokenizers` library and mlx-lm's own model classes, from a seed, in seconds.

Random weights write gibberish; the special tokens' ``lm_head`` rows are zero, so answers run to
``max_tokens`` (as the demo models do), and the tokenizer has no byte fallback, so any token
sequence decodes to printable text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIALS = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<unk>")
EOS = "</s>"
CHAT_TEMPLATE = (
    "{{ '<s>' }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ '<|user|> ' + m['content'] + '\\n' }}"
    "{% else %}{{ '<|assistant|> ' + m['content'] + '</s>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)
REVISION = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Shape:
    """What makes one model folder: architecture, sizes and the tokenizer's training."""

    layers: int = 4
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    intermediate: int = 128
    vocab: int = 700
    tokenizer_seed: int = 7
    seed: int = 11
    model_type: str = "llama"


TARGET = Shape()
DRAFTER = Shape(layers=1, hidden=32, heads=1, head_dim=32, intermediate=64, seed=12)
OTHER_TOKENIZER = Shape(layers=1, hidden=32, heads=1, intermediate=64, vocab=600, tokenizer_seed=99)


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "bcdfghklmnprstvz"
    vowels = "aeiouy"
    words = [
        "".join(rng.choice(letters) + rng.choice(vowels) for _ in range(rng.randint(1, 4)))
        for _ in range(400)
    ]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + rng.choice(".!?,;")
        for _ in range(3000)
    ]


def build_tokenizer(shape: Shape) -> Any:  # a tokenizers.Tokenizer (no stubs)
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex(r" ?[a-z]+| ?[A-Z][a-z]*| ?\d| ?[^\sA-Za-z\d]+|\s+"), behavior="isolated"
    )
    tok.decoder = decoders.Fuse()
    alphabet = [chr(c) for c in range(32, 127)] + ["\n"]
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(shape.tokenizer_seed), trainer=trainer)
    return tok


def build_model(folder: Path, shape: Shape = TARGET) -> Path:
    """Write a loadable model folder (config, weights, tokenizer files, chat template)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    tok = build_tokenizer(shape)
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": shape.model_type,
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids["<pad>"],
    }
    args = llama.ModelArgs.from_dict(config)
    mx.random.seed(shape.seed)
    model = llama.Model(args)
    weights = dict(tree_flatten(model.parameters()))
    head = np.array(weights["lm_head.weight"])
    head[sorted(ids.values())] = 0.0  # never emitted: answers run to max_tokens
    weights["lm_head.weight"] = mx.array(head)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    _dump(folder / "config.json", config)
    (folder / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    added = {
        str(i): {
            "content": t,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for t, i in ids.items()
    }
    _dump(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": EOS,
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": added,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
        },
    )
    _dump(folder / "generation_config.json", {"eos_token_id": ids[EOS], "do_sample": False})
    return folder


def into_hub_cache(cache: Path, repo: str, shape: Shape, revision: str = REVISION) -> Path:
    """Build a model as a snapshot of ``repo`` in a Hugging Face hub cache (blobs, a snapshot
    of links to them, refs/main), the layout `huggingface_hub` itself writes."""
    import hashlib
    import os
    import tempfile

    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        built = build_model(Path(tmp) / "m", shape)
        for file in sorted(built.iterdir()):
            data = file.read_bytes()
            blob = blobs / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def _dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def seed_help(home_root: Path) -> None:
    """Put the recorded ``--help`` texts (tests/data/runtime-help) where the catalog keeps the
    installed runtimes' own, so a fast test reads them instead of starting the runtimes."""
    from importlib import metadata

    from mcp_infra.state.owncatalog import help_path
    from mcp_infra.state.store import Home
    from tests.helpers.paths import REPO

    recorded = REPO / "tests" / "data" / "runtime-help"
    for name, package, file in (
        ("mlx_lm_server", "mlx-lm", "mlx-lm-0.32.2-server.txt"),
        ("mlx_vlm_server", "mlx-vlm", "mlx-vlm-0.7.10-server.txt"),
        ("mlx_lm.convert", "mlx-lm", "mlx-lm-0.32.2-convert.txt"),
    ):
        target = help_path(Home(home_root), name, metadata.version(package))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((recorded / file).read_text())
