"""The rest of the machine's load while a cycle measures: from two readings to a ``MachineLoad``,
whether a machine is quiet enough to start a measurement, and what a verdict left open under
load says about it.

Why: a user's machine always runs something else (the IDE, a browser, the agent that proposed
the plan). CPU that other processes take slows server starts unevenly, widens the intervals and
leaves decisions open; without these figures nothing in the evidence says the machine was busy.

Pure: readings in (``LoadSnapshot``, taken by ``procs.usage.load_snapshot``), figures and words
out. "Other" CPU is the machine's busy CPU time less what this supervisor, the servers it
started and reaped (the measured one) and the front used, so short-lived processes that came and
went inside the window count too. On a virtual machine the hypervisor's *steal* (CPU time the
guest wanted and another guest got) takes CPU the same way, unseen by any process of the guest:
every rule here reads the share *taken* from the measurement, other processes' and steal
together (``taken_fraction``): on a 2-CPU VM steal, not other processes, is what slowed starts
(docs/cycle.md, "A busy machine").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import (
    CandidateRun,
    Decision,
    Event,
    JournalStep,
    MachineLoad,
    RoundRecord,
    ServicePolicy,
    Verdict,
)
from mcp_infra.core.selector import drift_opened

QUIET_LOOK_S = 0.3
"""How long one look at the machine lasts before a start (CPU time over a window, not the load
average: the 1-minute average still carries the last measured start's own load). Every start
pays one look even on a quiet machine (the demo's 13-15 starts paid 15 s at 1 s); 0.3 s is still
60 of the kernel's 10 ms ticks on 2 CPUs, fine enough to tell a quarter of them."""

BUSY_CPU_FRACTION = 0.25
"""Other processes' share of the CPUs above which a verdict left open calls the machine busy
(half a core of a 2-core machine), unless the policy's quiet threshold says otherwise."""

LOW_MEMORY_FRACTION = 0.10
"""Available memory below this share of the total is called short."""


class LoadSnapshot(BaseModel):
    """One reading of the machine's cumulative counters (``procs.usage.load_snapshot``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    monotonic: float
    cpus: int = Field(ge=1)
    busy_cpu_s: float = Field(ge=0, description="every CPU's non-idle time since boot")
    steal_s: float | None = None
    own_cpu_s: dict[str, float] = Field(
        default_factory=dict,
        description="cumulative CPU seconds of each excluded process, by a key that names the "
        "process (pid and start time): a key in only one reading is a process that came or went",
    )
    load_avg_1m: float | None = None
    available_memory_fraction: float | None = Field(None, ge=0, le=1)
    swap_in_bytes: int | None = None
    swap_out_bytes: int | None = None


def stolen_fraction(load: MachineLoad) -> float:
    """The hypervisor's steal over the window's CPU capacity (0 where not recorded: macOS,
    bare metal, older bundles)."""
    capacity = load.window_s * load.cpus
    if load.steal_s is None or capacity <= 0:
        return 0.0
    return min(1.0, load.steal_s / capacity)


def taken_fraction(load: MachineLoad) -> float:
    """The share of the CPUs taken from the measurement: other processes' and the
    hypervisor's steal together."""
    return min(1.0, load.other_cpu_fraction + stolen_fraction(load))


def busy_starts(rounds: Iterable[RoundRecord], busy_fraction: float) -> set[int]:
    """The starts whose round records say more than ``busy_fraction`` of the CPUs was taken
    from the measurement (``taken_fraction``); a start that recorded no load (the cost model's,
    older bundles) is not busy."""
    return {
        r.start
        for r in rounds
        if r.machine is not None and taken_fraction(r.machine) > busy_fraction
    }


def _delta(a: float | int | None, b: float | int | None) -> float | None:
    return None if a is None or b is None else max(0.0, float(b) - float(a))


def machine_load(
    before: LoadSnapshot,
    after: LoadSnapshot,
    waited_s: float | None = None,
    quiet: bool | None = None,
) -> MachineLoad:
    """The rest of the machine's load between two readings. An excluded process seen only in
    the later reading started inside the window (all its CPU is ours); one seen only in the
    earlier reading ended inside it, unread, and is left out (its last part counts as other)."""
    window = max(0.0, after.monotonic - before.monotonic)
    ours = 0.0
    for key, cpu in after.own_cpu_s.items():
        ours += max(0.0, cpu - before.own_cpu_s.get(key, 0.0))
    busy = max(0.0, after.busy_cpu_s - before.busy_cpu_s)
    other = max(0.0, busy - ours)
    capacity = window * after.cpus
    loads = [x for x in (before.load_avg_1m, after.load_avg_1m) if x is not None]
    avail = [
        x
        for x in (before.available_memory_fraction, after.available_memory_fraction)
        if x is not None
    ]
    swap_in = _delta(before.swap_in_bytes, after.swap_in_bytes)
    swap_out = _delta(before.swap_out_bytes, after.swap_out_bytes)
    steal = _delta(before.steal_s, after.steal_s)
    return MachineLoad(
        window_s=round(window, 3),
        cpus=after.cpus,
        other_cpu_s=round(other, 3),
        other_cpu_fraction=round(min(1.0, other / capacity), 4) if capacity > 0 else 0.0,
        own_cpu_s=round(ours, 3),
        steal_s=round(steal, 3) if steal is not None else None,
        load_avg_1m=round(max(loads), 2) if loads else None,
        available_memory_fraction=round(min(avail), 4) if avail else None,
        swap_in_bytes=int(swap_in) if swap_in is not None else None,
        swap_out_bytes=int(swap_out) if swap_out is not None else None,
        waited_s=round(waited_s, 2) if waited_s is not None else None,
        quiet=quiet,
    )


# ---------------------------------------------------------------------------------------------
# Waiting for a quiet machine
# ---------------------------------------------------------------------------------------------


class QuietRule(NamedTuple):
    """Wait before a start until other processes use at most ``cpu_fraction`` of the CPUs over
    a look of ``look_s`` seconds, for at most ``max_wait_s`` seconds."""

    cpu_fraction: float
    max_wait_s: float
    look_s: float = QUIET_LOOK_S


def quiet_rule(service: ServicePolicy) -> QuietRule | None:
    """The policy's rule, or None where it never waits (no threshold, or no time to wait)."""
    if service.quiet_cpu_fraction is None or service.quiet_wait_s <= 0:
        return None
    return QuietRule(service.quiet_cpu_fraction, service.quiet_wait_s)


def busy_fraction(service: ServicePolicy) -> float:
    """The share of the CPUs taken by other processes above which a start counts as busy: the
    policy's quiet threshold where it waits for one, else ``BUSY_CPU_FRACTION``."""
    if service.quiet_cpu_fraction is not None:
        return service.quiet_cpu_fraction
    return BUSY_CPU_FRACTION


def quiet_step(
    load: MachineLoad, rule: QuietRule, looks: int
) -> Literal["quiet", "wait", "give_up"]:
    """After ``looks`` looks, the last one ``load``: quiet enough to start, look again, or start
    anyway (another look would pass the rule's bound). Counted in looks, not in the seconds a
    clock shows, so the reading's own overhead never costs the last look."""
    if taken_fraction(load) <= rule.cpu_fraction:
        return "quiet"
    if (looks + 1) * rule.look_s > rule.max_wait_s:
        return "give_up"
    return "wait"


class RedoRule(NamedTuple):
    """Measure a start again where other processes took more than ``cpu_fraction`` of the CPUs
    over its window, at most ``times`` times in a row (the held-out check's rule:
    ``flows.confirm.heldout_machine``)."""

    cpu_fraction: float
    times: int


def set_aside_reason(load: MachineLoad | None, rule: RedoRule | None, redone: int) -> str | None:
    """Why a start just measured is set aside and measured again; None: it is kept.

    Why: a wait for a quiet machine sees only the moment before a start; a burst that begins
    inside the start slows it by up to 40% on a 2-CPU machine, and one such start decides a
    one-start comparison alone. The rule reads only what other processes took, never the
    measured speed, and applies to every configuration alike, so setting a start aside moves no
    configuration's expected level. Bounded: after ``rule.times`` redos in a row the start is
    kept, load and all (its round records it)."""
    if rule is None or load is None or redone >= rule.times:
        return None
    if taken_fraction(load) <= rule.cpu_fraction:
        return None
    return (
        f"{cpu_words(load)} over its {load.window_s:.0f} s, more than the "
        f"{rule.cpu_fraction:.0%} busy line; measured again"
    )


def cpu_words(load: MachineLoad) -> str:
    """``other processes used 0.92 of 2 CPUs (46%)``, with ``and the hypervisor withheld 0.40
    (steal, 20%)`` where steal took at least 1% of them."""
    cores = load.other_cpu_fraction * load.cpus
    words = f"other processes used {cores:.2f} of {load.cpus} CPUs ({load.other_cpu_fraction:.0%})"
    return words + _steal_words(stolen_fraction(load), load.cpus)


def _steal_words(fraction: float, cpus: int) -> str:
    if fraction < 0.01:
        return ""
    return f" and the hypervisor withheld {fraction * cpus:.2f} (steal, {fraction:.0%})"


def quiet_message(
    step: Literal["quiet", "wait", "give_up"], load: MachineLoad, rule: QuietRule, waited_s: float
) -> str:
    """The journal line (and ``status`` message) of the quiet wait."""
    bound = f"at most {rule.cpu_fraction:.0%}"
    if step == "wait":
        return (
            f"waiting for a quiet machine before this start: {cpu_words(load)}; the policy asks "
            f"{bound} and waits up to {rule.max_wait_s:g} s"
        )
    if step == "quiet":
        return f"the machine is quiet after {waited_s:.0f} s ({cpu_words(load)}); measuring"
    return (
        f"the machine is still busy after {waited_s:.0f} s ({cpu_words(load)}, the policy asks "
        f"{bound}); measuring anyway, the round records the load"
    )


def waiting_text(events: Sequence[Event]) -> str | None:
    """The quiet wait's journal line while a start is waiting (its last event), for ``status``;
    None otherwise."""
    last = events[-1] if events else None
    if last is not None and last.step == JournalStep.QUIET and last.fields.get("waiting"):
        return last.message
    return None


# ---------------------------------------------------------------------------------------------
# What an open verdict says about the load
# ---------------------------------------------------------------------------------------------


class LoadSummary(NamedTuple):
    starts: int
    cpus: int
    mean_fraction: float
    max_fraction: float
    max_load_avg: float | None
    min_available: float | None
    swapped_bytes: int
    waited_s: float
    waits: int
    busy_after_wait: int
    set_aside: int = 0
    mean_steal: float = 0.0


def summarize(rounds: Sequence[RoundRecord]) -> LoadSummary | None:
    """The load over every start that recorded it; None when none did (older bundles, the cost
    model's simulated starts)."""
    loads = [r.machine for r in rounds if r.machine is not None]
    if not loads:
        return None
    total_window = sum(m.window_s for m in loads)
    weighted = sum(taken_fraction(m) * m.window_s for m in loads)
    mean = weighted / total_window if total_window > 0 else 0.0
    stolen = sum(stolen_fraction(m) * m.window_s for m in loads)
    load_avgs = [m.load_avg_1m for m in loads if m.load_avg_1m is not None]
    avail = [m.available_memory_fraction for m in loads if m.available_memory_fraction is not None]
    waited = [m for m in loads if m.waited_s is not None]
    return LoadSummary(
        starts=len(loads),
        cpus=max(m.cpus for m in loads),
        mean_fraction=mean,
        max_fraction=max(taken_fraction(m) for m in loads),
        max_load_avg=max(load_avgs) if load_avgs else None,
        min_available=min(avail) if avail else None,
        swapped_bytes=sum((m.swap_in_bytes or 0) + (m.swap_out_bytes or 0) for m in loads),
        waited_s=sum(m.waited_s or 0.0 for m in waited),
        waits=len(waited),
        busy_after_wait=sum(1 for m in waited if m.quiet is False),
        set_aside=sum(1 for r in rounds if r.set_aside),
        mean_steal=stolen / total_window if total_window > 0 else 0.0,
    )


def load_sentence(
    rounds: Sequence[RoundRecord],
    busy_fraction: float = BUSY_CPU_FRACTION,
    *,
    drift: bool = False,
    heldout: bool = False,
) -> str:
    """How busy the machine was while it measured, and what to do about a decision it left open;
    empty when no start recorded the load. ``drift``: the drift check left every open decision
    open, which more starts would not settle. ``heldout``: the decision left open is the
    held-out check's, which runs one start per side whatever ``protocol.max_starts`` says."""
    s = summarize(rounds)
    if s is None:
        return ""
    who = "other processes" + (" and the hypervisor's steal" if s.mean_steal >= 0.01 else "")
    cpu = (
        f"{who} kept {s.mean_fraction * s.cpus:.2f} of its {s.cpus} CPUs busy on "
        f"average over {s.starts} server start(s) ({s.mean_fraction:.0%}, "
        f"{s.max_fraction:.0%} in the busiest start)"
    )
    if s.mean_steal >= 0.01:
        cpu += f", steal {s.mean_steal:.0%} of them on average"
    if s.max_load_avg is not None:
        cpu += f", load average up to {s.max_load_avg:.1f}"
    memory_short = (s.min_available is not None and s.min_available < LOW_MEMORY_FRACTION) or (
        s.swapped_bytes > 0
    )
    memory = ""
    if memory_short:
        lowest = (
            f"{s.min_available:.0%} available at the lowest and "
            if s.min_available is not None
            else ""
        )
        memory = f", memory was short, {lowest}{s.swapped_bytes / 2**20:.0f} MiB swapped"
    busy = s.mean_fraction > busy_fraction or s.max_fraction > 2 * busy_fraction
    wait = (
        f", the starts waited {s.waited_s:.0f} s in all for a quiet machine and "
        f"{s.busy_after_wait} of {s.waits} started busy all the same"
        if s.waits
        else ""
    )
    if s.set_aside:
        wait += f", {s.set_aside} start(s) that other processes slowed were measured again"
    if not busy and not memory_short:
        if drift:
            then = (
                "the baseline's speed changed between its starts on a quiet machine, so the "
                "plan run again may decide"
            )
        elif heldout:
            then = (
                "the held-out check measures one start per side, so more timed requests per "
                "held-out prompt (protocol.heldout_repeats) or the plan run again may settle it"
            )
        else:
            then = "more starts (protocol.max_starts) may settle it"
        return (
            f"the machine was quiet while it measured: {cpu}{wait}; the load does not explain "
            f"the open decision, {then}"
        )
    advice = []
    if busy and s.waits:
        advice.append(
            "run it again when the machine is quieter, or allow a longer wait "
            "(service.quiet_wait_s)"
        )
    elif busy:
        advice.append(
            "run it again when the machine is quieter, or set service.quiet_cpu_fraction in "
            "the policy so that each start first waits (up to service.quiet_wait_s) for a "
            "quiet machine"
        )
    if memory_short:
        advice.append("close programs that hold memory, or measure fewer candidates at once")
    return (
        f"the machine was {'busy' if busy else 'short of memory'} while it measured: "
        f"{cpu}{memory}{wait}; other load slows the starts unevenly and widens the intervals, "
        f"so {', and '.join(advice)}"
    )


def open_verdict_words(
    verdict: Verdict,
    runs: Sequence[CandidateRun],
    busy_fraction: float | None = None,
    *,
    heldout: bool = False,
) -> str:
    """``; <load sentence>`` for a verdict that left a decision open (some candidate
    inconclusive), over every run's rounds; empty otherwise, or when no start recorded the load.
    ``heldout``: the verdict is the held-out check's (``load_sentence``)."""
    open_ = [v for v in verdict.candidates if v.decision == Decision.INCONCLUSIVE]
    if not open_:
        return ""
    drifted = {v.candidate: found for v in open_ if (found := drift_opened(v)) is not None}
    words = ""
    if drifted:
        # Said first: the drift check, not the interval, is what left these open.
        words = f"; the drift check left {', '.join(drifted)} open: {next(iter(drifted.values()))}"
    rounds = [r for run in runs for r in run.rounds]
    sentence = load_sentence(
        rounds,
        busy_fraction if busy_fraction is not None else BUSY_CPU_FRACTION,
        drift=len(drifted) == len(open_),
        heldout=heldout,
    )
    return words + (f"; {sentence}" if sentence else "")
