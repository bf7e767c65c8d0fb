"""The user's workload as the measurement sees it: request classes at concurrency levels.

Pure functions over samples (no clock, no I/O), so the cycle and ``evidence verify`` reach the
same answer from the same raw files:

* ``decisive_view`` is what the selector is given: the samples of the policy's *decisive* cells;
  *reported* cells are measured and shown, never decided on.
* ``cell_figures`` summarises one configuration per cell (TTFT p50/p99, median per-request decode
  tok/s, aggregate output tok/s) and compares it with the baseline in the same cell.
* ``cell_regressions`` names the decisive cells where a candidate serves less than the
  worst-prompt floor of the baseline's aggregate output tok/s (e.g. a drafter at 4 concurrent
  requests, where the target batches and the drafter does not); ``describe_cell`` says it in words.

Aggregate output tok/s of a cell, per start, is the output tokens of its requests over their
wall span (first request sent to last one finished; a start sends a cell's batches back to
back); over starts, the geometric mean. ``aggregate_tps`` is that figure for the run files and
the verdict alike (``evidence verify`` recomputes the verdict's with it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from mcp_infra.contracts import (
    CandidateRun,
    CellFigures,
    EffectiveThresholds,
    MeasureProtocol,
    Sample,
    WorkloadCell,
)
from mcp_infra.core.intervals import geometric_mean

TIMED_PHASES = ("measure", "drift", "heldout")


def request_class_of(prompt_class: str) -> str:
    """A suite prompt's request class: long-context prompts are long prefills, the rest short."""
    return "long_prefill" if prompt_class == "long_context" else "short"


def timed_length(protocol: MeasureProtocol) -> int:
    """The cap on a timed answer's length: ``max_tokens``, or ``timed_max_tokens`` where it is
    shorter (decode speed needs enough tokens to be measured, not the whole answer; the greedy
    passes still ask the full budget for the equality gate)."""
    return min(protocol.max_tokens, protocol.timed_max_tokens or protocol.max_tokens)


def cell_key(cell: WorkloadCell | Sample) -> tuple[str, int]:
    return (cell.request_class, cell.concurrency)


BLOCKING = ("decisive", "guard")
"""Roles whose regression blocks a promotion (a guard only when clear)."""


def decisive_cells(protocol: MeasureProtocol) -> list[WorkloadCell]:
    """The cells the selector judges: decisive and guard cells."""
    return [c for c in protocol.workload if c.role in BLOCKING]


def decisive_view(run: CandidateRun, protocol: MeasureProtocol) -> CandidateRun:
    """The run as the selector sees it: timed samples of reported cells left out."""
    decisive = {cell_key(c) for c in decisive_cells(protocol)}
    kept = [s for s in run.samples if s.phase not in TIMED_PHASES or cell_key(s) in decisive]
    if len(kept) == len(run.samples):
        return run
    return run.model_copy(update={"samples": kept})


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _ok(sample: Sample, phase: str) -> bool:
    return sample.phase == phase and sample.error is None and bool(sample.completion_tokens)


def _span(rows: Sequence[Sample]) -> float | None:
    """First send to last finish of ``rows`` (t_mono + e2e_s); None without every stamp."""
    stamps = [(s.t_mono, s.e2e_s) for s in rows if s.t_mono is not None and s.e2e_s is not None]
    if len(stamps) != len(rows) or not stamps:
        return None
    return max(t + e for t, e in stamps) - min(t for t, _ in stamps)


def output_tps_by_start(samples: Sequence[Sample], concurrency: int) -> dict[int, float]:
    """Aggregate output tok/s per start: Σ completion tokens / wall span of the requests (first
    send to last finish, from t_mono + e2e_s); one request at a time may use Σ e2e_s instead."""
    by: dict[int, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.start, []).append(s)
    out: dict[int, float] = {}
    for start, rows in sorted(by.items()):
        tokens = sum(s.completion_tokens or 0 for s in rows)
        if tokens <= 0:
            continue
        span = _span(rows)
        durations = [s.e2e_s for s in rows if s.e2e_s is not None]
        if span is None and concurrency == 1 and len(durations) == len(rows):
            span = math.fsum(durations)
        if span is not None and span > 0:
            out[start] = tokens / span
    return out


def aggregate_tps(samples: Sequence[Sample], concurrency: int) -> float | None:
    """A cell's aggregate output tok/s: the geometric mean over starts of
    ``output_tps_by_start`` (None without one)."""
    per_start = output_tps_by_start(samples, concurrency)
    return geometric_mean(list(per_start.values())) if per_start else None


def cell_figures(
    samples: Sequence[Sample],
    protocol: MeasureProtocol,
    phase: str = "measure",
    baseline: Sequence[CellFigures] | None = None,
) -> list[CellFigures]:
    """Per workload cell: TTFT p50/p99, median decode tok/s, aggregate tok/s, and the ratios
    to ``baseline`` (the baseline's own figures) where both sides have them."""
    base: dict[tuple[str, int], CellFigures] = {
        (f.request_class, f.concurrency): f for f in baseline or []
    }
    out: list[CellFigures] = []
    for cell in protocol.workload:
        rows = [s for s in samples if _ok(s, phase) and cell_key(s) == cell_key(cell)]
        ttft = [s.ttft_s for s in rows if s.ttft_s is not None]
        decode = [s.decode_tps for s in rows if s.decode_tps is not None and s.decode_tps > 0]
        figures = CellFigures(
            request_class=cell.request_class,
            concurrency=cell.concurrency,
            role=cell.role,
            requests=len(rows),
            ttft_p50_s=_quantile(ttft, 0.5) if ttft else None,
            ttft_p99_s=_quantile(ttft, 0.99) if ttft else None,
            decode_tps=statistics.median(decode) if decode else None,
            aggregate_tps=aggregate_tps(rows, cell.concurrency),
        )
        ref = base.get(cell_key(cell))
        if ref is not None:
            if ref.aggregate_tps and figures.aggregate_tps:
                figures.aggregate_vs_baseline = figures.aggregate_tps / ref.aggregate_tps
            if ref.decode_tps and figures.decode_tps:
                figures.decode_vs_baseline = figures.decode_tps / ref.decode_tps
        out.append(figures)
    return out


def describe_cell(figures: CellFigures) -> str:
    """One cell's comparison in words, e.g. 'at 4 concurrent short requests it serves 0.55x the
    baseline's aggregate output tok/s (95.0 vs 171.3)'."""
    who = (
        "1 request at a time"
        if figures.concurrency == 1
        else f"{figures.concurrency} concurrent requests"
    )
    kind = "short" if figures.request_class == "short" else "long-prefill"
    text = f"at {who} ({kind})"
    if figures.aggregate_vs_baseline is None or figures.aggregate_tps is None:
        return f"{text} it was not measured on both sides"
    base = figures.aggregate_tps / figures.aggregate_vs_baseline
    return (
        f"{text} it serves {figures.aggregate_vs_baseline:.2f}x the baseline's aggregate "
        f"output tok/s ({figures.aggregate_tps:.1f} vs {base:.1f})"
    )


def cell_regressions(
    figures: Sequence[CellFigures], thresholds: EffectiveThresholds
) -> list[CellFigures]:
    """Decisive cells where the candidate's aggregate output tok/s is below the worst-prompt
    floor of the baseline's, or where the candidate has requests but no comparable figure (a
    cell not compared is not a cell that held). A cell the suite has no prompts for has no
    requests on either side and is not a regression."""
    floor = 1 - thresholds.worst_prompt_tolerance_pct / 100
    return [
        f
        for f in figures
        if f.role in BLOCKING
        and f.requests > 0
        and (f.aggregate_vs_baseline is None or f.aggregate_vs_baseline < floor)
    ]
