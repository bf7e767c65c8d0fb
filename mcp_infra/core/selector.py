"""The decision: which candidate, if any, replaces the baseline.

A pure, deterministic function of the measured runs, the frozen thresholds and the protocol. The
live cycle calls it after the experiments; ``evidence verify`` calls it again on a sealed bundle
and must reach the same verdict, so nothing here reads a clock, a file or a salted hash.

The rules, in order (judged per candidate by ``core.judging``; statistics in ``core.stats``):

1. Did not start, no measurement, too many errors, a failed gate, a missing prompt: rejected.
   A candidate whose gates are not taken yet (a screened plan takes them once its speed
   qualifies it) is judged on speed alone and is never qualified: where speed would qualify
   it, it is inconclusive with ``gates_pending`` until its gate start.
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
spread again would count it twice. It can only remove a selected candidate, never add one, so
the selection's error rate still bounds the cycle's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    CandidateVerdict,
    Decision,
    EffectiveThresholds,
    MeasureProtocol,
    Sample,
    Semantics,
    Verdict,
)
from mcp_infra.core.intervals import ASSUMED_START_NOISE
from mcp_infra.core.judging import judge
from mcp_infra.core.judging import ratio_words as _x
from mcp_infra.core.stats import baseline_drift

TIE_TOLERANCE_PCT = 2.0
"""Qualified candidates within this many percent of the fastest count as tied: a smaller gain is
not worth a costlier or output-changing setup, so the lossless and the cheaper are preferred."""

DECISION_METHOD = 8
"""The decision method recorded in each verdict (``Verdict.method``): raised whenever the same
samples could get another verdict, so ``evidence verify`` recomputes a verdict only under the
method that reached it (docs/statistics.md says what each number changed)."""


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
    within ``TIE_TOLERANCE_PCT`` of it counts as tied, and of tied ones the lossless before the
    lossy, then the cheaper knobs, are preferred (a smaller gain is not worth a costlier or
    output-changing setup). Runs carrying the baseline's own id are not candidates and are
    skipped. ``quality`` maps a candidate id to its quality-suite samples (``phase ==
    "quality"``); None means no quality suite was run. Each candidate's bootstrap seed is
    ``derive_seed(SEED, candidate id)``, so a verdict does not depend on the order of
    ``runs``.

    The drift check fails closed: with ``protocol.drift_check`` on, missing or failed drift
    samples make every qualified candidate inconclusive. ``interim=True`` is for the calls
    between measurement rounds (early stopping), before the baseline's final re-measurement: the
    drift check is then left to the final call, and each qualified verdict says so.
    ``confirmation=True`` judges a selected winner again on held-out prompts (module docstring).
    """
    candidates = [r for r in runs if r.candidate != baseline.candidate]
    verdicts = [
        judge(baseline, r, thresholds, protocol, auto_promote, quality, confirmation=confirmation)
        for r in candidates
    ]
    drift = baseline_drift(baseline.samples) if protocol.drift_check else None
    _apply_drift_check(verdicts, baseline, drift, protocol, interim=interim)
    eligible = [
        (v, r)
        for v, r in zip(verdicts, candidates, strict=True)
        if v.decision == Decision.QUALIFIED and v.auto_promote
    ]
    if not eligible:
        selected, reason = None, _no_selection(verdicts)
    else:
        chosen, reason = _choose(eligible, thresholds, protocol)
        selected = chosen.candidate
        chosen.reasons.append("Selected.")
    return Verdict(
        candidates=verdicts,
        selected=selected,
        reason=reason,
        baseline_drift=drift,
        method=DECISION_METHOD,
    )


def _apply_drift_check(
    verdicts: list[CandidateVerdict],
    baseline: CandidateRun,
    drift: float | None,
    protocol: MeasureProtocol,
    *,
    interim: bool,
) -> None:
    """Rule 5: with the drift check on, a qualified candidate is left open where the drift
    samples are missing, failed or beyond tolerance (fails closed); an interim look says the
    check is pending."""
    if not protocol.drift_check:
        return
    problem = None if interim else _drift_problem(baseline, drift, protocol)
    for v in verdicts:
        if v.decision != Decision.QUALIFIED:
            continue
        if interim:
            v.reasons.append("Drift check pending: it runs after the last measurement round.")
        elif problem is not None:  # the machine may have changed under the measurement
            v.decision = Decision.INCONCLUSIVE
            v.reasons.append(f"Inconclusive: {problem}{DRIFT_OPENED}")


def _choose(
    eligible: list[tuple[CandidateVerdict, CandidateRun]],
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
) -> tuple[CandidateVerdict, str]:
    """The fastest eligible candidate, ties broken by ``_preference``, and the selection's
    reason; every other eligible one says why it was not selected."""
    best = max(v.speedup_estimate or 0.0 for v, _ in eligible)
    floor = best * (1 - TIE_TOLERANCE_PCT / 100)
    tied = [(v, r) for v, r in eligible if (v.speedup_estimate or 0.0) >= floor]
    chosen, _ = min(tied, key=lambda vr: _preference(vr[1]))
    for v, _ in eligible:
        if v is chosen:
            continue
        if any(v is t for t, _ in tied):
            v.reasons.append(
                f"Not selected: within {TIE_TOLERANCE_PCT:g}% of the best estimate, "
                f"but {chosen.candidate} is preferred (lossless before lossy, then cheaper "
                "knobs, lower memory, the id)."
            )
        else:
            v.reasons.append(
                f"Not selected: {chosen.candidate} is faster "
                f"({_x(chosen.speedup_estimate or 0.0)} vs {_x(v.speedup_estimate or 0.0)})."
            )
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
    return chosen, reason


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
