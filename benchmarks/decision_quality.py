"""How good are the selector's decisions? The product's own ``selector.select`` on simulated
samples whose truth is known.

Each simulated cycle measures a baseline and one candidate over ``--prompts`` prompts with
``--repeats`` repeats per start. Every fresh server start runs a random factor faster or slower as
a whole (log-normal, sd ``--start-noise``) and every request varies on top (sd
``--repeat-noise``). The candidate's true per-prompt speedup is ``--true-speedups`` (or, with
``--regressing-prompt R``, one prompt at R while the others gain).

Two protocols run on the same draws:

* early stopping, exactly as the cycle runs it: one new start per configuration per round;
  from round ``min_starts`` on, ``select`` is called after each round; a candidate that is
  qualified or rejected stops, an inconclusive one gets another start while rounds remain
  (``max_starts``); with a learned spread and a futility stop, the rounds before
  ``min_starts`` are judged for rejections only, and a first look on one start a side waits
  for a second start without a learned spread (``core.earlystop.may_decide``);
* a fixed protocol of the same maximum size: ``max_starts`` starts each, one decision
  (``min_starts == max_starts``, so a single look).

``--screening`` judges the first start as a screened plan's screening round does
(``core.screening.screen``: the one-start interval at 99% wholly below the threshold drops the
candidate, which then counts as rejected after one start) before the early-stopping rounds;
the ``screened`` column says how often it dropped the candidate.

Per true speedup it prints how often the candidate qualified and was rejected, how often the
final interval covered the truth (the geometric mean of the true per-prompt ratios), the mean
starts and the mean requests (baseline + candidate) used. With ``--json`` the last line is one
JSON object ``{"rows": [...]}``; ``fixed_*`` keys are the fixed protocol's figures.

Target: at a true speedup at or below the threshold the candidate qualifies in at most
(1 - confidence) / 2 of cycles, and the intervals cover the truth at about the confidence level;
above it, early stopping qualifies about as often as the fixed protocol, in fewer requests
(printed, not judged: no exit status says it).
Takes: no servers; it grows with seeds x true speedups x resamples (the defaults simulate
1,200 cycles of both protocols; the run prints its own time). --smoke: 5 seeds of two true
speedups, 100 resamples, one process: a few seconds.

    python benchmarks/decision_quality.py --true-speedups 1.00,1.03,1.10,1.30 --threshold-pct 5 \\
        --start-noise 0.03 --repeat-noise 0.05 --prompts 8 --seeds 300 [--json] [--smoke]
        [--screening]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import _common

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    Decision,
    EffectiveThresholds,
    LearnedSpread,
    MeasureProtocol,
    RoundRecord,
    Sample,
)
from mcp_infra.core.earlystop import MayDecide, may_decide
from mcp_infra.core.screening import screen
from mcp_infra.core.selector import select

BASELINE = "baseline"
CANDIDATE = "sim:candidate"
TEXT = "A plain simulated answer that does not repeat itself."


@dataclass(frozen=True)
class Setup:
    threshold_pct: float
    start_noise: float
    repeat_noise: float
    prompts: int
    repeats: int
    min_starts: int
    max_starts: int
    resamples: int
    regressing: float | None
    learned_df: int = 0
    learned_error: float = 1.0
    futility: float | None = None
    confidence: float = MeasureProtocol().confidence
    screening: bool = False

    def learned(self) -> LearnedSpread | None:
        """The spread a home's history would have learned (times ``learned_error``)."""
        if self.learned_df <= 0:
            return None
        true = math.sqrt(self.start_noise**2 + self.repeat_noise**2 / (self.prompts * self.repeats))
        return LearnedSpread(sd=true * self.learned_error, df=self.learned_df)


@dataclass
class Outcome:
    decision: str
    covered: bool
    starts: int
    requests: int
    screened: bool = False


def _greedy(cid: str, prompts: int) -> list[Sample]:
    return [
        Sample(candidate=cid, prompt_id=f"p{i}", repeat=0, text=TEXT, token_ids=[1, 2, 3])
        for i in range(prompts)
    ]


def _start(
    rng: random.Random, cid: str, start: int, levels: list[float], setup: Setup
) -> list[Sample]:
    """One fresh server start: a process-wide factor, then each request's own noise."""
    factor = math.exp(rng.gauss(0.0, setup.start_noise))
    return [
        Sample(
            candidate=cid,
            prompt_id=f"p{i}",
            repeat=r,
            order=r,
            start=start,
            round=start,
            completion_tokens=64,
            text=TEXT,
            decode_tps=level * factor * math.exp(rng.gauss(0.0, setup.repeat_noise)),
        )
        for i, level in enumerate(levels)
        for r in range(setup.repeats)
    ]


def _run(cid: str, samples: list[Sample], prompts: int) -> CandidateRun:
    klass = None if cid == BASELINE else CandidateClass.SERVER_TUNING
    at = datetime(2026, 1, 1, tzinfo=UTC)
    rounds = [
        RoundRecord(config=cid, start=st, round=st, started_at=at, ended_at=at)
        for st in sorted({s.start for s in samples})
    ]
    return CandidateRun(
        candidate=cid,
        candidate_class=klass,
        samples=samples,
        greedy=_greedy(cid, prompts),
        rounds=rounds,
    )


def _thresholds(setup: Setup) -> EffectiveThresholds:
    return EffectiveThresholds(
        min_speedup_pct=setup.threshold_pct,
        max_peak_memory_gb=1e6,
        max_error_rate=0.0,
        worst_prompt_tolerance_pct=10.0,
        lossy_min_identical_fraction=0.5,
    )


def _screened(
    base: list[Sample], cand: list[Sample], setup: Setup, protocol: MeasureProtocol
) -> bool:
    """Whether screening drops the candidate on its first start and the baseline's."""
    runs = [_run(CANDIDATE, cand, setup.prompts)]
    result = screen(_run(BASELINE, base, setup.prompts), runs, _thresholds(setup), protocol)
    return CANDIDATE in result.dropped


def _decide(
    base: list[Sample], cand: list[Sample], setup: Setup, protocol: MeasureProtocol
) -> tuple[str, float, float]:
    thresholds = _thresholds(setup)
    verdict = select(
        _run(BASELINE, base, setup.prompts),
        [_run(CANDIDATE, cand, setup.prompts)],
        thresholds,
        protocol,
        {c: True for c in CandidateClass},
    )
    [cv] = verdict.candidates
    return cv.decision.value, cv.ci_low or 0.0, cv.ci_high or math.inf


def simulate(args: tuple[Setup, float, int]) -> tuple[Outcome, Outcome]:
    """One simulated cycle: (early stopping outcome, fixed protocol outcome), same draws."""
    setup, truth, seed = args
    rng = random.Random(f"{seed}:{truth}:{setup.regressing}")
    base_levels = [rng.uniform(40.0, 120.0) for _ in range(setup.prompts)]
    ratios = [truth] * setup.prompts
    if setup.regressing is not None:
        ratios[0] = setup.regressing
    true_speedup = math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios))
    cand_levels = [b * r for b, r in zip(base_levels, ratios, strict=True)]
    base_starts = [_start(rng, BASELINE, s, base_levels, setup) for s in range(setup.max_starts)]
    cand_starts = [_start(rng, CANDIDATE, s, cand_levels, setup) for s in range(setup.max_starts)]
    common = {
        "repeats": setup.repeats,
        "bootstrap_resamples": setup.resamples,
        "drift_check": False,
        "learned_spread": setup.learned(),
        "futility_confidence": setup.futility,
        "confidence": setup.confidence,
    }
    staged = MeasureProtocol(min_starts=setup.min_starts, max_starts=setup.max_starts, **common)
    fixed = MeasureProtocol(min_starts=setup.max_starts, max_starts=setup.max_starts, **common)
    per_start = setup.prompts * setup.repeats

    early = None
    if setup.screening and _screened(base_starts[0], cand_starts[0], setup, staged):
        early = Outcome("rejected", False, 1, 2 * per_start, screened=True)
    for n in range(1, setup.max_starts + 1) if early is None else ():
        look = may_decide(n, staged)  # rounds.run_rounds's rule
        if look is MayDecide.NOTHING and n < setup.max_starts:
            continue
        base = [s for st in base_starts[:n] for s in st]
        cand = [s for st in cand_starts[:n] for s in st]
        decision, low, high = _decide(base, cand, setup, staged)
        if look is MayDecide.REJECTIONS and decision != Decision.REJECTED:
            continue  # before min_starts a look only rejects
        if decision != Decision.INCONCLUSIVE or n == setup.max_starts:
            early = Outcome(decision, low <= true_speedup <= high, n, 2 * n * per_start)
            break
    assert early is not None
    base = [s for st in base_starts for s in st]
    cand = [s for st in cand_starts for s in st]
    decision, low, high = _decide(base, cand, setup, fixed)
    full = Outcome(
        decision, low <= true_speedup <= high, setup.max_starts, 2 * setup.max_starts * per_start
    )
    return early, full


def _rates(outcomes: list[Outcome]) -> dict[str, float]:
    n = len(outcomes)
    return {
        "qualified_rate": sum(o.decision == "qualified" for o in outcomes) / n,
        "rejected_rate": sum(o.decision == "rejected" for o in outcomes) / n,
        "coverage": sum(o.covered for o in outcomes) / n,
        "mean_starts": sum(o.starts for o in outcomes) / n,
        "mean_requests": sum(o.requests for o in outcomes) / n,
        "screened_rate": sum(o.screened for o in outcomes) / n,
    }


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = _common.parser(__doc__)
    ap.add_argument("--true-speedups", default="1.00,1.03,1.10,1.30")
    ap.add_argument("--threshold-pct", type=float, default=5.0)
    ap.add_argument("--start-noise", type=float, default=0.03)
    ap.add_argument("--repeat-noise", type=float, default=0.05)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=300)
    ap.add_argument("--min-starts", type=int, default=MeasureProtocol().min_starts)
    ap.add_argument("--max-starts", type=int, default=MeasureProtocol().max_starts)
    ap.add_argument(
        "--resamples",
        type=int,
        default=400,
        help="bootstrap resamples per decision (the policies use 2000)",
    )
    ap.add_argument(
        "--regressing-prompt",
        type=float,
        default=None,
        help="one prompt at this true ratio while the others gain",
    )
    ap.add_argument(
        "--learned-df",
        type=int,
        default=0,
        help="degrees of freedom of a learned start spread (0: none, the cycle's own only)",
    )
    ap.add_argument("--learned-error", type=float, default=1.0, help="learned spread / true spread")
    ap.add_argument("--futility", type=float, default=None, help="futility confidence")
    ap.add_argument(
        "--screening",
        action="store_true",
        help="judge the first start as a screened plan's screening round (core.screening)",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--confidence", type=float, default=MeasureProtocol().confidence, help="the protocol's"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.true_speedups, args.seeds, args.resamples, args.jobs = "1.00,1.10", 5, 100, 1
    return args


def _print_rows(rows: list[dict[str, float]]) -> None:
    head = (
        f"{'truth':>6} | {'qualified':>9} {'rejected':>8} {'coverage':>8} {'starts':>6} "
        f"{'requests':>8} {'screened':>8} | fixed: {'qualified':>9} {'rejected':>8} "
        f"{'coverage':>8} {'requests':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['true_speedup']:>6.3f} | {r['qualified_rate']:>9.1%} {r['rejected_rate']:>8.1%} "
            f"{r['coverage']:>8.1%} {r['mean_starts']:>6.2f} {r['mean_requests']:>8.1f} "
            f"{r['screened_rate']:>8.1%} | "
            f"{'':6} {r['fixed_qualified_rate']:>9.1%} {r['fixed_rejected_rate']:>8.1%} "
            f"{r['fixed_coverage']:>8.1%} {r['fixed_mean_requests']:>8.1f}"
        )


def _setup(args: argparse.Namespace) -> Setup:
    return Setup(
        args.threshold_pct,
        args.start_noise,
        args.repeat_noise,
        args.prompts,
        args.repeats,
        args.min_starts,
        args.max_starts,
        args.resamples,
        args.regressing_prompt,
        args.learned_df,
        args.learned_error,
        args.futility,
        args.confidence,
        args.screening,
    )


def measure(setup: Setup, truths: list[float], seeds: int, jobs: int) -> list[dict[str, float]]:
    """One row per true speedup: both protocols' rates over ``seeds`` simulated cycles."""
    tasks = [(setup, t, seed) for t in truths for seed in range(seeds)]
    if jobs > 1:
        with multiprocessing.Pool(jobs) as pool:
            results = pool.map(simulate, tasks, chunksize=8)
    else:
        results = [simulate(t) for t in tasks]
    rows = []
    for i, truth in enumerate(truths):
        chunk = results[i * seeds : (i + 1) * seeds]
        early = _rates([e for e, _ in chunk])
        fixed = _rates([f for _, f in chunk])
        rows.append({"true_speedup": truth, **early, **{f"fixed_{k}": v for k, v in fixed.items()}})
    return rows


def _print_settings(args: argparse.Namespace, took: float) -> None:
    reg = (
        f", one prompt at x{args.regressing_prompt:g}" if args.regressing_prompt is not None else ""
    )
    print(
        f"threshold {args.threshold_pct:g}%, start noise {args.start_noise:g}, repeat noise "
        f"{args.repeat_noise:g}, {args.prompts} prompts x {args.repeats} repeats, starts "
        f"{args.min_starts}..{args.max_starts}, {args.seeds} seeds, {args.resamples} "
        f"resamples{reg}; learned spread {args.learned_df} df x{args.learned_error:g}, "
        f"futility {args.futility}, confidence {args.confidence:g}"
        + (", screening" if args.screening else "")
        + f"; {took:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    truths = [float(x) for x in args.true_speedups.split(",")]
    began = time.monotonic()
    rows = measure(_setup(args), truths, args.seeds, args.jobs)
    _print_settings(args, time.monotonic() - began)
    _print_rows(rows)
    _common.emit({"smoke": args.smoke, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
