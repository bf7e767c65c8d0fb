"""The decision: which candidate, if any, replaces the baseline.

A pure, deterministic function of the measured runs, the frozen thresholds and the protocol. The
live cycle calls it after the experiments; ``evidence verify`` calls it again on a sealed bundle
and must reach the same verdict, so nothing here reads a clock, a file or a salted hash.

The rules, in order (statistics in ``mcp_infra.stats``; intervals see the server starts):

1. Did not start, no measurement, too many errors, a failed gate, a missing prompt: rejected.
2. The headline interval (one short request at a time, else the first decisive workload cell)
   wholly below 1.000x: rejected as a regression; wholly below the threshold: rejected as too
   slow. A prompt whose own interval is wholly below the worst-prompt floor (1 - tolerance):
   rejected. A decisive workload cell whose interval (aggregate output tok/s, candidate over
   baseline) is wholly below that floor, or that the candidate did not measure: rejected, with
   the cell in words.
3. Qualified only if the lower bound clears both the threshold and the A/A noise floor (how far
   the baseline's own starts differ), no prompt's interval straddles the floor, no decisive cell's
   interval straddles it, and the estimate is above 1.000x. The lower bound is a one-sided
   (1 + confidence)/2 bound with the error rate spent over the looks of early stopping, so a
   candidate no faster than the threshold qualifies at most (1 - confidence)/2 of the time, all
   looks together (2% at the default 96%).
4. Anything else is inconclusive, with the reason: more starts may decide it.
5. With ``drift_check`` on, missing or failed drift samples, or drift beyond tolerance, make a
   qualified candidate inconclusive (the check fails closed).
Reported workload cells are shown in the reasons and in ``cells`` but never block.

A *confirmation* (``confirmation=True``: the winner's held-out check) uses the same rules with
the threshold alone as the bar. The A/A noise floor was cleared in selection, on the baseline's
measured starts; the check runs one fresh start per side, so its interval already carries the
assumed start-to-start spread on both sides, and clearing a floor computed from that same
spread again would count it twice (with one start each, a true 1.3x gain then failed the demo's
check). It can only remove a selected candidate, never add one, so the selection's error rate
still bounds the cycle's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    CandidateVerdict,
    CellVerdict,
    Decision,
    EffectiveThresholds,
    GateResult,
    MeasureProtocol,
    PromptStat,
    Sample,
    Semantics,
    Verdict,
    WorkloadCell,
)
from mcp_infra.core.gates import (
    compare_greedy,
    lossy_agreement,
    quality_gate,
    smoke_gate,
    split_agreement,
)
from mcp_infra.core.intervals import (
    ASSUMED_START_NOISE,
    Spread,
    geometric_mean,
    log_interval,
    look_level,
    quantile,
)
from mcp_infra.core.stats import (
    SpeedupSummary,
    SummaryOptions,
    baseline_drift,
    derive_seed,
    error_count,
    in_cell,
    repeats_to_decide,
    speedup_summary,
)
from mcp_infra.core.workload import output_tps_by_start

# The most repeats a protocol may ask for (contracts.MeasureProtocol.repeats, le=50).
MAX_REPEATS = 50

DECISION_METHOD = 6
"""The decision method recorded in each verdict (``Verdict.method``): raised whenever the same
samples could get another verdict, so ``evidence verify`` recomputes a verdict only under the
method that reached it (docs/statistics.md says what each number changed)."""


def _x(value: float) -> str:
    return f"{value:.3f}x"


def run_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    quality: dict[str, list[Sample]] | None,
    quality_suite: str | None = None,
) -> list[GateResult]:
    """Every gate that applies to ``run``, in a fixed order.

    A lossy candidate gets the quality gate when a quality suite was run: the protocol names
    one, ``quality`` was given, or the run carries ``quality`` samples. A suite that ran but left
    no output for the candidate fails the gate rather than being skipped.
    """
    gates: list[GateResult] = []
    identity = runtime_identity(baseline, run)
    if run.semantics == Semantics.LOSSLESS:
        gates.append(compare_greedy(baseline.greedy, run.greedy))
    elif identity is not None and identity.passed:
        gates.append(identity)  # a runtime upgrade whose greedy tokens all match: lossless
    else:
        agreement = (
            split_agreement(  # a split model: the lossless comparison said, judged as lossy
                baseline.greedy,
                run.greedy,
                thresholds.lossy_min_identical_fraction,
                run.knobs.ranks,
            )
            if run.knobs.ranks
            else lossy_agreement(
                baseline.greedy, run.greedy, thresholds.lossy_min_identical_fraction
            )
        )
        if identity is not None:  # where the runtime upgrade parted from the baseline
            agreement = agreement.model_copy(
                update={"detail": f"{agreement.detail}; not lossless: {identity.detail}"}
            )
        gates.append(agreement)
        outputs = _quality_outputs(run, quality)
        if outputs is not None or quality_suite is not None:
            gates.append(quality_gate(outputs or []))
    gates.append(smoke_gate(_smoke_outputs(baseline), _smoke_outputs(run)))
    gates.append(_memory_gate(run, thresholds.max_peak_memory_gb))
    return gates


def runtime_identity(baseline: CandidateRun, run: CandidateRun) -> GateResult | None:
    """A runtime upgrade declared lossy (so measured with the quality suite) is lossless after
    all when its greedy tokens all equal the baseline's: then the token-identity gate judges it
    and the quality suite is not needed; otherwise it is judged as lossy, its first divergence
    reported. None for every other candidate."""
    if run.candidate_class != CandidateClass.RUNTIME_UPGRADE or run.semantics != Semantics.LOSSY:
        return None
    return compare_greedy(baseline.greedy, run.greedy)


def failed_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
) -> list[GateResult]:
    """The gates ``run`` already fails. A gate (token identity, agreement, quality, smoke,
    memory) judges outputs that do not get better with more starts, so early stopping may
    reject on it after the first round, before any speed decision is due."""
    if not run.started or not run.greedy or not baseline.greedy:
        return []
    return [
        g
        for g in run_gates(baseline, run, thresholds, None, protocol.quality_suite)
        if not g.passed
    ]


def _quality_outputs(
    run: CandidateRun, quality: dict[str, list[Sample]] | None
) -> list[Sample] | None:
    """The run's quality-suite samples: ``quality[candidate]`` if given, else the run's own.

    Returns None when there is no sign that a quality suite ran.
    """
    if quality is not None and run.candidate in quality:
        return list(quality[run.candidate])
    own = [s for s in run.samples if s.phase == "quality"]
    if own or quality is not None:
        return own
    return None


def _smoke_outputs(run: CandidateRun) -> list[Sample]:
    """Greedy outputs when there are any, else the measured ones (same prompts, temperature 0)."""
    return list(run.greedy) or [s for s in run.samples if s.phase == "measure"]


def _memory_gate(run: CandidateRun, cap_gb: float) -> GateResult:
    if run.peak_memory_gb is None:
        return GateResult(
            gate="memory",
            passed=True,
            detail=f"peak memory unknown; the {cap_gb:g} GB cap could not be checked",
        )
    passed = run.peak_memory_gb <= cap_gb
    verb = "within" if passed else "above"
    return GateResult(
        gate="memory",
        passed=passed,
        detail=f"peak memory {run.peak_memory_gb:.2f} GB is {verb} the {cap_gb:g} GB cap",
    )


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
    """The verdict on one candidate: gates first, then the statistics (module docstring)."""
    may_promote = run.candidate_class is not None and auto_promote.get(run.candidate_class, False)
    verdict = CandidateVerdict(
        candidate=run.candidate,
        decision=Decision.REJECTED,
        reasons=[],
        peak_memory_gb=run.peak_memory_gb,
        auto_promote=may_promote,
    )
    if _refused_unmeasured(baseline, run, thresholds, verdict):
        return verdict

    verdict.gates = run_gates(baseline, run, thresholds, quality, protocol.quality_suite)
    hard_failures = [
        f"The {g.gate} gate failed: {g.detail}." for g in verdict.gates if not g.passed
    ]

    level = look_level(
        protocol.confidence, verdict.starts_used, protocol.min_starts, protocol.max_starts
    )
    head = headline_cell(baseline, run, protocol)
    seed = derive_seed(protocol.seed, run.candidate)
    summary = speedup_summary(
        baseline.samples, run.samples, SummaryOptions.of(protocol, seed, level), cell=head
    )
    if summary is None:
        hard_failures.append(_nothing_to_compare(baseline))
        verdict.reasons.extend(hard_failures)
        return verdict
    _fill_figures(verdict, summary)
    if summary.missing_prompts:
        hard_failures.append(
            "No successful measurement of prompt(s) "
            + ", ".join(summary.missing_prompts)
            + " that the baseline measured."
        )
    floor = 1 - thresholds.worst_prompt_tolerance_pct / 100
    verdict.cells = judge_cells(baseline, run, protocol, summary, head, floor, seed, level)

    threshold = 1 + thresholds.min_speedup_pct / 100
    shown_level = f"{summary.confidence:.0%}"
    adjusted = (
        f", {summary.level:.1%} at this look of early stopping"
        if summary.level != summary.confidence
        else ""
    )
    speed = (
        f"speedup {_x(summary.estimate)} ({shown_level} interval{adjusted} {_x(summary.ci_low)} to "
        f"{_x(summary.ci_high)}, {summary.baseline_starts} baseline and "
        f"{summary.candidate_starts} candidate start(s)"
        + ("" if summary.spread == "this cycle" else f"; start spread {summary.spread}")
        + f") against the required {_x(threshold)}"
    )
    below = [p for p in summary.per_prompt if (p.ci_high or p.speedup) < floor]
    straddle = [
        p for p in summary.per_prompt if (p.ci_low or p.speedup) < floor <= (p.ci_high or p.speedup)
    ]

    def prompt_text(p: PromptStat) -> str:
        return (
            f"prompt {p.prompt_id} ran at {_x(p.speedup)} the baseline (interval "
            f"{_x(p.ci_low or p.speedup)} to {_x(p.ci_high or p.speedup)}) against the "
            f"{_x(floor)} the worst-prompt tolerance allows"
        )

    cells_lost, cells_open = _lost_and_open(verdict.cells)
    notes = _verdict_notes(verdict.cells, summary, confirmation=confirmation)

    def finish(decision: Decision, *lines: str) -> CandidateVerdict:
        verdict.decision = decision
        verdict.reasons.extend(lines)
        verdict.reasons.extend(notes)
        return verdict

    if hard_failures:
        return finish(Decision.REJECTED, *hard_failures, f"Measured {speed}.")
    also = [f"Also, {prompt_text(p)}." for p in below]
    if summary.ci_high < 1.0:
        return finish(
            Decision.REJECTED, f"Regression: {speed}; the whole interval is below 1.000x.", *also
        )
    if summary.ci_high < threshold:
        return finish(
            Decision.REJECTED,
            f"Too slow: {speed}; the whole interval is below the threshold.",
            *also,
        )
    if below:
        return finish(
            Decision.REJECTED,
            *[
                f"Regressing prompt: {prompt_text(p)}; its whole interval is below it."
                for p in below
            ],
            f"Measured {speed}.",
        )
    if cells_lost:
        return finish(
            Decision.REJECTED,
            *[f"Lost at a decisive workload cell: {c.detail}." for c in cells_lost],
            f"Measured {speed}.",
        )

    bar = threshold if confirmation else max(threshold, summary.noise_floor)
    if summary.ci_low >= bar and not straddle and not cells_open:
        if summary.estimate <= 1.0:
            # Only reachable when the threshold is at or below 1: no measured gain is no reason
            # to switch, and identical measurements must never qualify.
            return finish(Decision.REJECTED, f"No gain: {speed}; the estimate is not above 1.000x.")
        floor_words = "" if confirmation else f"; A/A noise floor {_x(summary.noise_floor)}"
        lines = [
            f"Qualified: {speed}{floor_words}; worst prompt "
            f"{summary.worst_prompt} at {_x(summary.worst_speedup)}."
        ]
        if not may_promote:
            klass = run.candidate_class.value if run.candidate_class else "unknown"
            lines.append(
                f"Qualified, awaiting approval: class {klass} may not auto-promote under this "
                "policy."
            )
        return finish(Decision.QUALIFIED, *lines)

    high = None if confirmation else futile(summary, threshold, protocol.futility_confidence)
    if high is not None:
        return finish(
            Decision.REJECTED,
            f"Futile: {speed}; even the upper end of its {protocol.futility_confidence:.0%} "
            f"interval ({_x(high)}) is below the threshold, so more starts are not expected "
            "to qualify it.",
        )
    lines = _open_interval(verdict, summary, threshold, speed, confirmation=confirmation)
    lines += [
        f"Inconclusive: {prompt_text(p)}; its interval straddles it, so more starts would show "
        "whether that regression is real."
        for p in straddle
    ]
    lines += [f"Inconclusive at a decisive workload cell: {c.detail}." for c in cells_open]
    return finish(Decision.INCONCLUSIVE, *lines)


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


def judge_cells(
    baseline: CandidateRun,
    run: CandidateRun,
    protocol: MeasureProtocol,
    head_summary: SpeedupSummary,
    head: tuple[str, int] | None,
    floor: float,
    seed: int,
    level: float,
) -> list[CellVerdict]:
    """Figures of every workload cell measured by the baseline, in the workload's order.

    The blocking figure of a cell is the aggregate output tok/s ratio (what a user with that
    many requests in flight gets), or the decode speedup where no wall span is known: its whole
    interval below ``floor`` is "regressed", an interval straddling it "unclear". A cell the
    baseline measured and the candidate did not is "unmeasured". The headline cell is listed
    with ``headline`` set; its decision is the headline rules', not this one.
    """
    cells = list(protocol.workload)
    keys = [(c.request_class, c.concurrency) for c in cells]
    if head is not None and head not in keys:
        cells.insert(0, WorkloadCell(request_class=head[0], concurrency=head[1]))  # type: ignore[arg-type]
    out: list[CellVerdict] = []
    for c in cells:
        key = (c.request_class, c.concurrency)
        ok = [
            s
            for s in baseline.samples
            if s.phase == "measure" and s.error is None and in_cell(s, key)
        ]
        if not ok:
            continue
        mine = [
            s for s in run.samples if s.phase == "measure" and s.error is None and in_cell(s, key)
        ]
        cv = CellVerdict(
            request_class=c.request_class,
            concurrency=c.concurrency,
            role=c.role,
            headline=key == head,
            baseline_requests=len(ok),
            candidate_requests=len(mine),
        )
        words = cell_words(*key)
        cv.baseline_ttft_p50_s, cv.baseline_ttft_p99_s = _ttft(ok)
        cv.candidate_ttft_p50_s, cv.candidate_ttft_p99_s = _ttft(mine)
        summary = (
            head_summary
            if key == head
            else speedup_summary(
                ok,
                mine,
                SummaryOptions.of(protocol, derive_seed(seed, f"{key[0]}@{key[1]}"), level),
            )
        )
        if summary is None or summary.missing_prompts:
            cv.status = "unmeasured"
            cv.detail = f"at {words} the candidate has no successful measurement of every prompt"
            out.append(cv)
            continue
        cv.baseline_decode_tps = summary.baseline_tps
        cv.candidate_decode_tps = summary.candidate_tps
        cv.decode_speedup, cv.decode_ci_low, cv.decode_ci_high = (
            summary.estimate,
            summary.ci_low,
            summary.ci_high,
        )
        base_out = output_tps_by_start(ok, c.concurrency)
        cand_out = output_tps_by_start(mine, c.concurrency)
        if base_out and cand_out:
            b_logs = [math.log(v) for v in base_out.values()]
            c_logs = [math.log(v) for v in cand_out.values()]
            # workload.aggregate_tps's figure, from the per-start values computed above
            cv.baseline_output_tps = geometric_mean(list(base_out.values()))
            cv.candidate_output_tps = geometric_mean(list(cand_out.values()))
            cv.output_ratio, cv.output_ci_low, cv.output_ci_high = log_interval(
                b_logs, c_logs, level, learned_prior(protocol)
            )
            est, low, high = cv.output_ratio, cv.output_ci_low, cv.output_ci_high
            what = "aggregate output tok/s"
        else:
            est, low, high = cv.decode_speedup, cv.decode_ci_low, cv.decode_ci_high
            what = "decode tok/s"
        cv.detail = (
            f"at {words} the candidate gives {est:.2f}x the baseline's {what} "
            f"(interval {low:.2f}x to {high:.2f}x; decode {summary.estimate:.2f}x"
            + (
                f"; TTFT p50 {cv.candidate_ttft_p50_s:.3f} s vs {cv.baseline_ttft_p50_s:.3f} s"
                if cv.candidate_ttft_p50_s is not None and cv.baseline_ttft_p50_s is not None
                else ""
            )
            + ")"
        )
        futile = _futile_cell(b_logs, c_logs, protocol) if base_out and cand_out else None
        if high < floor:
            cv.status = "regressed"
            cv.detail += f", below the {_x(floor)} the tolerance allows"
        elif low < floor and futile is not None and futile < floor:
            cv.status = "regressed"
            cv.detail += (
                f"; even the upper end of its {protocol.futility_confidence:.0%} interval "
                f"({_x(futile)}) is below the {_x(floor)} the tolerance allows (futile)"
            )
        elif low < floor:
            cv.status = "unclear"
            cv.detail += f"; the interval straddles the {_x(floor)} the tolerance allows"
        out.append(cv)
    return out


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


def _preference(run: CandidateRun) -> tuple[int, tuple[int, int], float, str]:
    """Preferred first: lossless before lossy, then knob cost, then lower peak memory (unknown
    last), then the id."""
    memory = run.peak_memory_gb if run.peak_memory_gb is not None else float("inf")
    lossy = 0 if run.semantics == Semantics.LOSSLESS else 1
    return (lossy, run.knobs.cost_key(), memory, run.candidate)


def select(
    baseline: CandidateRun,
    runs: list[CandidateRun],
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    auto_promote: dict[CandidateClass, bool],
    quality: dict[str, list[Sample]] | None = None,
    *,
    interim: bool = False,
    confirmation: bool = False,
) -> Verdict:
    """Judge every candidate and pick the one to promote, or keep the baseline.

    Among qualified candidates whose class may auto-promote, the highest estimate wins; any
    within ``tie_tolerance_pct`` of it counts as tied, and of tied ones the lossless before the
    lossy, then the cheaper knobs, are preferred (a smaller gain is not worth a costlier or
    output-changing setup). Runs carrying the baseline's own id are not candidates and are
    skipped. ``quality`` maps a candidate id to its quality-suite samples (``phase ==
    "quality"``); None means no quality suite was run. Each candidate's bootstrap seed is
    ``derive_seed(protocol.seed, candidate id)``, so a verdict does not depend on the order of
    ``runs``.

    The drift check fails closed: with ``protocol.drift_check`` on, missing or failed drift
    samples make every qualified candidate inconclusive. ``interim=True`` is for the calls
    between measurement rounds (early stopping), before the baseline's final re-measurement: the
    drift check is then left to the final call, and each qualified verdict says so.
    ``confirmation=True`` judges a selected winner again on held-out prompts (module docstring).
    """
    candidates = [r for r in runs if r.candidate != baseline.candidate]
    verdicts = [
        judge(
            baseline,
            r,
            thresholds,
            protocol,
            auto_promote,
            quality,
            confirmation=confirmation,
        )
        for r in candidates
    ]
    checked = protocol.drift_check
    drift = baseline_drift(baseline.samples) if checked else None
    problem = None if interim or not checked else _drift_problem(baseline, drift, protocol)
    for v in verdicts:
        if v.decision != Decision.QUALIFIED or not checked:
            continue
        if interim:
            v.reasons.append("Drift check pending: it runs after the last measurement round.")
        elif problem is not None:  # the machine may have changed under the measurement
            v.decision = Decision.INCONCLUSIVE
            v.reasons.append(f"Inconclusive: {problem}{DRIFT_OPENED}")
    qualified = [
        (v, r)
        for v, r in zip(verdicts, candidates, strict=True)
        if v.decision == Decision.QUALIFIED
    ]
    eligible = [(v, r) for v, r in qualified if v.auto_promote]
    if not eligible:
        return Verdict(
            candidates=verdicts,
            selected=None,
            reason=_no_selection(verdicts),
            baseline_drift=drift,
            method=DECISION_METHOD,
        )

    best = max(v.speedup_estimate or 0.0 for v, _ in eligible)
    floor = best * (1 - thresholds.tie_tolerance_pct / 100)
    tied = [(v, r) for v, r in eligible if (v.speedup_estimate or 0.0) >= floor]
    chosen, _ = min(tied, key=lambda vr: _preference(vr[1]))
    for v, _ in eligible:
        if v is chosen:
            continue
        if any(v is t for t, _ in tied):
            v.reasons.append(
                f"Not selected: within {thresholds.tie_tolerance_pct:g}% of the best estimate, "
                f"but {chosen.candidate} is preferred (lossless before lossy, then cheaper "
                "knobs, lower memory, the id)."
            )
        else:
            v.reasons.append(
                f"Not selected: {chosen.candidate} is faster "
                f"({_x(chosen.speedup_estimate or 0.0)} vs {_x(v.speedup_estimate or 0.0)})."
            )
    chosen.reasons.append("Selected.")
    reason = (
        f"selected {chosen.candidate}: speedup {_x(chosen.speedup_estimate or 0.0)} "
        f"({protocol.confidence:.0%} interval {_x(chosen.ci_low or 0.0)} to "
        f"{_x(chosen.ci_high or 0.0)})"
    )
    if len(tied) > 1:
        reason += (
            f"; preferred over {len(tied) - 1} tied candidate(s) as lossless before lossy, "
            "then the cheaper"
        )
    return Verdict(
        candidates=verdicts,
        selected=chosen.candidate,
        reason=reason,
        baseline_drift=drift,
        method=DECISION_METHOD,
    )


DRIFT_OPENED = "; the comparison is not trustworthy."
"""How the reason ends that the drift check adds to a candidate it left open (``drift_opened``)."""


def drift_opened(verdict: CandidateVerdict) -> str | None:
    """What the drift check found, for a candidate that qualified but was left open by it;
    None for any other verdict."""
    if verdict.decision != Decision.INCONCLUSIVE:
        return None
    for reason in verdict.reasons:
        if reason.startswith("Inconclusive: ") and reason.endswith(DRIFT_OPENED):
            return reason.removeprefix("Inconclusive: ").removesuffix(DRIFT_OPENED)
    return None


def _drift_problem(
    baseline: CandidateRun, drift: float | None, protocol: MeasureProtocol
) -> str | None:
    """Why the drift check does not pass, or None when it does (the check is on)."""
    again = [s for s in baseline.samples if s.phase == "drift"]
    failed = [s for s in again if s.error is not None]
    if not again:
        return (
            "the drift check is on but the baseline was not re-measured after the "
            "experiments (no drift samples)"
        )
    if failed:
        return (
            f"{len(failed)} of {len(again)} drift re-measurements of the baseline failed "
            f"(first error: {failed[0].error})"
        )
    if drift is None:
        return "no drift re-measurement matches a prompt the baseline measured"
    # One re-measure start differs from the mean of the earlier ones by the start-to-start
    # spread alone: drift counts only where it exceeds the tolerance beyond that noise.
    spread = protocol.learned_spread.sd if protocol.learned_spread else ASSUMED_START_NOISE
    starts = len({s.start for s in baseline.samples if s.phase == "measure"}) or 1
    noise = (
        statistics.NormalDist().inv_cdf(protocol.confidence) * spread * math.sqrt(1 + 1 / starts)
    )
    if abs(math.log(drift)) - noise > math.log(1 + protocol.drift_tolerance_pct / 100):
        return (
            f"the baseline re-measured after the experiments ran at {_x(drift)} its first "
            f"speed, beyond the {protocol.drift_tolerance_pct:g}% drift tolerance and the "
            f"{spread:.1%} start-to-start spread one re-measure carries"
        )
    return None


def _no_selection(verdicts: Sequence[CandidateVerdict]) -> str:
    if not verdicts:
        return "no candidate was measured, baseline kept"
    awaiting = [v.candidate for v in verdicts if v.decision == Decision.QUALIFIED]
    inconclusive = [v.candidate for v in verdicts if v.decision == Decision.INCONCLUSIVE]
    if awaiting:
        return (
            "no candidate may auto-promote; qualified, awaiting approval: "
            + ", ".join(awaiting)
            + "; baseline kept"
        )
    if inconclusive:
        return (
            "no candidate qualified (inconclusive: " + ", ".join(inconclusive) + "), baseline kept"
        )
    return "no candidate qualified, baseline kept"
