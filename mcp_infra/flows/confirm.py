"""After the rounds: the drift re-measure of the baseline and the winner's held-out
confirmation, each a fresh start measured by the rounds' own ``one_start`` over the same
``Bench``, so the cycle and the cost model share them as they share the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    Decision,
    MeasureProtocol,
    Recipe,
    Verdict,
    WorkloadCell,
)
from mcp_infra.core.machine import RedoRule
from mcp_infra.core.selector import select
from mcp_infra.flows.loadwatch import Machine
from mcp_infra.flows.measure import prompts_by_class
from mcp_infra.flows.rounds import Bench, Pass, Slot, Tally, baseline_tally, one_start
from mcp_infra.state.catalog import load_suite


def drift_protocol(protocol: MeasureProtocol) -> MeasureProtocol:
    """The drift re-measure: the headline cell only (the first decisive cell at concurrency 1,
    as the selector's headline), without warm-up: a short re-measure, not a whole start."""
    decisive = [c for c in protocol.workload if c.role == "decisive"]
    head = next((c for c in decisive if c.concurrency == 1), decisive[0] if decisive else None)
    cells = [WorkloadCell(request_class=head.request_class, concurrency=1)] if head else []
    return protocol.model_copy(
        update={"workload": cells or protocol.workload[:1], "warmup": 0, "quality_suite": None}
    )


def measure_drift(
    bench: Bench, baseline: Recipe, run: CandidateRun, round_index: int
) -> CandidateRun:
    """One more fresh baseline start after the rounds, its timed samples marked ``drift`` (the
    selector compares them with the baseline's earlier starts). A start that fails adds no
    drift samples, and the selector treats that as it treats missing drift."""
    item = Tally(BASELINE_ID, baseline, starts=run.starts, rounds=list(run.rounds))
    protocol = drift_protocol(bench.plan.protocol)
    prompts = prompts_by_class(load_suite(protocol.suite), "selection")
    short = replace(bench, plan=bench.plan.model_copy(update={"protocol": protocol}))
    result = one_start(short, item, prompts, Slot(round_index), Pass("drift", quality=False))
    drift = [s for s in (result.samples if result else []) if s.phase == "drift"]
    return run.model_copy(
        update={"samples": [*run.samples, *drift], "starts": item.starts, "rounds": item.rounds}
    )


@dataclass
class HeldOut:
    passed: bool
    reason: str
    baseline: CandidateRun
    winner: CandidateRun
    verdict: Verdict | None = None


def heldout_protocol(protocol: MeasureProtocol) -> MeasureProtocol:
    """Held-out prompts at concurrency 1, for the classes the workload decides on."""
    classes = [
        c.request_class for c in protocol.workload if c.concurrency == 1 and c.role == "decisive"
    ] or ["short"]
    cells = [WorkloadCell(request_class=c, concurrency=1) for c in dict.fromkeys(classes)]
    # Twice the timed requests per prompt that selection's first rounds gave each prompt (at
    # least 6): the check runs in one start per side, and each held-out prompt's own interval
    # must clear the worst-prompt floor.
    repeats = protocol.heldout_repeats or min(
        50, max(6, 2 * protocol.repeats * protocol.min_starts)
    )
    # One start a side is one look: the full confidence, never an early look's stricter level
    # (``intervals.look_level``), whatever the selection's minimum of starts.
    return protocol.model_copy(
        update={
            "workload": cells,
            "quality_suite": None,
            "drift_check": False,
            "repeats": repeats,
            "min_starts": 1,
            "max_starts": 1,
        }
    )


def as_measured(run: CandidateRun) -> CandidateRun:
    """A held-out run as the selector reads runs: its timed samples in phase ``measure``."""
    return run.model_copy(
        update={
            "samples": [
                s.model_copy(update={"phase": "measure"}) if s.phase == "heldout" else s
                for s in run.samples
            ],
            "greedy": [s.model_copy(update={"phase": "measure"}) for s in run.greedy],
        }
    )


def heldout_machine(machine: Machine | None) -> Machine | None:
    """The held-out check's way of reading the machine: a start that ran busy (over
    ``Machine.busy``) is measured again once.

    Why: the check is one start per side, so a burst of other load inside either start decides
    it alone (docs/benchmarks.md has the co-tenant demos this lost). The rule reads only the
    load, never the measured speed, and applies to both sides alike; and the check can only
    remove a winner, so measuring again adds no false qualification. It costs one start, and
    only on a busy machine."""
    if machine is None:
        return None
    return replace(machine, redo=RedoRule(machine.busy, 1))


def heldout_check(bench: Bench, baseline: Recipe, winner: Recipe) -> HeldOut:
    """Measure the baseline and the winner on the held-out prompts, each in a fresh start, and
    ask the selector: the winner must qualify there too (speed interval above the threshold and,
    for a lossless winner, greedy token ids equal to the baseline's held-out outputs)."""
    protocol = heldout_protocol(bench.plan.protocol)
    prompts = prompts_by_class(load_suite(protocol.suite), "heldout")
    held = replace(
        bench,
        plan=bench.plan.model_copy(update={"protocol": protocol}),
        machine=heldout_machine(bench.machine),
    )
    runs: dict[str, CandidateRun] = {}
    kind = Pass("heldout", False, heldout=True)
    tallies = [baseline_tally(held, baseline, prompts, kind), Tally(winner.candidate_id, winner)]
    results = [
        one_start(held, item, prompts, Slot(0, position, 2), kind)
        for position, item in enumerate(tallies)
    ]
    for item, result in zip(tallies, results, strict=True):
        if result is None or result.died:
            item.start_error = item.start_error or (result.died if result else None)
        item.stopped = "held-out check"
        runs[item.name] = item.run("heldout")
    base_run, win_run = runs[BASELINE_ID], runs[winner.candidate_id]
    if not any(prompts.values()):
        return HeldOut(
            False, "gain not seen on held-out prompts: the suite has none", base_run, win_run
        )
    if base_run.start_error:
        return HeldOut(
            False,
            "gain not seen on held-out prompts: the baseline's held-out "
            f"measurement failed: {base_run.start_error}",
            base_run,
            win_run,
        )
    verdict = select(
        as_measured(base_run),
        [as_measured(win_run)],
        bench.plan.thresholds,
        protocol,
        bench.plan.auto_promote,
        confirmation=True,
    )
    (judged,) = verdict.candidates
    words = " ".join(judged.reasons)
    if judged.decision == Decision.QUALIFIED:
        return HeldOut(True, "held-out prompts: " + words, base_run, win_run, verdict)
    return HeldOut(False, "gain not seen on held-out prompts: " + words, base_run, win_run, verdict)
