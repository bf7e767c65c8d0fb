"""This home's start-to-start spread, learned from its sealed cycles' baseline starts.

Why: with two fresh starts per configuration a cycle's own spread has two degrees of freedom,
and the t quantile at an early look then decides nothing. Earlier cycles on the same machine
measured the same kind of spread; pooled with the cycle's own (``intervals.pooled_variance``, which
falls back to the cycle alone when the two disagree) a clear case decides after two rounds.
Only starts the machine was quiet for count: a start that other processes slowed measures the
load, not the machine, and a history of busy starts would widen every later cycle's intervals
(measured: five demos beside a co-tenant, learning from each other, decided 2 of 5).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    FrozenPlan,
    LearnedSpread,
    MeasureProtocol,
)
from mcp_infra.core.intervals import pooled_spread
from mcp_infra.core.machine import BUSY_CPU_FRACTION, busy_starts
from mcp_infra.core.stats import start_levels
from mcp_infra.core.workload import timed_length
from mcp_infra.state import evidence
from mcp_infra.state.store import CorruptFile, Home, read_optional

MAX_CYCLES = 10  # cycles that give history (two quiet baseline starts or more)
MAX_SCANNED = 50  # newest sealed cycles read to find them: freezing a plan stays quick
MAX_AGE = timedelta(days=30)
MAX_DF = 30  # history never outweighs a long cycle entirely
HEADLINE = ("short", 1)


def comparable(old: MeasureProtocol, new: MeasureProtocol) -> bool:
    """Cycles whose baseline starts timed the same requests: the suite and the timed answers'
    length (the spread is of timed requests; a longer greedy answer, untimed, changes none)."""
    return (old.suite, timed_length(old)) == (new.suite, timed_length(new))


def quiet_starts(run: CandidateRun, busy_fraction: float) -> set[int]:
    """The starts of a run whose rounds recorded no more than ``busy_fraction`` of the CPUs
    taken from the measurement (other processes and the hypervisor's steal:
    ``core.machine.busy_starts``); a start that recorded no load (older bundles) counts as
    quiet."""
    return {s.start for s in run.samples} - busy_starts(run.rounds, busy_fraction)


def learned_spread(
    home: Home,
    protocol: MeasureProtocol,
    now: datetime,
    busy_fraction: float = BUSY_CPU_FRACTION,
) -> LearnedSpread | None:
    """The pooled within-cycle spread of the baseline's per-start level (one short request at
    a time) over the quiet starts of this home's newest comparable sealed cycles, or None with
    fewer than 2 degrees of freedom of history. A cycle decided on one start a side
    (``min_starts: 1``) has no spread of its own and neither counts nor hides the older
    cycles that do."""
    sets: list[list[float]] = []
    used: list[str] = []
    for summary in evidence.list_cycles(home)[:MAX_SCANNED]:
        if now - summary.ended_at > MAX_AGE or len(used) >= MAX_CYCLES:
            break
        files = home.bundle_files(summary.cycle_id)
        try:
            plan = read_optional(files.plan, FrozenPlan)
            run = read_optional(files.run(BASELINE_ID), CandidateRun)
        except (CorruptFile, OSError):
            continue
        if plan is None or run is None or not comparable(plan.protocol, protocol):
            continue
        quiet = quiet_starts(run, busy_fraction)
        levels = start_levels(
            [s for s in run.samples if s.phase == "measure" and s.start in quiet], HEADLINE
        )
        if len(levels) >= 2:
            sets.append(levels)
            used.append(summary.cycle_id)
    sd, df = pooled_spread(sets)
    if df < 2 or sd <= 0:
        return None
    return LearnedSpread(
        sd=min(sd, 1.0),
        df=min(df, MAX_DF),
        source=f"quiet baseline starts of {len(used)} sealed cycle(s): {', '.join(used)}"[:300],
    )
