"""Interleaved rounds of fresh starts with early stopping: the decisions of the measurement
protocol, over an injected way to measure one start (the drift re-measure and the held-out check
measure theirs with the same ``one_start``: ``flows.confirm``).

Why a seam: the same loop runs the cycle (``measure.server_starter`` starts a real scratch
server) and the cost model (``benchmarks/cycle_cost.py`` passes simulated starts and a simulated
clock), so a projection of what a plan costs is the product's own round loop, not a copy of it.

Every configuration, the baseline recipe included, is measured in at least
``protocol.min_starts`` fresh processes, one per round, in an order that alternates each round
(B C1 C2, then C2 C1 B), so start-to-start variance and slow drift land inside the estimate. From
round ``min_starts`` on, the selector judges all data after each round (``interim``: the drift
check is the final call's); a candidate it qualifies or rejects stops, and another round runs
only while a decision is open (``next_round``). A failed gate stops a candidate after any round.
Where a learned start-to-start spread gives the first start an interval and the protocol has a
futility stop, the rounds before ``min_starts`` are judged too, for rejections only
(``core.earlystop``): stopping a candidate that cannot qualify never makes a false
qualification likelier, and it saves a whole round of starts on a plan that holds no gain. A
policy with ``min_starts: 1`` decides on one start a side where history gives it an interval,
and waits for a second start where none does (``earlystop.may_decide``); a look on history
alone judges quiet starts only (``busy_so_far``).

A plan of many candidates (``core.screening.screens``) makes its first round a screening round:
each candidate's start times the headline cell alone, and after the round
``core.screening.screen`` drops the clear losers (``_screen_round``, journaled); the survivors
go on as above. Such a plan takes a candidate's gates (greedy passes, the quality suite) only
once its speed qualifies it: a look that would qualify it but for its gates
(``CandidateVerdict.gates_pending``) keeps it open, and its next start is a gate start, untimed,
that a failed gate ends (``_gate_check``). Why: on the 27B target the gates of a screened
catalog cost three quarters of its time, and most of its candidates never qualify on speed; no
candidate is selected without its gates, so what is promoted is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import NamedTuple

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CellFigures,
    CycleState,
    Decision,
    FrozenPlan,
    JournalStep,
    MachineLoad,
    MeasureProtocol,
    Recipe,
    ReferenceAnswers,
    ReferenceSource,
    RoundRecord,
    Sample,
    Semantics,
    Verdict,
)
from mcp_infra.core.earlystop import MayDecide, history_alone, may_decide
from mcp_infra.core.fidelity import TOP_LOGPROBS
from mcp_infra.core.gating import failed_gates
from mcp_infra.core.machine import busy_starts
from mcp_infra.core.reference import take
from mcp_infra.core.screening import (
    SCREEN_ROUND,
    decide,
    gate_stop,
    screen,
    screening_words,
    screens,
)
from mcp_infra.core.selector import TIE_TOLERANCE_PCT, select
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.core.workload import TIMED_PHASES, cell_regressions, decisive_view
from mcp_infra.flows.journal import JournalWriter
from mcp_infra.flows.loadwatch import Machine
from mcp_infra.flows.measure import (
    GateCheck,
    StartResult,
    StartSpec,
    first_asks,
    greedy_passes,
    needs_quality,
    prompts_by_class,
)
from mcp_infra.state.catalog import load_suite

# A round is added only if the time left exceeds this many times the last round's duration, so
# the held-out check, promotion and verification still fit the cycle's budget.
ROUND_TIME_FACTOR = 2.0


LiveTraffic = Callable[[], int]
"""Live requests the front has received so far (each round records its overlap)."""

Starter = Callable[[StartSpec, Callable[[int], None]], StartResult]
"""Measure one fresh start: start a server for ``spec.recipe``, call the second argument with
its port once it is ready, measure ``spec``, stop it. Raises ``StartFailed`` (or the runtime's
start errors) when the server did not start."""


class GateTiming(Enum):
    """When a configuration takes its gates (greedy passes, the quality suite). One answer per
    plan (``Bench.gate_timing``): what each start measures follows from it."""

    FIRST_START = "first_start"  # an unscreened plan, and every held-out or drift start
    SCREENING_START = "screening_start"  # a screened plan with ``protocol.gates_first``
    ONCE_QUALIFIED = "once_qualified"  # a screened plan: a gate start once speed qualifies

    @property
    def screened(self) -> bool:
        """Whether a configuration's first start is a screening start (the headline alone)."""
        return self is not GateTiming.FIRST_START


class StartFailed(RuntimeError):
    """The configuration's server did not start (a verdict on it, unlike a busy port)."""


@dataclass(frozen=True)
class Bench:
    """What measurement needs of a cycle: the frozen plan, its journal, how one start is
    measured, the clock, the live-traffic counter (None where no front counts) and the machine's
    other load (None: not read, never waited for)."""

    plan: FrozenPlan
    journal: JournalWriter
    run_start: Starter
    start_errors: tuple[type[Exception], ...] = (StartFailed,)
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    live_traffic: LiveTraffic | None = None
    machine: Machine | None = None
    screening: bool | None = None  # None: by the plan's size (core.screening.screens)
    reference: ReferenceAnswers | None = None  # the live configuration's kept answers

    @property
    def screened(self) -> bool:
        """Whether the plan's first round is a screening round."""
        return screens(self.plan) if self.screening is None else self.screening

    @property
    def gate_timing(self) -> GateTiming:
        """When the plan's candidates take their gates in its selection rounds."""
        if not self.screened:
            return GateTiming.FIRST_START
        if self.plan.protocol.gates_first:
            return GateTiming.SCREENING_START
        return GateTiming.ONCE_QUALIFIED

    @property
    def busy_line(self) -> float | None:
        """The share of the CPUs taken above which a start counts as busy (None: unread)."""
        return self.machine.busy if self.machine is not None else None


class Slot(NamedTuple):
    """Where a start stands: its round, its place in the round, and the round's size."""

    round_index: int
    position: int = 0
    total: int = 1


class Pass(NamedTuple):
    """What a start is for: selection rounds, the drift re-measure, or the held-out check."""

    phase: str = "measure"
    quality: bool = True
    heldout: bool = False
    timed: bool = True  # False: a round of gate starts alone (the baseline's reference start)


SELECTION = Pass()


# ---------------------------------------------------------------------------------------------
# Pure planning
# ---------------------------------------------------------------------------------------------


def round_order(configs: Sequence[str], round_index: int) -> list[str]:
    """The order configurations are started in: as given in even rounds, reversed in odd ones
    (B C1 C2, C2 C1 B, B C1 C2, ...), so no configuration always runs first or last."""
    return list(configs) if round_index % 2 == 0 else list(reversed(configs))


def next_round(
    rounds_done: int,
    open_candidates: Sequence[str],
    protocol: MeasureProtocol,
    seconds_left: float,
    last_round_s: float,
    *,
    gates_due: Sequence[str] = (),
) -> tuple[bool, str]:
    """Whether to run another round, and why (or why not). ``gates_due``: open candidates whose
    next start is their gate start; past the protocol's maximum of starts (which counts timed
    ones) a round of their gate starts alone still runs (``past_max``)."""
    if not open_candidates:
        return False, "every decision was made"
    if seconds_left <= 0:
        return False, "the cycle's time budget ran out"
    if rounds_done < protocol.min_starts:
        return True, f"fewer than {protocol.min_starts} starts so far (the protocol's minimum)"
    fits = seconds_left >= ROUND_TIME_FACTOR * last_round_s
    if past_max(rounds_done, protocol):
        if gates_due and fits:
            return True, f"{', '.join(gates_due)} qualif(ies) on speed and take(s) its gates"
        return False, f"the protocol's maximum of {protocol.max_starts} starts was reached"
    if not fits:
        return False, (
            f"the cycle's time budget does not allow another round ({seconds_left:.0f}"
            f" s left, the last round took {last_round_s:.0f} s)"
        )
    return True, "a decision is still open"


def past_max(rounds_done: int, protocol: MeasureProtocol) -> bool:
    """Whether the protocol's maximum of timed starts has been reached."""
    return rounds_done >= max(protocol.max_starts, protocol.min_starts)


def outrun(verdict: Verdict, open_: Sequence[str], best: float | None, tie_pct: float) -> list[str]:
    """Open candidates that can no longer be selected: their interval's upper end is below the
    estimate of a candidate already qualified (less the tie tolerance). Stopping them changes
    no selection, so it costs no error rate."""
    if best is None:
        return []
    bar = best * (1 - tie_pct / 100)
    return [
        v.candidate
        for v in verdict.candidates
        if v.candidate in open_ and v.ci_high is not None and v.ci_high < bar
    ]


def open_decisions(verdict: Verdict, candidates: Sequence[str]) -> list[str]:
    decided = {v.candidate: v.decision for v in verdict.candidates}
    return [c for c in candidates if decided.get(c) == Decision.INCONCLUSIVE]


# ---------------------------------------------------------------------------------------------
# What has been measured of one configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What has been measured of one configuration so far."""

    name: str
    recipe: Recipe
    samples: list[Sample] = field(default_factory=list)
    greedy: list[Sample] = field(default_factory=list)
    quality: list[Sample] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    starts: int = 0
    peak_gb: float | None = None
    memory_source: str | None = None
    start_error: str | None = None
    stopped: str = ""
    qualified_at: float | None = None  # its estimate when a look qualified it
    gates_due: bool = False  # its speed qualifies it and its next start takes its gates
    reference: ReferenceSource | None = None  # what it holds that an earlier cycle measured

    def run(self, purpose: str = "selection") -> CandidateRun:
        return CandidateRun(
            candidate=self.name,
            candidate_class=self.recipe.candidate_class,
            semantics=self.recipe.semantics,
            knobs=self.recipe.knobs,
            started=self.start_error is None,
            start_error=self.start_error,
            peak_memory_gb=self.peak_gb,
            memory_source=self.memory_source,
            samples=self.samples + self.quality,
            greedy=self.greedy,
            purpose=purpose,  # type: ignore[arg-type]
            starts=self.starts,
            rounds=list(self.rounds),
            stopped=self.stopped,
            reference=self.reference,
        )

    def set_aside(self, start: int, reason: str) -> None:
        """Start ``start``'s timed samples kept as phase ``busy`` (in the evidence, never
        selected) and its round record saying why; its greedy outputs and quality answers stand
        (load changes no token)."""
        self.samples = [
            s.model_copy(update={"phase": "busy"})
            if s.start == start and s.phase in TIMED_PHASES
            else s
            for s in self.samples
        ]
        self.rounds[-1] = self.rounds[-1].model_copy(update={"set_aside": reason})

    def record(
        self,
        start: int,
        slot: Slot,
        began: datetime,
        ended: datetime,
        *,
        port: int | None,
        live: int | None,
        error: str | None,
        machine: MachineLoad | None,
    ) -> None:
        """The round record of start ``start``: where it stood, its window, what happened."""
        self.rounds.append(
            RoundRecord(
                config=self.name,
                start=start,
                round=slot.round_index,
                position=slot.position,
                started_at=began,
                ended_at=ended,
                port=port,
                live_requests=live,
                error=error,
                machine=machine,
            )
        )

    def keep(self, result: StartResult) -> None:
        self.starts += 1
        self.samples.extend(result.samples)
        self.greedy.extend(result.greedy)
        self.quality.extend(result.quality)
        if result.peak_gb is not None:
            self.peak_gb = max(self.peak_gb or 0.0, result.peak_gb)
            self.memory_source = result.memory_source


def _entered(journal: JournalWriter, item: Tally, slot: Slot, kind: Pass) -> dict[str, object]:
    """Journal a start's entry (the pause seam and recovery read a start like any state entry)
    and return the fields that place it."""
    where: dict[str, object] = {
        "candidate": item.name,
        "round": slot.round_index,
        "start": item.starts,
        "index": slot.position + 1,
        "total": slot.total,
        "phase": kind.phase,
    }
    journal(
        CycleState.EXPERIMENT,
        f"round {slot.round_index + 1}: {item.name}, start {item.starts + 1}",
        step=JournalStep.ENTER,
        **where,
    )
    return where


def start_spec(
    plan: FrozenPlan,
    item: Tally,
    prompts: dict[str, list[SuitePrompt]],
    slot: Slot,
    kind: Pass,
    *,
    timing: GateTiming = GateTiming.FIRST_START,
    gate: GateCheck | None = None,
) -> StartSpec:
    """What ``item``'s next start measures, by ``timing``: greedy passes and the quality suite
    in its first start; in a screened plan the first is its screening start (the headline cell
    alone), and ``ONCE_QUALIFIED`` a candidate's gates wait for its gate start
    (``item.gates_due``: untimed): a candidate's reported cells are timed in its gate start and
    no earlier (they are shown, never decide), and the baseline takes its greedy pass first and
    its quality answers in the round of the first lossy candidate's gate start (its
    ``gates_due``). ``gate``: the check that may end a start taking gates. The quality suite
    runs where a gate reads it: a lossy candidate's answers, and the baseline's beside them; a
    lossless candidate's would be judged by no gate."""
    baseline = item.name == BASELINE_ID
    deferred = timing is GateTiming.ONCE_QUALIFIED
    if deferred:  # the baseline's greedy pass first; its quality answers once a gate reads them
        greedy = item.starts == 0 if baseline else item.gates_due
        answers = item.gates_due
    else:
        greedy = answers = item.starts == 0
    if baseline:  # what its reference answers hold is not asked again
        greedy, answers = greedy and not item.greedy, answers and not item.quality
    judged = baseline or item.recipe.semantics == Semantics.LOSSY
    quality = answers and kind.quality and judged
    logprobs = (greedy or answers) and kind.quality and judged
    return StartSpec(
        recipe=item.recipe,
        candidate=item.name,
        prompts=prompts,
        protocol=plan.protocol,
        start=item.starts,
        round_index=slot.round_index,
        phase=kind.phase,
        greedy_times=greedy_passes(item.recipe, baseline=baseline or kind.heldout) if greedy else 0,
        quality_suite=plan.protocol.quality_suite if quality else None,
        top_logprobs=TOP_LOGPROBS if logprobs else 0,
        first_full=1 if timing.screened else 0,
        gate_check=gate if greedy or answers else None,
        timed=kind.timed if baseline else not (deferred and item.gates_due),
        reported=kind.timed if baseline else not deferred or item.gates_due,
    )


def baseline_tally(
    bench: Bench, recipe: Recipe, prompts: dict[str, list[SuitePrompt]], kind: Pass
) -> Tally:
    """The baseline's tally, holding the answers its reference spares its first start."""
    protocol = bench.plan.protocol
    every, tasks = first_asks(protocol, prompts, kind.quality)
    cap, logprobs = protocol.max_tokens, kind.quality
    taken = take(bench.reference, every, tasks, cap, phase=kind.phase, logprobs=logprobs)
    return Tally(
        BASELINE_ID, recipe, greedy=taken.greedy, quality=taken.quality, reference=taken.source
    )


def one_start(
    bench: Bench,
    item: Tally,
    prompts: dict[str, list[SuitePrompt]],
    slot: Slot,
    kind: Pass = SELECTION,
    *,
    redone: int = 0,
    gate: GateCheck | None = None,
) -> StartResult | None:
    """Start ``item`` fresh, measure it, stop it; record the round. None if it did not start.
    A start that other processes slowed is set aside and measured again where the machine's
    rule says so (``Machine.set_aside``, the held-out check's): ``redone`` counts the redos so
    far. In a screened plan a selection start counts from the second as full; ``gate`` may end
    a start that takes a candidate's gates at a failed one."""
    plan, journal = bench.plan, bench.journal
    start = item.starts
    where = _entered(journal, item, slot, kind)
    opened = bench.machine.open(journal, where) if bench.machine else None
    began = bench.now()
    live0 = bench.live_traffic() if bench.live_traffic else None

    def record_round(error: str | None, port: int | None = None) -> None:
        live1 = bench.live_traffic() if bench.live_traffic and live0 is not None else None
        item.record(
            start,
            slot,
            began,
            bench.now(),
            port=port,
            live=live1 - live0 if live0 is not None and live1 is not None else None,
            error=error,
            machine=bench.machine.close(opened) if bench.machine and opened else None,
        )

    def ready(port: int) -> None:
        journal(
            CycleState.EXPERIMENT,
            f"{item.name} is ready on port {port}; measuring",
            step=JournalStep.MEASURING,
            port=port,
            **where,
        )

    selecting = kind.phase == SELECTION.phase
    timing = bench.gate_timing if selecting else GateTiming.FIRST_START
    spec = start_spec(plan, item, prompts, slot, kind, timing=timing, gate=gate)
    try:
        result = bench.run_start(spec, ready)
    except bench.start_errors as exc:
        item.start_error = (
            f"server did not start (round {slot.round_index + 1}, start {start + 1}): {exc}"
        )
        record_round(item.start_error)
        return None
    item.keep(result)
    record_round(result.died, result.port)
    item.rounds[-1] = item.rounds[-1].model_copy(update={"peak_gb": result.peak_gb})
    reason = (  # a gate start times nothing: load changes no token
        bench.machine.set_aside(item.rounds[-1].machine, redone)
        if bench.machine and not result.died and spec.timed
        else None
    )
    if reason is None:
        return result
    item.set_aside(start, reason)
    journal(
        CycleState.EXPERIMENT,
        f"round {slot.round_index + 1}: {item.name}, start {start + 1} set aside: {reason}",
        step=JournalStep.SET_ASIDE,
        reason=reason,
        **where,
    )
    return one_start(bench, item, prompts, slot, kind, redone=redone + 1, gate=gate)


# ---------------------------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------------------------


def run_rounds(
    bench: Bench,
    baseline: Recipe,
    candidates: dict[str, Recipe],
    *,
    deadline: float,
    on_round: Callable[[CandidateRun, list[CandidateRun]], None] | None = None,
) -> tuple[CandidateRun, dict[str, CandidateRun]]:
    """Measure the baseline recipe and every candidate in interleaved rounds of fresh starts,
    stopping candidates as the selector decides them. Returns the baseline run and one run per
    candidate (``purpose="selection"``). ``on_round`` sees the runs after each round (the cycle
    writes them to disk there, so a killed cycle leaves what it measured)."""
    plan = bench.plan
    protocol = plan.protocol
    prompts = prompts_by_class(load_suite(protocol.suite), "selection")
    quality = needs_quality(list(candidates.values()))
    base = baseline_tally(bench, baseline, prompts, Pass(quality=quality))
    items = {name: Tally(name, recipe) for name, recipe in candidates.items()}
    open_ = list(items)
    rounds_done = 0
    last_round_s = 0.0
    deferred = bench.gate_timing is GateTiming.ONCE_QUALIFIED
    while True:
        due = [name for name in open_ if items[name].gates_due]
        base.gates_due = deferred and _reference_due(base, [items[n] for n in due])
        left_s = deadline - bench.clock()
        go, why = next_round(rounds_done, open_, protocol, left_s, last_round_s, gates_due=due)
        if go and past_max(rounds_done, protocol):
            _stop([n for n in open_ if n not in due], items, "no timed start is left")
            open_ = due
        if not go:
            _stop(open_, items, why)
            break
        timed = [name for name in open_ if not items[name].gates_due]
        if timed:
            order = round_order([BASELINE_ID, *open_], rounds_done)
        else:  # gate starts alone, the baseline's reference first where a gate reads it
            order = [BASELINE_ID] * base.gates_due + round_order(open_, rounds_done)
        began = bench.clock()
        kind = Pass(quality=quality, timed=bool(timed))
        for name, result in _round_starts(bench, base, items, order, prompts, rounds_done, kind):
            item = base if name == BASELINE_ID else items[name]
            if name == BASELINE_ID and (result is None or result.died):
                raise RuntimeError(
                    "the baseline recipe failed in a fresh server: "
                    f"{item.start_error or (result.died if result else '')}"
                )
            if name != BASELINE_ID and (result is None or result.died):
                open_.remove(name)
                item.stopped = (
                    f"stopped after {item.starts} start(s): "
                    f"{'it did not start' if result is None else 'its server died'}"
                )
        rounds_done += 1
        last_round_s = bench.clock() - began
        base_run = base.run()
        if on_round:
            on_round(base_run, [i.run() for i in items.values()])
        if bench.screened and rounds_done == SCREEN_ROUND + 1:
            open_ = _screen_round(bench, base_run, items, open_)
        else:
            open_ = _drop_failed_gates(bench, base_run, items, open_, rounds_done)
        look = may_decide(rounds_done, protocol, screened=bench.screened)
        if open_ and look is not MayDecide.NOTHING:
            alone = history_alone(rounds_done, protocol)
            held = busy_so_far(bench, base_run, items, open_) if alone else []
            still = _judge_round(
                bench,
                base_run,
                items,
                [name for name in open_ if name not in held],
                rounds_done,
                last_round_s,
                rejections_only=look is MayDecide.REJECTIONS,
                held=held,
            )
            open_ = [name for name in open_ if name in still or name in held]
    base.stopped = f"measured in {base.starts} start(s) alongside the candidates"
    return base.run(), {name: item.run() for name, item in items.items()}


def _reference_due(base: Tally, due: Sequence[Tally]) -> bool:
    """Whether the baseline's quality answers are due: a lossy candidate takes its gates in the
    coming round and the baseline has given none yet."""
    return not base.quality and any(i.recipe.semantics == Semantics.LOSSY for i in due)


def _stop(names: Sequence[str], items: dict[str, Tally], why: str) -> None:
    """Stop ``names`` with ``why`` (one never measured: the time budget ran out first)."""
    for name in names:
        left = items[name]
        left.stopped = f"stopped after {left.starts} start(s): {why}"
        if left.starts == 0:
            left.start_error = "the cycle's time budget ran out before it was measured"


def _round_starts(
    bench: Bench,
    base: Tally,
    items: dict[str, Tally],
    order: Sequence[str],
    prompts: dict[str, list[SuitePrompt]],
    round_index: int,
    kind: Pass,
) -> Iterator[tuple[str, StartResult | None]]:
    """A round's starts in ``order``, one after another, each (name, result) as it is
    measured; a candidate's gate start (or, ``gates_first``, its screening start) with its
    gate check."""
    first = round_index == SCREEN_ROUND and bench.gate_timing is GateTiming.SCREENING_START
    for position, name in enumerate(order):
        item = base if name == BASELINE_ID else items[name]
        slot = Slot(round_index, position, len(order))
        checked = item is not base and (item.gates_due or first)
        gate = _gate_check(bench, base, item) if checked else None
        result = one_start(bench, item, prompts, slot, kind, gate=gate)
        item.gates_due = False
        yield name, result


def _gate_check(bench: Bench, base: Tally, item: Tally) -> GateCheck:
    """A gate start's check of ``item`` against the baseline's outputs
    (``core.screening.gate_stop``): a failed gate ends the start, and costs nothing more."""

    def check(result: StartResult, complete: bool) -> bool:
        partial = item.run().model_copy(
            update={"samples": [*result.samples, *result.quality], "greedy": result.greedy}
        )
        plan = bench.plan
        return (
            gate_stop(base.run(), partial, plan.thresholds, plan.protocol, complete=complete)
            is not None
        )

    return check


def _screen_round(
    bench: Bench, base_run: CandidateRun, items: dict[str, Tally], open_: list[str]
) -> list[str]:
    """After a screened plan's first round: what screening drops (``core.screening.screen``),
    journaled; the survivors go on to the full decision."""
    plan = bench.plan
    runs = [items[name].run() for name in open_]
    result = screen(base_run, runs, plan.thresholds, plan.protocol, bench.busy_line)
    for name, why in result.dropped.items():
        items[name].stopped = f"dropped by screening after {items[name].starts} start(s): {why}"
    survivors = [name for name in open_ if name not in result.dropped]
    bench.journal(
        CycleState.EXPERIMENT,
        screening_words(result, len(open_)),
        step=JournalStep.SCREENED,
        **result.model_dump(mode="json"),
        survivors=survivors,
    )
    return survivors


def busy_so_far(
    bench: Bench, base_run: CandidateRun, items: dict[str, Tally], open_: Sequence[str]
) -> list[str]:
    """The open candidates a look on history alone (``history_alone``) leaves unjudged: every
    one where a baseline start so far ran on a busy machine, else those with a busy start of
    their own.

    Why: there a side's interval is the learned spread, and that spread was
    learned from quiet starts only (``state.spread.quiet_starts``): it says nothing of how far a
    start that other processes or the hypervisor slowed lands from the machine's level, and one
    such start can reject a candidate after its first round (docs/benchmarks.md). A candidate
    held back is measured in the next round and judged there with the cycle's own spread
    beside history.
    Without a machine reading (the cost model) no start is busy."""
    if bench.machine is None:
        return []
    line = bench.machine.busy
    if busy_starts(base_run.rounds, line):
        return list(open_)
    return [name for name in open_ if busy_starts(items[name].rounds, line)]


def _drop_failed_gates(
    bench: Bench, base_run: CandidateRun, items: dict[str, Tally], open_: list[str], rounds: int
) -> list[str]:
    """A failed gate (a divergence, memory) needs no more starts."""
    still = []
    for name in open_:
        failed = failed_gates(
            base_run, items[name].run(), bench.plan.thresholds, bench.plan.protocol
        )
        if failed:
            items[name].stopped = (
                f"rejected after {items[name].starts} start(s) (round {rounds}): "
                f"the {failed[0].gate} gate failed"
            )
        else:
            still.append(name)
    return still


def _judge_round(
    bench: Bench,
    base_run: CandidateRun,
    items: dict[str, Tally],
    open_: list[str],
    rounds: int,
    round_s: float,
    *,
    rejections_only: bool = False,
    held: Sequence[str] = (),
) -> list[str]:
    """The selector on all data so far (an interim look: the drift check is the final call's);
    decided candidates stop (before ``min_starts``, ``rejections_only``: rejected ones only).
    Returns the candidates still open of ``open_``; ``held`` (``busy_so_far``) are open too,
    unjudged, and the round's journal line names them."""
    plan = bench.plan
    verdict = select(
        decisive_view(base_run, plan.protocol),
        [decisive_view(items[n].run(), plan.protocol) for n in open_],
        plan.thresholds,
        plan.protocol,
        plan.auto_promote,
        interim=True,
    )
    if rejections_only:
        rejected = {v.candidate for v in verdict.candidates if v.decision == Decision.REJECTED}
        still = [name for name in open_ if name not in rejected]
    else:
        still = open_decisions(verdict, open_)
    decided = {
        v.candidate: v.decision.value for v in verdict.candidates if v.candidate not in still
    }
    for name, decision in decided.items():
        items[name].stopped = f"{decision} after {items[name].starts} start(s) (round {rounds})"
    for v in verdict.candidates:
        if v.decision == Decision.QUALIFIED and v.auto_promote and not rejections_only:
            items[v.candidate].qualified_at = v.speedup_estimate
    best = max((i.qualified_at for i in items.values() if i.qualified_at), default=None)
    for name in outrun(verdict, still, best, TIE_TOLERANCE_PCT):
        still.remove(name)
        decided[name] = "outrun"
        items[name].stopped = (
            f"stopped after {items[name].starts} start(s) (round {rounds}): even its interval's "
            f"upper end is below the {best:.3f}x a qualified candidate already shows"
        )
    # Only a look that may qualify sends a candidate to its gates: before ``min_starts`` its
    # decisive cells may not all be timed yet (a screening start times the headline alone).
    due = [
        v.candidate
        for v in verdict.candidates
        if v.gates_pending and v.candidate in still and not rejections_only
    ]
    for name in due:
        items[name].gates_due = True
    busy = (
        f"; not judged on history alone, a start so far ran on a busy machine: {', '.join(held)}"
        if held
        else ""
    )
    gates = f"; {', '.join(due)} qualif(ies) on speed and take(s) its gates next" if due else ""
    bench.journal(
        CycleState.EXPERIMENT,
        f"round {rounds} judged: {len(decided)} decided, {len(still) + len(held)} open"
        f"{busy}{gates}",
        step=JournalStep.JUDGED,
        round=rounds - 1,
        decided=decided,
        open=[*still, *held],
        round_s=round(round_s, 1),
        **({"held_busy": list(held)} if held else {}),
        **({"gates_due": due} if due else {}),
    )
    return still


def decide_cycle(
    baseline: CandidateRun,
    runs: dict[str, CandidateRun],
    plan: FrozenPlan,
    *,
    screened: bool,
    busy_line: float | None = None,
) -> tuple[Verdict, list[CellFigures]]:
    """The cycle's decision on its annotated runs: the selector's verdict on the decisive view
    (in a ``screened`` plan, with what its screening round dropped: ``core.screening``), and
    the decisive workload cells the selected candidate loses (which keep the baseline)."""
    ordered = [runs[name] for name in plan.candidates[1:] if name in runs]
    verdict = decide(baseline, ordered, plan, screened=screened, busy_line=busy_line)
    losses = (
        cell_regressions(runs[verdict.selected].cells, plan.thresholds)
        if verdict.selected is not None
        else []
    )
    return verdict, losses
