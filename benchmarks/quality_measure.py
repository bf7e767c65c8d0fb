"""The lossy budget on the real model: SmolLM2-135M-Instruct's builds judged against its source.

What: fetches and converts the model once (``mcp_infra.demo.smollm.real_model``, cached), makes
the builds below from its bf16 source (``mcp_infra.state.builds.make_build``, float32 compute)
into a scratch folder, and serves the source and each build in turn with a real
``mlx_lm.server``. Each answers the demo suite's selection prompts (64 tokens) and the quality
suite's 35 tasks greedily, with top-10 log-probabilities; code answers run against their tests
(``procs.sandbox``). The product's own gates (``core.budget.lossy_gates``) then judge each
build against the source under the default quality budget: the tasks the source passes that
the build keeps, the identical share, the shared prefix, the mean KL and the top-token
agreement, each with its 96% interval.

Why: the budget's defaults and the quality suite's phrasing are set from what this model and
its builds do; this table says it again on any machine.

Target: none enforced; a measured table (docs/benchmarks.md). Takes: about 45 min on 2 busy
cores (each folder answers about 1,400 tokens at 2-3 tok/s there), 10 on a quiet one.
--smoke: the 8-bit build alone, one greedy prompt and two tasks, 4 tokens each.

    .venv/bin/python benchmarks/quality_measure.py [--tasks N] [--json] [--smoke]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import _common

from mcp_infra.contracts import (
    BASELINE_ID,
    Budgets,
    BuildSpec,
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
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.demo.smollm import real_model
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import free_port, start_server, stop_server, wait_ready
from mcp_infra.procs.sandbox import with_code_run
from mcp_infra.state.builds import make_build
from mcp_infra.state.catalog import load_suite

SPECS = [
    BuildSpec(q_bits=8, dtype="float32"),
    BuildSpec(q_bits=4, dtype="float32"),
    BuildSpec(q_mode="mxfp4", dtype="float32"),
]
THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5.0,
    max_peak_memory_gb=16.0,
    max_error_rate=0.0,
    worst_prompt_tolerance_pct=10.0,
    quality_budget=QualityBudgets(),
)
DRAWS = Resampling(level=0.96, resamples=2000, seed=20261129)


def ask(url: str, cid: str, prompt: SuitePrompt, tokens: int, phase: str) -> Sample:
    return bench.greedy_chat(
        url,
        prompt.chat_messages(),
        max_tokens=tokens,
        timeout=900,
        candidate=cid,
        prompt_id=prompt.id,
        phase=phase,
        top_logprobs=TOP_LOGPROBS,
    )


def answers(folder: Path, cid: str, logs: Path, tasks: int, tokens: int | None) -> CandidateRun:
    """One server on ``folder``: greedy passes and quality tasks, as a cycle's first start
    (``tokens`` set: a smoke run, one greedy prompt)."""
    speed = [p for p in load_suite("demo-speed").prompts if p.split == "selection"]
    speed = [p for p in speed if p.prompt_class != "long_context"][: 1 if tokens else None]
    quality = load_suite("quality").prompts[:tasks]
    recipe = Recipe(candidate_id=f"smollm2:{cid}", template="mlx_lm_server", model_path=str(folder))
    port = free_port()
    record, proc = start_server(
        recipe, port=port, role="candidate", log_path=logs / f"{cid}.log", hf_cache=logs
    )
    try:
        wait_ready(record, timeout=600)
        url = f"http://127.0.0.1:{port}"
        greedy = [ask(url, cid, p, tokens or p.max_tokens, "measure") for p in speed]
        samples = [
            with_code_run(ask(url, cid, p, tokens or p.max_tokens, "quality")) for p in quality
        ]
    finally:
        stop_server(record, grace=10)
        proc.wait(timeout=10)
    lossy = cid != BASELINE_ID
    return CandidateRun(
        candidate=cid,
        candidate_class=CandidateClass.QUANTIZATION if lossy else None,
        semantics=Semantics.LOSSY if lossy else Semantics.LOSSLESS,
        greedy=greedy,
        samples=samples,
    )


def row(name: str, baseline: CandidateRun, run: CandidateRun) -> dict[str, Any]:
    outputs = QualityOutputs(baseline.samples, run.samples)
    agreement, quality = lossy_gates(baseline, run, THRESHOLDS, DRAWS, outputs)
    m = agreement.measure
    assert m is not None and quality.tasks is not None
    held = [t for t in quality.tasks if t.baseline]
    kl, top = m.mean_kl, m.top_agreement

    def shown(i: Any, pct: bool = False) -> str:
        if i is None:
            return "-"
        f = (lambda v: f"{v:.0%}") if pct else (lambda v: f"{v:.3g}")
        return f"{f(i.value)} [{f(i.low)}, {f(i.high)}]"

    return {
        "build": name,
        "tasks_kept": f"{sum(1 for t in held if t.candidate)} of {len(held)}",
        "identical": shown(m.identical_share, pct=True),
        "prefix": shown(m.prefix_length),
        "mean_kl": shown(kl),
        "top_agreement": shown(top, pct=True),
        "agreement_gate": "pass" if agreement.passed else "fail",
        "quality_gate": "pass" if quality.passed else "fail",
        "first_lost": next((f"{t.task}: {t.detail}"[:70] for t in held if not t.candidate), ""),
    }


def main() -> None:
    ap = _common.parser(__doc__)
    ap.add_argument("--tasks", type=int, default=35, help="quality tasks asked (from the first)")
    args = ap.parse_args()
    tasks, tokens = (2, 4) if args.smoke else (args.tasks, None)
    specs = SPECS[:1] if args.smoke else SPECS
    model = real_model()
    rows = []
    with tempfile.TemporaryDirectory(prefix="quality-measure-") as scratch:
        folder = Path(scratch)
        baseline = answers(model.source, BASELINE_ID, folder, tasks, tokens)
        for spec in specs:
            record = make_build(model.source, spec, folder / "builds", Budgets())
            run = answers(Path(record.folder), spec.key(), folder, tasks, tokens)
            rows.append(row(spec.key(), baseline, run))
    print(
        _common.table(
            rows,
            [
                ("build", "build"),
                ("tasks_kept", "tasks kept"),
                ("identical", "identical"),
                ("prefix", "shared prefix (tokens)"),
                ("mean_kl", "mean KL (nats)"),
                ("top_agreement", "top token agrees"),
                ("agreement_gate", "agreement"),
                ("quality_gate", "quality"),
                ("first_lost", "first task lost"),
            ],
        )
    )
    _common.emit({"rows": rows, "tasks": tasks, "level": DRAWS.level}, args.json)


if __name__ == "__main__":
    main()
