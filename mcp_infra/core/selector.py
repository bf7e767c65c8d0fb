"""The decision: which candidate, if any, replaces the baseline.

A pure, deterministic function of the measured runs, the frozen thresholds and the protocol. The
live cycle calls it after the experiments; ``evidence verify`` calls it again on a sealed bundle
and must reach the same verdict, so nothing here reads a clock, a file or a salted hash.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    CandidateVerdict,
    Decision,
    EffectiveThresholds,
    GateResult,
    Protocol,
    Sample,
    Semantics,
    Verdict,
)
from mcp_infra.core.gates import compare_greedy, lossy_agreement, quality_gate, smoke_gate
from mcp_infra.core.stats import (
    SpeedupSummary,
    baseline_drift,
    derive_seed,
    error_count,
    repeats_to_decide,
    speedup_summary,
)

# The most repeats a protocol may ask for (contracts.Protocol.repeats, le=50).
MAX_REPEATS = 50


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
    if run.semantics == Semantics.LOSSLESS:
        gates.append(compare_greedy(baseline.greedy, run.greedy))
    else:
        gates.append(
            lossy_agreement(baseline.greedy, run.greedy, thresholds.lossy_min_identical_fraction)
        )
        outputs = _quality_outputs(run, quality)
        if outputs is not None or quality_suite is not None:
            gates.append(quality_gate(outputs or []))
    gates.append(smoke_gate(_smoke_outputs(baseline), _smoke_outputs(run)))
    gates.append(_memory_gate(run, thresholds.max_peak_memory_gb))
    return gates


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


def judge(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: Protocol,
    auto_promote: dict[CandidateClass, bool],
    quality: dict[str, list[Sample]] | None = None,
) -> CandidateVerdict:
    """The verdict on one candidate: gates first, then the statistics."""
    may_promote = run.candidate_class is not None and auto_promote.get(run.candidate_class, False)
    verdict = CandidateVerdict(
        candidate=run.candidate,
        decision=Decision.REJECTED,
        reasons=[],
        peak_memory_gb=run.peak_memory_gb,
        auto_promote=may_promote,
    )
    if not run.started:
        why = run.start_error or "no error was reported"
        verdict.reasons.append(f"The candidate did not start: {why}.")
        return verdict

    failed, total = error_count(run.samples)
    if total == 0:
        verdict.reasons.append("The candidate has no measured requests.")
        return verdict
    rate = failed / total
    if rate > thresholds.max_error_rate:
        first = next(s.error for s in run.samples if s.phase == "measure" and s.error)
        verdict.reasons.append(
            f"{failed} of {total} measured requests failed ({rate:.0%}), above the "
            f"{thresholds.max_error_rate:.0%} allowed; first error: {first}."
        )
        return verdict

    verdict.gates = run_gates(baseline, run, thresholds, quality, protocol.quality_suite)
    hard_failures = [
        f"The {g.gate} gate failed: {g.detail}." for g in verdict.gates if not g.passed
    ]

    summary = speedup_summary(
        baseline.samples,
        run.samples,
        confidence=protocol.confidence,
        resamples=protocol.bootstrap_resamples,
        seed=derive_seed(protocol.seed, run.candidate),
    )
    if summary is None:
        if not any(s.phase == "measure" and s.error is None for s in baseline.samples):
            hard_failures.append("The baseline has no successful measurement to compare with.")
        else:
            hard_failures.append("No prompt was measured successfully on both sides.")
        verdict.reasons.extend(hard_failures)
        return verdict
    _fill_figures(verdict, summary)
    if summary.missing_prompts:
        hard_failures.append(
            "No successful measurement of prompt(s) "
            + ", ".join(summary.missing_prompts)
            + " that the baseline measured."
        )

    threshold = 1 + thresholds.min_speedup_pct / 100
    floor = 1 - thresholds.worst_prompt_tolerance_pct / 100
    level = f"{summary.confidence:.0%}"
    speed = (
        f"speedup {_x(summary.estimate)} ({level} interval {_x(summary.ci_low)} to "
        f"{_x(summary.ci_high)}) against the required {_x(threshold)}"
    )
    regress = summary.worst_speedup < floor
    regress_text = (
        f"prompt {summary.worst_prompt} ran at {_x(summary.worst_speedup)} the baseline, below "
        f"the {_x(floor)} the worst-prompt tolerance allows"
    )

    if hard_failures:
        verdict.reasons.extend(hard_failures)
        verdict.reasons.append(f"Measured {speed}.")
        return verdict
    if summary.ci_high < threshold:
        verdict.reasons.append(f"Too slow: {speed}; the whole interval is below the threshold.")
        if regress:
            verdict.reasons.append(f"Also, {regress_text}.")
        return verdict
    if summary.ci_low >= threshold and not regress:
        if summary.estimate <= 1.0:
            # Only reachable when the threshold is at or below 1: no measured gain is no reason
            # to switch, and identical measurements must never qualify.
            verdict.reasons.append(f"No gain: {speed}; the estimate is not above 1.000x.")
            return verdict
        verdict.decision = Decision.QUALIFIED
        verdict.reasons.append(
            f"Qualified: {speed}; worst prompt {summary.worst_prompt} at "
            f"{_x(summary.worst_speedup)}."
        )
        if not may_promote:
            klass = run.candidate_class.value if run.candidate_class else "unknown"
            verdict.reasons.append(
                f"Qualified, awaiting approval: class {klass} may not auto-promote under this "
                "policy."
            )
        return verdict

    verdict.decision = Decision.INCONCLUSIVE
    if summary.ci_low < threshold:
        verdict.repeats_to_decide = repeats_to_decide(
            summary.estimate, summary.ci_low, summary.ci_high, threshold, summary.repeats
        )
        if verdict.repeats_to_decide is None:
            more = "more repeats might decide it, but how many cannot be estimated"
        else:
            more = (
                f"about {verdict.repeats_to_decide} repeats per prompt (now {summary.repeats}) "
                "would likely decide it"
            )
            if verdict.repeats_to_decide > MAX_REPEATS:
                more += f", more than the protocol allows ({MAX_REPEATS})"
        verdict.reasons.append(f"Inconclusive: {speed}; the interval spans the threshold; {more}.")
    if regress:
        verdict.reasons.append(
            f"Inconclusive: {regress_text}; more repeats would show whether that regression is "
            "real."
        )
    return verdict


def _fill_figures(verdict: CandidateVerdict, s: SpeedupSummary) -> None:
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


def _preference(run: CandidateRun) -> tuple:
    """Cheaper first: knob cost, then lower peak memory (unknown last), then the id."""
    memory = run.peak_memory_gb if run.peak_memory_gb is not None else float("inf")
    return (run.knobs.cost_key(), memory, run.candidate)


def select(
    baseline: CandidateRun,
    runs: list[CandidateRun],
    thresholds: EffectiveThresholds,
    protocol: Protocol,
    auto_promote: dict[CandidateClass, bool],
    quality: dict[str, list[Sample]] | None = None,
) -> Verdict:
    """Judge every candidate and pick the one to promote, or keep the baseline.

    Among qualified candidates whose class may auto-promote, the highest estimate wins; any
    within ``tie_tolerance_pct`` of it counts as tied, and of tied ones the cheaper is preferred
    (a smaller gain is not worth a costlier setup). Runs carrying the baseline's own id are not
    candidates and are skipped. ``quality`` maps a candidate id to its quality-suite samples
    (``phase == "quality"``); None means no quality suite was run. Each candidate's bootstrap
    seed is ``derive_seed(protocol.seed, candidate id)``, so a verdict does not depend on the
    order of ``runs``.
    """
    candidates = [r for r in runs if r.candidate != baseline.candidate]
    verdicts = [judge(baseline, r, thresholds, protocol, auto_promote, quality) for r in candidates]
    drift = baseline_drift(baseline.samples) if protocol.drift_check else None
    if drift is not None and abs(drift - 1) * 100 > protocol.drift_tolerance_pct:
        for v in verdicts:  # the machine changed under the measurement: nothing can qualify
            if v.decision == Decision.QUALIFIED:
                v.decision = Decision.INCONCLUSIVE
                v.reasons.append(
                    f"Inconclusive: the baseline re-measured after the experiments ran at "
                    f"{_x(drift)} its first speed, beyond the {protocol.drift_tolerance_pct:g}% "
                    "drift tolerance; the comparison is not trustworthy."
                )
    qualified = [
        (v, r)
        for v, r in zip(verdicts, candidates, strict=True)
        if v.decision == Decision.QUALIFIED
    ]
    eligible = [(v, r) for v, r in qualified if v.auto_promote]
    if not eligible:
        return Verdict(candidates=verdicts, selected=None, reason=_no_selection(verdicts),
                       baseline_drift=drift)

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
                f"but {chosen.candidate} is cheaper or sorts first."
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
        reason += f"; preferred over {len(tied) - 1} tied candidate(s) as the cheaper"
    return Verdict(candidates=verdicts, selected=chosen.candidate, reason=reason,
                   baseline_drift=drift)


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
