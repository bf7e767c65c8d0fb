"""The lossy budget: how far a lossy candidate may move from the baseline, and its two gates.

A candidate whose variant is lossy is judged by its class's quality budget (the policy's
``thresholds.quality_budget``; a class not named there takes the default):

- **agreement**: the continuous measure against the baseline on the same prompts
  (core.fidelity: identical outputs, shared prefix, KL and top-token agreement where the runtime
  gives log-probabilities), each limit held against the worse end of its interval;
- **quality**: the quality suite's tasks, checked on both sides' answers (core.answers). The
  candidate is held to every task the baseline passes, less the budget's ``task_allowance``;
  tasks the baseline fails are reported, never held against it.

A lossy candidate promotes without a person only where its class has a budget of its own
(``may_promote_alone``). Plans frozen before quality budgets carry the one bar of that time,
``lossy_min_identical_fraction``, and are judged as they were (``legacy_gates``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mcp_infra.contracts import (
    CandidateRun,
    EffectiveThresholds,
    GateResult,
    Interval,
    MeasureProtocol,
    QualityBudget,
    QualityBudgets,
    QualityMeasure,
    Sample,
    Semantics,
    TaskOutcome,
)
from mcp_infra.core.fidelity import matched_answers, measure
from mcp_infra.core.gates import (
    check_sample,
    compare_greedy,
    lossy_agreement,
    quality_gate,
    split_agreement,
)
from mcp_infra.core.stats import SEED, derive_seed


@dataclass(frozen=True)
class Resampling:
    """How the measure's intervals are drawn: their confidence, resamples and seed."""

    level: float
    resamples: int
    seed: int


def legacy_fraction(budgets: QualityBudgets) -> float | None:
    """The ``lossy_min_identical_fraction`` a policy written before quality budgets would name
    for ``budgets`` (a default budget of that share alone, no class of its own), else None: such
    a policy hashes as it did (``sanitize.policy_hash``)."""
    share = budgets.default.min_identical_share
    if budgets.classes or budgets.default != QualityBudget(min_identical_share=share):
        return None
    return share


FRACTION_BEFORE_BUDGETS = 0.5
"""The ``lossy_min_identical_fraction`` of a policy that named neither it nor a quality budget,
while that field was the one lossy bar (its default then)."""


def policy_as_frozen(data: object, plan: EffectiveThresholds) -> object:
    """A bundled policy's parsed text read as the plan it froze read it: under a plan frozen
    before quality budgets, a policy naming neither lossy bar meant ``FRACTION_BEFORE_BUDGETS``."""
    if plan.lossy_min_identical_fraction is None or not isinstance(data, dict):
        return data
    named = data.get("thresholds")
    if not isinstance(named, dict) or {"quality_budget", "lossy_min_identical_fraction"} & set(
        named
    ):
        return data
    return {
        **data,
        "thresholds": {**named, "lossy_min_identical_fraction": FRACTION_BEFORE_BUDGETS},
    }


def frozen_as(thresholds: EffectiveThresholds, plan: EffectiveThresholds) -> EffectiveThresholds:
    """``thresholds`` re-derived from a bundle's policy, in the form ``plan`` was frozen in: a
    plan frozen before quality budgets holds the one fraction its policy named."""
    if plan.quality_budget is not None or thresholds.quality_budget is None:
        return thresholds
    fraction = legacy_fraction(thresholds.quality_budget)
    if fraction is None:
        return thresholds
    return thresholds.model_copy(
        update={"quality_budget": None, "lossy_min_identical_fraction": fraction}
    )


def resampling_for(protocol: MeasureProtocol, candidate: str) -> Resampling:
    """The protocol's confidence and resamples, and a seed of the candidate's own (from the
    cycle's ``stats.SEED``)."""
    seed = derive_seed(SEED, f"quality:{candidate}")
    return Resampling(protocol.confidence, protocol.bootstrap_resamples, seed)


@dataclass(frozen=True)
class QualityOutputs:
    """Both sides' quality-suite answers (None: no quality suite ran)."""

    baseline: Sequence[Sample]
    candidate: Sequence[Sample]


def may_promote_alone(run: CandidateRun, thresholds: EffectiveThresholds) -> bool:
    """Whether ``run`` may promote without a person as far as quality goes: a lossless one may;
    a lossy one only where its class has a budget of its own (plans frozen before budgets: as
    then, by class alone)."""
    budgets = thresholds.quality_budget
    if budgets is None or run.semantics != Semantics.LOSSY:
        return True
    return run.candidate_class is not None and run.candidate_class in budgets.classes


def lossy_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    draws: Resampling,
    outputs: QualityOutputs | None,
    note: str = "",
) -> list[GateResult]:
    """The agreement gate and, where a quality suite ran, the quality gate of a lossy ``run``.
    ``note`` is appended to the agreement gate's detail (a runtime upgrade's divergence)."""
    if thresholds.quality_budget is None:
        return legacy_gates(baseline, run, thresholds, outputs, note)
    path, budget = thresholds.quality_budget.for_class(run.candidate_class)
    gate = agreement_gate(baseline, run, path, budget, draws)
    if not may_promote_alone(run, thresholds):
        gate = _with(gate, f"a person approves it: {path} is not a budget of its own class")
    if run.knobs.ranks:  # a split model: the lossless comparison said, judged as lossy
        lossless = compare_greedy(baseline.greedy, run.greedy)
        gate = gate.model_copy(
            update={
                "detail": f"split over {run.knobs.ranks} ranks, judged as lossy; lossless "
                f"comparison: {lossless.detail}; agreement: {gate.detail}"
            }
        )
    gates = [_with(gate, note) if note else gate]
    if outputs is not None:
        gates.append(task_gate(outputs, path, budget))
    return gates


def legacy_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    outputs: QualityOutputs | None,
    note: str,
) -> list[GateResult]:
    """A plan frozen before quality budgets: its lossy candidates judged as they were."""
    fraction = thresholds.lossy_min_identical_fraction or 0.0
    gate = (
        split_agreement(baseline.greedy, run.greedy, fraction, run.knobs.ranks)
        if run.knobs.ranks
        else lossy_agreement(baseline.greedy, run.greedy, fraction)
    )
    gates = [_with(gate, note) if note else gate]
    if outputs is not None:
        gates.append(quality_gate(list(outputs.candidate)))
    return gates


def _with(gate: GateResult, note: str) -> GateResult:
    return gate.model_copy(update={"detail": f"{gate.detail}; {note}"})


# --------------------------------------------------------------------------------------------
# Agreement: the continuous measure against the budget
# --------------------------------------------------------------------------------------------


def _pct(i: Interval) -> str:
    return f"{i.value:.0%} ({i.low:.0%}-{i.high:.0%})"


def _limits(m: QualityMeasure, budget: QualityBudget, asked: bool) -> list[tuple[str, bool]]:
    """Each limit of ``budget`` in words, and whether the measure keeps it (the worse end of
    its interval within the limit)."""
    share = budget.min_identical_share
    out = [(f"identical at least {share:.0%}", m.identical_share.low >= share)]
    rows: list[tuple[str, float | None, bool | None]] = [
        (
            f"top-token agreement at least {budget.min_top_agreement or 0:.0%}",
            budget.min_top_agreement,
            None
            if m.top_agreement is None or budget.min_top_agreement is None
            else m.top_agreement.low >= budget.min_top_agreement,
        ),
        (
            f"mean KL at most {budget.max_mean_kl or 0:g}",
            budget.max_mean_kl,
            None
            if m.mean_kl is None or budget.max_mean_kl is None
            else m.mean_kl.high <= budget.max_mean_kl,
        ),
    ]
    for words, limit, keeps in rows:
        if limit is None:
            continue
        if keeps is not None:
            out.append((words, keeps))
        elif asked:  # asked, and the runtime gave none: it cannot show it is within
            out.append((f"{words}: the runtime gave no log-probabilities", False))
        else:
            out.append((f"{words}: not measured here (log-probabilities not asked)", True))
    return out


def measure_text(m: QualityMeasure) -> str:
    """The measure in words, each value with its interval."""
    parts = [
        f"{m.identical_share.value * m.pairs:.0f} of {m.pairs} output(s) identical "
        f"{_pct(m.identical_share)}",
        f"shared prefix {m.prefix_length.value:.1f} {m.unit} "
        f"({m.prefix_length.low:.1f}-{m.prefix_length.high:.1f})",
    ]
    if m.mean_kl is not None and m.top_agreement is not None:
        parts.append(
            f"mean KL {m.mean_kl.value:.4g} nats ({m.mean_kl.low:.4g}-{m.mean_kl.high:.4g}) "
            f"and top token agreeing {_pct(m.top_agreement)} over {m.positions} position(s), "
            f"top {m.top_k}"
        )
    else:
        parts.append("no log-probabilities to compare next-token distributions")
    return f"{'; '.join(parts)} [{m.level:.0%} intervals over {m.prompts} prompt(s)]"


def agreement_gate(
    baseline: CandidateRun, run: CandidateRun, path: str, budget: QualityBudget, draws: Resampling
) -> GateResult:
    """The continuous measure over the greedy passes and the quality tasks, held to ``budget``
    (each limit against its interval's worse end). A prompt missing or failed on either side
    fails the gate, as it counts as not identical."""
    base_q = [s for s in baseline.samples if s.phase == "quality"]
    cand_q = [s for s in run.samples if s.phase == "quality"]
    pairs = matched_answers(baseline.greedy, run.greedy) + matched_answers(base_q, cand_q, "task ")
    m = measure(pairs, level=draws.level, resamples=draws.resamples, seed=draws.seed)
    if m is None:
        return GateResult(
            gate="agreement", passed=False, detail="no greedy outputs to compare", budget=path
        )
    limits = _limits(m, budget, asked=any(p.asked for p in pairs))
    missing = _missing(baseline, run)
    kept = [words for words, ok in limits if ok]
    broken = [words for words, ok in limits if not ok]
    detail = (
        measure_text(m)
        + f"; {path}: "
        + "; ".join(
            ([f"outside: {', '.join(broken)}"] if broken else [])
            + ([f"within: {', '.join(kept)}"] if kept else [])
        )
    )
    if missing:
        detail += "; " + "; ".join(missing)
    return GateResult(
        gate="agreement",
        passed=not broken and not missing,
        detail=detail,
        comparisons=compare_greedy(baseline.greedy, run.greedy).comparisons,
        budget=path,
        measure=m,
    )


def _missing(baseline: CandidateRun, run: CandidateRun) -> list[str]:
    """Greedy prompts missing or failed on either side (each counts as not identical)."""
    base = {s.prompt_id: s for s in baseline.greedy}
    cand = {s.prompt_id: s for s in run.greedy}
    out = []
    for pid in sorted(set(base) | set(cand)):
        if pid not in cand:
            out.append(f"{pid}: missing from the candidate")
        elif pid not in base:
            out.append(f"{pid}: missing from the baseline")
        elif base[pid].error is not None:
            out.append(f"{pid}: baseline request failed ({base[pid].error})")
        elif cand[pid].error is not None:
            out.append(f"{pid}: candidate request failed ({cand[pid].error})")
    return out


# --------------------------------------------------------------------------------------------
# Quality: the tasks the baseline passes, less the allowance
# --------------------------------------------------------------------------------------------


def task_outcomes(outputs: QualityOutputs) -> list[TaskOutcome]:
    """Each task of either side: did the baseline's answer pass, did the candidate's."""

    def first(samples: Sequence[Sample]) -> dict[str, Sample]:
        out: dict[str, Sample] = {}
        for s in sorted(samples, key=lambda s: (s.prompt_id, s.repeat, s.order)):
            if s.phase == "quality":
                out.setdefault(s.prompt_id, s)
        return out

    base, cand = first(outputs.baseline), first(outputs.candidate)
    rows = []
    for task in sorted(set(base) | set(cand)):
        b = check_sample(base[task]) if task in base else None
        c = check_sample(cand[task]) if task in cand else None
        rows.append(
            TaskOutcome(
                task=task,
                baseline=b.passed if b else None,
                candidate=c.passed if c else None,
                detail=c.detail if c else "no answer",
            )
        )
    return rows


def task_gate(outputs: QualityOutputs, path: str, budget: QualityBudget) -> GateResult:
    """The candidate holds every task the baseline passes, less ``budget.task_allowance``."""
    rows = task_outcomes(outputs)
    if not rows:
        return GateResult(gate="quality", passed=False, detail="no quality outputs to check")
    if not any(r.baseline is not None for r in rows):
        return GateResult(
            gate="quality",
            passed=False,
            detail="the baseline has no quality answers to hold the candidate to",
            budget=path,
            tasks=rows,
        )
    held = [r for r in rows if r.baseline]
    lost = [r for r in held if not r.candidate]
    wrong = [r for r in lost if r.candidate is False]
    unanswered = len(lost) - len(wrong)
    reported = [r for r in rows if not r.baseline]
    allowed = budget.task_allowance
    detail = (
        f"holds {len(held) - len(lost)} of the {len(held)} task(s) the baseline passes "
        f"(may lose {allowed}, {path})"
    )
    if unanswered:  # a start that ended early (a gate failed, the server died) asked no more
        detail += (
            f"; answered {len(held) - unanswered} of them and lost {len(wrong)}; "
            f"{unanswered} without an answer count as lost"
        )
    if wrong:
        detail += "; lost: " + "; ".join(f"{r.task}: {r.detail}" for r in wrong)
    if reported:
        passes = sum(1 for r in reported if r.candidate)
        detail += (
            f"; the baseline fails {len(reported)} task(s), not held against it (the candidate "
            f"passes {passes} of them)"
        )
    return GateResult(
        gate="quality", passed=len(lost) <= allowed, detail=detail, budget=path, tasks=rows
    )
