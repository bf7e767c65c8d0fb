"""The verdict on one candidate: its gates, then its speed at this look by the rules of
``core.selector`` (the module docstring there has them in order), and each workload cell's.

Pure: samples, the frozen thresholds and protocol in, a ``CandidateVerdict`` with its reasons in
words out. ``select`` judges every candidate with ``judge`` and picks among them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    CandidateVerdict,
    CellVerdict,
    Decision,
    EffectiveThresholds,
    MeasureProtocol,
    PromptStat,
    Sample,
    WorkloadCell,
)
from mcp_infra.core.budget import may_promote_alone, resampling_for
from mcp_infra.core.gating import run_gates
from mcp_infra.core.intervals import (
    ASSUMED_START_NOISE,
    Spread,
    geometric_mean,
    log_interval,
    look_level,
    quantile,
)
from mcp_infra.core.stats import (
    SEED,
    SpeedupSummary,
    SummaryOptions,
    derive_seed,
    error_count,
    in_cell,
    repeats_to_decide,
    speedup_summary,
)
from mcp_infra.core.workload import output_tps_by_start

# The most repeats a protocol may ask for (contracts.MeasureProtocol.repeats, le=50).
MAX_REPEATS = 50


def ratio_words(value: float) -> str:
    """A speed ratio as the verdicts say it: ``1.237x``."""
    return f"{value:.3f}x"


_x = ratio_words  # the short name the reasons' f-strings use


def _measured_cells(samples: Sequence[Sample]) -> set[tuple[str, int]]:
    return {
        (s.request_class, s.concurrency)
        for s in samples
        if s.phase == "measure" and s.error is None and s.decode_tps
    }


def headline_cell(
    baseline: CandidateRun, run: CandidateRun, protocol: MeasureProtocol
) -> tuple[str, int] | None:
    """The cell the headline speedup is judged on: one short request at a time when both sides
    measured it, else the first decisive workload cell both measured, else the first measured
    workload cell; None (all samples) when no workload cell was measured on both sides."""
    both = _measured_cells(baseline.samples) & _measured_cells(run.samples)
    if ("short", 1) in both:
        return ("short", 1)
    ordered = [c for c in protocol.workload if c.role == "decisive"] + list(protocol.workload)
    for c in ordered:
        if (c.request_class, c.concurrency) in both:
            return (c.request_class, c.concurrency)
    return None


def cell_words(request_class: str, concurrency: int) -> str:
    """'4 concurrent short requests', 'one long-prefill request at a time'."""
    kind = "short" if request_class == "short" else "long-prefill"
    if concurrency == 1:
        return f"one {kind} request at a time"
    return f"{concurrency} concurrent {kind} requests"


def learned_prior(protocol: MeasureProtocol) -> Spread | None:
    learned = protocol.learned_spread
    return Spread(learned.sd, learned.df) if learned is not None else None


def futile(summary: SpeedupSummary, threshold: float, confidence: float | None) -> float | None:
    """The upper end of the interval at the futility confidence when it lies below the
    threshold (the candidate cannot be expected to qualify), else None. The half-width is the
    look's, scaled by the ratio of normal quantiles: with few degrees of freedom the t ratio is
    smaller, so this errs towards measuring on. A learned spread counts at its full weight here
    (``reject_high``): a stop that can only reject needs no guard against a history too quiet."""
    top = summary.reject_high if summary.reject_high is not None else summary.ci_high
    if confidence is None or summary.estimate <= 0 or top <= summary.estimate:
        return None
    normal = statistics.NormalDist()
    scale = normal.inv_cdf((1 + confidence) / 2) / normal.inv_cdf((1 + summary.level) / 2)
    high = summary.estimate * (top / summary.estimate) ** scale
    return high if high < threshold else None


def _refused_unmeasured(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    verdict: CandidateVerdict,
) -> bool:
    """Count what the candidate used, and reject it (True, the reason added) where there is
    nothing to judge: it did not start, measured nothing, or failed too many requests."""
    if not run.started:
        why = run.start_error or "no error was reported"
        verdict.reasons.append(f"The candidate did not start: {why}.")
        return True

    measured = [s for s in run.samples if s.phase == "measure"]
    verdict.requests_used = len(measured)
    verdict.starts_used = len({s.start for s in measured})
    verdict.rounds_used = len({s.round for s in measured})
    verdict.baseline_starts = len({s.start for s in baseline.samples if s.phase == "measure"})
    failed, total = error_count(run.samples)
    if total == 0:  # say why when a start recorded it (a server that died in its warm-up)
        cause = next((r.error for r in run.rounds if r.error), None) or next(
            (s.error for s in run.samples if s.error), None
        )
        verdict.reasons.append(
            "The candidate has no measured requests" + (f": {cause}." if cause else ".")
        )
        return True
    rate = failed / total
    if rate > thresholds.max_error_rate:
        first = next(s.error for s in run.samples if s.phase == "measure" and s.error)
        verdict.reasons.append(
            f"{failed} of {total} measured requests failed ({rate:.0%}), above the "
            f"{thresholds.max_error_rate:.0%} allowed; first error: {first}."
        )
        return True

    return False


def _gated_before_timing(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    quality: dict[str, list[Sample]] | None,
    protocol: MeasureProtocol,
    verdict: CandidateVerdict,
) -> None:
    """A candidate that started, gave its greedy outputs and timed nothing: where a gate failed
    (a start that takes its gates first ends there, ``core.screening.gate_stop``), the gates
    are its reasons."""
    if not run.started or not run.greedy or verdict.requests_used:
        return
    gates = run_gates(baseline, run, thresholds, quality, protocol.quality_suite)
    failed = [f"The {g.gate} gate failed: {g.detail}." for g in gates if not g.passed]
    if failed:
        verdict.gates = gates
        verdict.reasons = [*failed, "Its start ended at the failed gate, before any timing."]


def awaiting_gates(run: CandidateRun) -> bool:
    """Whether ``run`` was timed and has not taken its gates: no greedy output and no quality
    answer (a screened plan takes a candidate's gates in a start of their own once its speed
    qualifies it, ``flows.rounds``). Every other start that times takes its greedy passes
    first, so a timed run without them is only ever one whose gates wait."""
    quality = any(s.phase == "quality" for s in run.samples)
    return bool(run.samples) and not run.greedy and not quality


def _without_gates(
    decision: Decision, lines: list[str], verdict: CandidateVerdict, speed: str
) -> tuple[Decision, list[str]]:
    """The decision on a candidate whose gates are not taken: one its speed qualifies stays
    open (``gates_pending``) until its gates pass; a rejection on speed stands, and needed
    none."""
    note = (
        "Its gates were not taken: a screened plan takes a candidate's gates once its speed "
        "qualifies it."
    )
    if decision == Decision.QUALIFIED:
        verdict.gates_pending = True
        return Decision.INCONCLUSIVE, [
            f"Qualifies on speed ({speed}); its gates are not taken yet, and it is not "
            "qualified before they pass."
        ]
    return decision, [*lines, note]


def _verdict_notes(
    cells: list[CellVerdict], summary: SpeedupSummary, *, confirmation: bool
) -> list[str]:
    """What every verdict on a candidate adds after its decision: reported cells, and what the
    interval assumed (a confirmation's bar, a baseline of one start)."""
    notes = [
        f"Reported, not decisive: {c.detail}."
        for c in cells
        if c.role == "reported" and not c.headline and c.detail
    ]
    if confirmation:
        notes.append(
            "A confirmation of the selection: the bar is the threshold alone (the A/A noise "
            "floor was cleared in selection; one start per side carries the assumed "
            f"{ASSUMED_START_NOISE:.0%} start-to-start spread in its interval)."
        )
    elif summary.noise_floor_assumed:
        notes.append(
            "The baseline was measured in a single server start, so its A/A noise floor is "
            "unknown: it was computed from an assumed "
            f"{ASSUMED_START_NOISE:.0%} start-to-start spread ({_x(summary.noise_floor)}), and "
            "any side with one start gets that spread in its interval too (decided "
            "conservatively)."
        )
    return notes


def _open_interval(
    verdict: CandidateVerdict,
    summary: SpeedupSummary,
    threshold: float,
    speed: str,
    *,
    confirmation: bool,
) -> list[str]:
    """Why an interval leaves the decision open (spanning the threshold, or not clearing the
    A/A noise floor), with how many repeats would likely decide it (set on the verdict)."""
    lines: list[str] = []
    if summary.ci_low < threshold:
        verdict.repeats_to_decide = repeats_to_decide(
            summary.estimate, summary.ci_low, summary.ci_high, threshold, summary.repeats
        )
        if verdict.repeats_to_decide is None:
            more = "more starts or repeats might decide it, but how many cannot be estimated"
        else:
            more = (
                f"about {verdict.repeats_to_decide} repeats per prompt (now {summary.repeats}) "
                "would likely decide it if the starts agree"
            )
            if verdict.repeats_to_decide > MAX_REPEATS:
                more += f", more than the protocol allows ({MAX_REPEATS})"
        lines.append(f"Inconclusive: {speed}; the interval spans the threshold; {more}.")
    elif not confirmation and summary.ci_low < summary.noise_floor:
        lines.append(
            f"Inconclusive: {speed}; the lower bound clears the threshold but not the A/A noise "
            f"floor {_x(summary.noise_floor)} (how far the baseline's own starts differ)."
        )
    return lines


def _lost_and_open(cells: list[CellVerdict]) -> tuple[list[CellVerdict], list[CellVerdict]]:
    """The workload cells (besides the headline) that reject a candidate, and those that leave
    it open: a decisive cell regressed or unmeasured, or a guard cell regressed, loses; a
    decisive cell still unclear keeps it open."""
    lost = [
        c
        for c in cells
        if (c.role == "decisive" and not c.headline and c.status in ("regressed", "unmeasured"))
        or (c.role == "guard" and c.status == "regressed")
    ]
    still_open = [
        c for c in cells if c.role == "decisive" and not c.headline and c.status == "unclear"
    ]
    return lost, still_open


def _nothing_to_compare(baseline: CandidateRun) -> str:
    """Why no speedup could be computed: which side lacks a successful measurement."""
    if not any(s.phase == "measure" and s.error is None for s in baseline.samples):
        return "The baseline has no successful measurement to compare with."
    return "No prompt was measured successfully on both sides."


@dataclass(frozen=True)
class Headline:
    """What each workload cell's verdict shares with the headline look: the headline cell and
    its summary, the candidate's seed, the look's level and the worst-prompt floor."""

    cell: tuple[str, int] | None
    summary: SpeedupSummary
    seed: int
    level: float
    floor: float


@dataclass
class Look:
    """One candidate's speed at this look, with the words every reason shares."""

    summary: SpeedupSummary
    threshold: float
    floor: float
    speed: str
    below: list[PromptStat]
    straddle: list[PromptStat]
    cells_lost: list[CellVerdict]
    cells_open: list[CellVerdict]

    def prompt_text(self, p: PromptStat) -> str:
        return (
            f"prompt {p.prompt_id} ran at {_x(p.speedup)} the baseline (interval "
            f"{_x(p.ci_low or p.speedup)} to {_x(p.ci_high or p.speedup)}) against the "
            f"{_x(self.floor)} the worst-prompt tolerance allows"
        )


def _speed_words(summary: SpeedupSummary, threshold: float) -> str:
    """``speedup 1.500x (96% interval ... ) against the required 1.050x``."""
    adjusted = (
        f", {summary.level:.1%} at this look of early stopping"
        if summary.level != summary.confidence
        else ""
    )
    return (
        f"speedup {_x(summary.estimate)} ({summary.confidence:.0%} interval{adjusted} "
        f"{_x(summary.ci_low)} to {_x(summary.ci_high)}, {summary.baseline_starts} baseline and "
        f"{summary.candidate_starts} candidate start(s)"
        + ("" if summary.spread == "this cycle" else f"; start spread {summary.spread}")
        + f") against the required {_x(threshold)}"
    )


def _look(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    verdict: CandidateVerdict,
) -> Look | None:
    """The speed summary at this look, its figures and cells set on ``verdict``; None where no
    prompt was measured on both sides."""
    level = look_level(
        protocol.confidence, verdict.starts_used, protocol.min_starts, protocol.max_starts
    )
    head = headline_cell(baseline, run, protocol)
    seed = derive_seed(SEED, run.candidate)
    summary = speedup_summary(
        baseline.samples, run.samples, SummaryOptions.of(protocol, seed, level), cell=head
    )
    if summary is None:
        return None
    _fill_figures(verdict, summary)
    floor = 1 - thresholds.worst_prompt_tolerance_pct / 100
    verdict.cells = judge_cells(
        baseline, run, protocol, Headline(head, summary, seed, level, floor)
    )
    threshold = 1 + thresholds.min_speedup_pct / 100
    lost, still_open = _lost_and_open(verdict.cells)
    return Look(
        summary=summary,
        threshold=threshold,
        floor=floor,
        speed=_speed_words(summary, threshold),
        below=[p for p in summary.per_prompt if (p.ci_high or p.speedup) < floor],
        straddle=[
            p
            for p in summary.per_prompt
            if (p.ci_low or p.speedup) < floor <= (p.ci_high or p.speedup)
        ],
        cells_lost=lost,
        cells_open=still_open,
    )


def _rejected(look: Look, hard_failures: list[str]) -> list[str] | None:
    """The reasons the candidate is rejected on what is measured so far (rules 1 and 2), or
    None."""
    s, speed = look.summary, look.speed
    if hard_failures:
        return [*hard_failures, f"Measured {speed}."]
    also = [f"Also, {look.prompt_text(p)}." for p in look.below]
    if s.ci_high < 1.0:
        return [f"Regression: {speed}; the whole interval is below 1.000x.", *also]
    if s.ci_high < look.threshold:
        return [f"Too slow: {speed}; the whole interval is below the threshold.", *also]
    if look.below:
        return [
            *[
                f"Regressing prompt: {look.prompt_text(p)}; its whole interval is below it."
                for p in look.below
            ],
            f"Measured {speed}.",
        ]
    if look.cells_lost:
        return [
            *[f"Lost at a decisive workload cell: {c.detail}." for c in look.cells_lost],
            f"Measured {speed}.",
        ]
    return None


def _qualified(
    look: Look, run: CandidateRun, may_promote: bool, *, confirmation: bool
) -> tuple[Decision, list[str]] | None:
    """Rule 3: qualified (or rejected for no gain) when the lower bound clears the bar and no
    prompt or decisive cell is still unclear; None otherwise."""
    s = look.summary
    bar = look.threshold if confirmation else max(look.threshold, s.noise_floor)
    if s.ci_low < bar or look.straddle or look.cells_open:
        return None
    if s.estimate <= 1.0:
        # Only reachable when the threshold is at or below 1: no measured gain is no reason
        # to switch, and identical measurements must never qualify.
        return Decision.REJECTED, [f"No gain: {look.speed}; the estimate is not above 1.000x."]
    floor_words = "" if confirmation else f"; A/A noise floor {_x(s.noise_floor)}"
    lines = [
        f"Qualified: {look.speed}{floor_words}; worst prompt "
        f"{s.worst_prompt} at {_x(s.worst_speedup)}."
    ]
    if not may_promote:
        klass = run.candidate_class.value if run.candidate_class else "unknown"
        lines.append(
            f"Qualified, awaiting approval: class {klass} may not auto-promote under this policy."
        )
    return Decision.QUALIFIED, lines


def _left_open(
    look: Look, verdict: CandidateVerdict, protocol: MeasureProtocol, *, confirmation: bool
) -> tuple[Decision, list[str]]:
    """Futile (rejected) where even the futility interval's upper end is below the threshold;
    otherwise inconclusive, with what would decide it (rule 4)."""
    s = look.summary
    high = None if confirmation else futile(s, look.threshold, protocol.futility_confidence)
    if high is not None:
        return Decision.REJECTED, [
            f"Futile: {look.speed}; even the upper end of its {protocol.futility_confidence:.0%} "
            f"interval ({_x(high)}) is below the threshold, so more starts are not expected "
            "to qualify it."
        ]
    lines = _open_interval(verdict, s, look.threshold, look.speed, confirmation=confirmation)
    lines += [
        f"Inconclusive: {look.prompt_text(p)}; its interval straddles it, so more starts would "
        "show whether that regression is real."
        for p in look.straddle
    ]
    lines += [f"Inconclusive at a decisive workload cell: {c.detail}." for c in look.cells_open]
    return Decision.INCONCLUSIVE, lines


def judge(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    auto_promote: dict[CandidateClass, bool],
    quality: dict[str, list[Sample]] | None = None,
    *,
    confirmation: bool = False,
) -> CandidateVerdict:
    """The verdict on one candidate: gates first, then the statistics (``core.selector``'s
    rules, in order)."""
    may_promote = run.candidate_class is not None and auto_promote.get(run.candidate_class, False)
    may_promote = may_promote and may_promote_alone(run, thresholds)
    verdict = CandidateVerdict(
        candidate=run.candidate,
        decision=Decision.REJECTED,
        reasons=[],
        peak_memory_gb=run.peak_memory_gb,
        auto_promote=may_promote,
    )
    if _refused_unmeasured(baseline, run, thresholds, verdict):
        _gated_before_timing(baseline, run, thresholds, quality, protocol, verdict)
        return verdict
    pending = awaiting_gates(run)
    if not pending:
        verdict.gates = run_gates(
            baseline,
            run,
            thresholds,
            quality,
            protocol.quality_suite,
            draws=resampling_for(protocol, run.candidate),
        )
    hard = [f"The {g.gate} gate failed: {g.detail}." for g in verdict.gates if not g.passed]
    look = _look(baseline, run, thresholds, protocol, verdict)
    if look is None:
        verdict.reasons.extend([*hard, _nothing_to_compare(baseline)])
        return verdict
    if look.summary.missing_prompts:
        hard.append(
            "No successful measurement of prompt(s) "
            + ", ".join(look.summary.missing_prompts)
            + " that the baseline measured."
        )
    rejected = _rejected(look, hard)
    if rejected is not None:
        decision, lines = Decision.REJECTED, rejected
    else:
        decision, lines = _qualified(
            look, run, may_promote, confirmation=confirmation
        ) or _left_open(look, verdict, protocol, confirmation=confirmation)
    if pending:
        decision, lines = _without_gates(decision, lines, verdict, look.speed)
    verdict.decision = decision
    verdict.reasons.extend(lines)
    verdict.reasons.extend(_verdict_notes(verdict.cells, look.summary, confirmation=confirmation))
    return verdict


def _ttft(samples: Sequence[Sample]) -> tuple[float | None, float | None]:
    values = sorted(s.ttft_s for s in samples if s.ttft_s is not None and s.ttft_s >= 0)
    if not values:
        return None, None
    return quantile(values, 0.5), quantile(values, 0.99)


def _futile_cell(
    b_logs: Sequence[float], c_logs: Sequence[float], protocol: MeasureProtocol
) -> float | None:
    """The upper end of a cell's aggregate-throughput interval at the futility confidence, or
    None without one (a non-binding stop: it can only reject)."""
    if protocol.futility_confidence is None:
        return None
    prior = learned_prior(protocol)
    return log_interval(b_logs, c_logs, protocol.futility_confidence, prior, guarded=False)[2]


def _measured(samples: Sequence[Sample], key: tuple[str, int]) -> list[Sample]:
    return [s for s in samples if s.phase == "measure" and s.error is None and in_cell(s, key)]


def judge_cells(
    baseline: CandidateRun, run: CandidateRun, protocol: MeasureProtocol, head: Headline
) -> list[CellVerdict]:
    """Figures of every workload cell measured by the baseline, in the workload's order.

    The blocking figure of a cell is the aggregate output tok/s ratio (what a user with that
    many requests in flight gets), or the decode speedup where no wall span is known: its whole
    interval below the floor is "regressed", an interval straddling it "unclear". A cell the
    baseline measured and the candidate did not is "unmeasured". The headline cell is listed
    with ``headline`` set; its decision is the headline rules', not this one.
    """
    cells = list(protocol.workload)
    keys = [(c.request_class, c.concurrency) for c in cells]
    if head.cell is not None and head.cell not in keys:
        cells.insert(0, WorkloadCell(request_class=head.cell[0], concurrency=head.cell[1]))  # type: ignore[arg-type]
    out: list[CellVerdict] = []
    for c in cells:
        key = (c.request_class, c.concurrency)
        ok = _measured(baseline.samples, key)
        if ok:
            out.append(_judge_cell(c, ok, _measured(run.samples, key), protocol, head))
    return out


def _judge_cell(
    c: WorkloadCell,
    ok: list[Sample],
    mine: list[Sample],
    protocol: MeasureProtocol,
    head: Headline,
) -> CellVerdict:
    """One workload cell's figures and status (``judge_cells``)."""
    key = (c.request_class, c.concurrency)
    cv = CellVerdict(
        request_class=c.request_class,
        concurrency=c.concurrency,
        role=c.role,
        headline=key == head.cell,
        baseline_requests=len(ok),
        candidate_requests=len(mine),
    )
    words = cell_words(*key)
    cv.baseline_ttft_p50_s, cv.baseline_ttft_p99_s = _ttft(ok)
    cv.candidate_ttft_p50_s, cv.candidate_ttft_p99_s = _ttft(mine)
    seed = derive_seed(head.seed, f"{key[0]}@{key[1]}")
    summary = (
        head.summary
        if key == head.cell
        else speedup_summary(ok, mine, SummaryOptions.of(protocol, seed, head.level))
    )
    if summary is None or summary.missing_prompts:
        cv.status = "unmeasured"
        cv.detail = f"at {words} the candidate has no successful measurement of every prompt"
        return cv
    cv.baseline_decode_tps = summary.baseline_tps
    cv.candidate_decode_tps = summary.candidate_tps
    cv.decode_speedup, cv.decode_ci_low, cv.decode_ci_high = (
        summary.estimate,
        summary.ci_low,
        summary.ci_high,
    )
    base_out = output_tps_by_start(ok, c.concurrency)
    cand_out = output_tps_by_start(mine, c.concurrency)
    futile_high = None
    if base_out and cand_out:
        b_logs = [math.log(v) for v in base_out.values()]
        c_logs = [math.log(v) for v in cand_out.values()]
        # workload.aggregate_tps's figure, from the per-start values computed above
        cv.baseline_output_tps = geometric_mean(list(base_out.values()))
        cv.candidate_output_tps = geometric_mean(list(cand_out.values()))
        cv.output_ratio, cv.output_ci_low, cv.output_ci_high = log_interval(
            b_logs, c_logs, head.level, learned_prior(protocol)
        )
        est, low, high = cv.output_ratio, cv.output_ci_low, cv.output_ci_high
        what = "aggregate output tok/s"
        futile_high = _futile_cell(b_logs, c_logs, protocol)
    else:
        est, low, high = cv.decode_speedup, cv.decode_ci_low, cv.decode_ci_high
        what = "decode tok/s"
    ttft = (
        f"; TTFT p50 {cv.candidate_ttft_p50_s:.3f} s vs {cv.baseline_ttft_p50_s:.3f} s"
        if cv.candidate_ttft_p50_s is not None and cv.baseline_ttft_p50_s is not None
        else ""
    )
    cv.detail = (
        f"at {words} the candidate gives {est:.2f}x the baseline's {what} "
        f"(interval {low:.2f}x to {high:.2f}x; decode {summary.estimate:.2f}x{ttft})"
    )
    _cell_status(cv, low, high, futile_high, protocol, head.floor)
    return cv


def _cell_status(
    cv: CellVerdict,
    low: float,
    high: float,
    futile_high: float | None,
    protocol: MeasureProtocol,
    floor: float,
) -> None:
    """Regressed (the whole interval below ``floor``, or futile), unclear (straddling it), or
    left as measured; the detail says which."""
    if high < floor:
        cv.status = "regressed"
        cv.detail += f", below the {_x(floor)} the tolerance allows"
    elif low < floor and futile_high is not None and futile_high < floor:
        cv.status = "regressed"
        cv.detail += (
            f"; even the upper end of its {protocol.futility_confidence:.0%} interval "
            f"({_x(futile_high)}) is below the {_x(floor)} the tolerance allows (futile)"
        )
    elif low < floor:
        cv.status = "unclear"
        cv.detail += f"; the interval straddles the {_x(floor)} the tolerance allows"


def _fill_figures(verdict: CandidateVerdict, s: SpeedupSummary) -> None:
    verdict.noise_floor = s.noise_floor
    verdict.noise_floor_assumed = s.noise_floor_assumed
    verdict.interval_level = s.level
    verdict.per_prompt = s.per_prompt
    verdict.speedup_estimate = s.estimate
    verdict.ci_low = s.ci_low
    verdict.ci_high = s.ci_high
    verdict.worst_prompt = s.worst_prompt
    verdict.worst_speedup = s.worst_speedup
    verdict.mean_speedup = s.mean
    verdict.median_speedup = s.median
    verdict.token_weighted_speedup = s.token_weighted
    verdict.baseline_tps = s.baseline_tps
    verdict.candidate_tps = s.candidate_tps
