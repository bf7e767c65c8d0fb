"""Screening a plan of many candidates (pure): one short start each drops the clear losers, and
only the survivors go on to the full decision.

A plan of ``SCREEN_FROM`` candidates or more is screened. Its first round is the screening
round: each candidate's first start (``flows.measure.start_plan``) times the headline cell alone
(``screen_cell``: guard and reported cells move to the next start); the baseline's also takes
its greedy passes and the quality suite, the reference every gate compares with. After that
round ``screen`` drops a candidate whose headline speedup interval from that one start, at
``SCREEN_CONFIDENCE`` with the learned start-to-start spread (else the assumed 5%), lies wholly
below the threshold, and one that failed a gate there (``protocol.gates_first``: each
candidate's screening start takes every gate before any timing, ``gate_stop`` ending it at a
failed one, so each candidate's outputs are judged whether or not it is faster; the real demo's
policy shows its builds' quality so).

It judges speed only where the candidate's screening start and the baseline's ran quiet (a busy
start is held for the full decision, as the looks before ``min_starts`` hold it:
``flows.rounds.busy_so_far``). The survivors' screening start stays their first start of the
full decision, which goes on exactly as in a plan of a few candidates, but for the gates: by
default a screened plan takes a candidate's gates (greedy passes for token identity or
agreement, the quality suite for a lossy one) only once its speed qualifies it, in a start of
their own that ``gate_stop`` ends at a failed gate (``flows.rounds``;
``core.judging.awaiting_gates``). On the
27B target the gates of a screened catalog took three quarters of its projected time when every
candidate paid them before timing, and most candidates of a catalog never qualify on speed.
Nothing is qualified, so nothing is selected, before every gate passes.

Why this keeps the error rate: screening can only drop a candidate, never qualify one, and the
rounds after it are the same for a survivor as they would have been without it. Run a plan
with and without screening on the same measurements: every candidate the screened cycle
qualifies, the unscreened one qualifies too at the same look, so a candidate no faster than the
threshold qualifies at most as often as without screening, (1 - confidence) / 2 over all looks
(a non-binding futility stop, docs/statistics.md). A gate start times no decisive cell, and a
candidate's timed starts stay within the protocol's maximum, so the looks at its speed are
those the error rate is spent over. What screening spends is power: a candidate truly at the
threshold is dropped when its one-start interval lies below it, 0.5% of the time at 99% with
the spread right; one 10% above the threshold, at the assumed 5% spread a side, about once in
100,000.

``evidence verify`` recomputes ``screen`` from the bundle's samples (``screening_view``: the
first round's samples, greedy outputs and round records of each run).
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    Decision,
    EffectiveThresholds,
    FrozenPlan,
    GateResult,
    MeasureProtocol,
    Screening,
    Semantics,
    Verdict,
    WorkloadCell,
)
from mcp_infra.core.budget import QualityOutputs, task_gate
from mcp_infra.core.gates import compare_greedy
from mcp_infra.core.gating import failed_gates
from mcp_infra.core.intervals import ASSUMED_START_NOISE
from mcp_infra.core.judging import headline_cell, judge, learned_prior, ratio_words
from mcp_infra.core.machine import busy_starts
from mcp_infra.core.selector import select
from mcp_infra.core.stats import SEED, SummaryOptions, derive_seed, speedup_summary
from mcp_infra.core.workload import decisive_view

SCREEN_FROM = 4
"""Plans of this many candidates or more are screened. A plan of up to three (what a plan could
name before screening) is decided as it always was, so the calibrations measured on such plans
(docs/statistics.md, docs/benchmarks.md) stand: its first round already rejects a hopeless
candidate where history gives one start an interval, and a short first start would only move
its guard and reported cells to the second. From four on, most candidates of a generated
catalog are expected not to win, and each one screening drops costs one short start."""

SCREEN_CONFIDENCE = 0.99
"""Two-sided confidence of the screening interval. High, because a drop is final for the cycle:
a candidate truly at the threshold is dropped 0.5% of the time with the spread right."""

SCREEN_ROUND = 0
"""The screening round: a screened plan's first."""


def screens(plan: FrozenPlan) -> bool:
    """Whether ``plan`` is screened: ``SCREEN_FROM`` candidates or more."""
    return len(plan.candidates) - 1 >= SCREEN_FROM


def screen_cell(protocol: MeasureProtocol) -> WorkloadCell:
    """The one cell a screening start times: the headline cell (the first decisive cell at
    concurrency 1, else the first decisive cell, else the first), as the selector's headline."""
    decisive = [c for c in protocol.workload if c.role == "decisive"]
    head = next((c for c in decisive if c.concurrency == 1), decisive[0] if decisive else None)
    head = head or protocol.workload[0]
    return WorkloadCell(request_class=head.request_class, concurrency=head.concurrency)


def screening_view(run: CandidateRun) -> CandidateRun:
    """The run as its screening round left it: that round's samples (timed, greedy and quality),
    round records and peak memory."""
    records = [r for r in run.rounds if r.round == SCREEN_ROUND]
    peaks = [r.peak_gb for r in records if r.peak_gb is not None]
    return run.model_copy(
        update={
            "samples": [s for s in run.samples if s.round == SCREEN_ROUND],
            "greedy": [s for s in run.greedy if s.round == SCREEN_ROUND],
            "rounds": records,
            "peak_memory_gb": max(peaks) if peaks else None,
        }
    )


def gate_stop(
    baseline: CandidateRun,
    partial: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    *,
    complete: bool,
) -> GateResult | None:
    """The gate a gate start already fails between its untimed requests, or None. Before
    every greedy and quality answer is in, only a lossless candidate's divergence on a prompt
    both sides answered (more answers cannot undo it); once all are in, every gate but memory
    (its peak is read when the start ends, and screening judges it then), and a lossy
    candidate's quality gate once it has lost more of the tasks the baseline passes than its
    budget allows (more answers cannot win them back)."""
    if not partial.greedy or not baseline.greedy:
        return None
    if not complete:
        if partial.semantics != Semantics.LOSSLESS:
            return tasks_already_lost(baseline, partial, thresholds)
        answered = {s.prompt_id for s in partial.greedy}
        gate = compare_greedy(
            [s for s in baseline.greedy if s.prompt_id in answered], partial.greedy
        )
        return None if gate.passed else gate
    failed = [
        g for g in failed_gates(baseline, partial, thresholds, protocol) if g.gate != "memory"
    ]
    return failed[0] if failed else None


def tasks_already_lost(
    baseline: CandidateRun, partial: CandidateRun, thresholds: EffectiveThresholds
) -> GateResult | None:
    """The quality gate of a lossy candidate whose quality answers so far already lose more of
    the tasks the baseline passes than its class's budget allows, judged on the tasks both
    sides answered; None while it may still hold."""
    if thresholds.quality_budget is None:
        return None
    answers = [s for s in partial.samples if s.phase == "quality"]
    asked = {s.prompt_id for s in answers}
    base = [s for s in baseline.samples if s.phase == "quality" and s.prompt_id in asked]
    if not answers or not base:
        return None
    path, budget = thresholds.quality_budget.for_class(partial.candidate_class)
    gate = task_gate(QualityOutputs(base, answers), path, budget)
    if gate.passed:
        return None
    return gate.model_copy(
        update={"detail": f"after {len(asked)} of the quality suite's tasks, {gate.detail}"}
    )


def screen(
    baseline: CandidateRun,
    runs: Sequence[CandidateRun],
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    busy_line: float | None = None,
) -> Screening:
    """What screening decides on the first round of ``runs`` (module docstring): the candidates
    it judged, those it dropped with the reason, those a busy start held. ``busy_line``: the
    share of the CPUs taken above which a start counts as busy (None: no start is busy, as in
    the cost model). A candidate that did not start, or whose server died in that round, is
    the full decision's to judge, not screening's."""
    base = screening_view(decisive_view(baseline, protocol))
    base_busy = busy_line is not None and bool(busy_starts(base.rounds, busy_line))
    out = Screening(confidence=SCREEN_CONFIDENCE)
    for run in runs:
        view = screening_view(decisive_view(run, protocol))
        if run.candidate == baseline.candidate or not run.started or not view.rounds:
            continue
        if any(r.error for r in view.rounds):
            continue
        failed = failed_gates(base, view, thresholds, protocol)
        if failed:
            out.judged.append(run.candidate)
            out.dropped[run.candidate] = f"the {failed[0].gate} gate failed"
            continue
        if base_busy or (busy_line is not None and busy_starts(view.rounds, busy_line)):
            out.held.append(run.candidate)
            continue
        out.judged.append(run.candidate)
        slow = too_slow(base, view, thresholds, protocol)
        if slow is not None:
            out.dropped[run.candidate] = slow
    return out


def too_slow(
    base: CandidateRun,
    view: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
) -> str | None:
    """Why the candidate's one-start headline interval at ``SCREEN_CONFIDENCE`` lies wholly
    below the threshold, in words; None where it does not (or nothing was compared: the full
    decision says why)."""
    threshold = 1 + thresholds.min_speedup_pct / 100
    prior = learned_prior(protocol)
    options = SummaryOptions(
        confidence=SCREEN_CONFIDENCE,
        resamples=protocol.bootstrap_resamples,
        seed=derive_seed(SEED, f"screen:{view.candidate}"),
        level=SCREEN_CONFIDENCE,
        prior=prior,
    )
    cell = headline_cell(base, view, protocol)
    summary = speedup_summary(base.samples, view.samples, options, cell=cell)
    if summary is None:
        return None
    # The wider of the two upper ends (with a learned spread, history at its full weight or
    # guarded): screening drops only what is clear either way.
    high = max(summary.ci_high, summary.reject_high or summary.ci_high)
    if high >= threshold:
        return None
    spread = (
        f"learned start spread {prior.sd:.1%}"
        if prior is not None
        else f"assumed start spread {ASSUMED_START_NOISE:.0%}"
    )
    return (
        f"too slow: speedup {ratio_words(summary.estimate)} in one start a side "
        f"({SCREEN_CONFIDENCE:.0%} interval {ratio_words(summary.ci_low)} to "
        f"{ratio_words(high)}, {spread}), wholly below the required {ratio_words(threshold)}"
    )


def screening_words(screening: Screening, candidates: int) -> str:
    """What screening did, in one line for the journal and the verdict's reason."""
    dropped = screening.dropped
    words = f"screening dropped {len(dropped)} of {candidates} candidate(s) after one start each"
    if dropped:
        words += " (" + "; ".join(f"{c}: {why}" for c, why in dropped.items()) + ")"
    if screening.held:
        words += f"; {', '.join(screening.held)} not judged (a start so far ran on a busy machine)"
    survivors = candidates - len(dropped)
    return words + f"; {survivors} go(es) on to the full decision"


def select_screened(
    baseline: CandidateRun,
    runs: Sequence[CandidateRun],
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
    auto_promote: dict[CandidateClass, bool],
    screening: Screening,
) -> Verdict:
    """The decision of a screened plan: the selector on the candidates screening kept (as the
    cycle measured them on), and each dropped one rejected with screening's reason first; the
    verdict records the screening and its reason says what it dropped."""
    kept = [r for r in runs if r.candidate not in screening.dropped]
    verdict = select(baseline, kept, thresholds, protocol, auto_promote)
    judged = {v.candidate: v for v in verdict.candidates}
    for run in runs:
        why = screening.dropped.get(run.candidate)
        if why is None or run.candidate == baseline.candidate:
            continue
        v = judge(baseline, run, thresholds, protocol, auto_promote)
        line = f"Dropped by screening after one start: {why}."
        if v.decision == Decision.REJECTED:
            v.reasons.insert(0, line)
        else:
            v.decision, v.reasons = Decision.REJECTED, [line]
        judged[run.candidate] = v
    ordered = [judged[r.candidate] for r in runs if r.candidate in judged]
    reason = verdict.reason if kept else "no candidate qualified, baseline kept"
    if screening.dropped:
        reason += f"; screening dropped {', '.join(screening.dropped)} after one start each"
    return verdict.model_copy(
        update={"candidates": ordered, "reason": reason, "screening": screening}
    )


def decide(
    baseline: CandidateRun,
    runs: Sequence[CandidateRun],
    plan: FrozenPlan,
    *,
    screened: bool,
    busy_line: float | None = None,
) -> Verdict:
    """The selector's verdict on the decisive view of ``runs`` (the cycle's, the cost model's
    and ``evidence verify``'s call): a ``screened`` plan's with what its screening round dropped
    (``screen``, ``select_screened``). ``busy_line``: as ``screen``'s."""
    protocol = plan.protocol
    base = decisive_view(baseline, protocol)
    views = [decisive_view(r, protocol) for r in runs]
    if not screened:
        return select(base, views, plan.thresholds, protocol, plan.auto_promote)
    screening = screen(baseline, runs, plan.thresholds, protocol, busy_line)
    return select_screened(base, views, plan.thresholds, protocol, plan.auto_promote, screening)
