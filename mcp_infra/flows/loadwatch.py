"""The rest of the machine around each server start: a reading before it and one after it (the
round records what other processes did meanwhile), and, where the policy asks, a bounded wait
for a quiet machine first, journaled so that ``status`` says the cycle is waiting and why, and
the verdict on a start that other processes slowed all the same (measured again, or kept).

The figures and the rule are ``core.machine``'s; this only reads, sleeps and journals. The cost
model's simulated starts pass no ``Machine``, so they neither read nor wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from mcp_infra.contracts import CycleState, JournalStep, MachineLoad
from mcp_infra.core.machine import (
    BUSY_CPU_FRACTION,
    LoadSnapshot,
    QuietRule,
    RedoRule,
    machine_load,
    quiet_message,
    quiet_step,
    set_aside_reason,
)


class Opened(NamedTuple):
    """The reading that opens a start's window, and how its quiet wait ended (None: no wait)."""

    snapshot: LoadSnapshot
    waited_s: float | None = None
    quiet: bool | None = None


@dataclass(frozen=True)
class Machine:
    """How a cycle reads the machine (``procs.usage.machine_reader``), whether it waits for a
    quiet one before each start (``core.machine.quiet_rule``), whether a start that other
    processes slowed is measured again (the held-out check's: ``confirm.heldout_machine``), and
    the share of the CPUs taken above which a start counts as busy
    (``core.machine.busy_fraction``)."""

    read: Callable[[], LoadSnapshot]
    quiet: QuietRule | None = None
    sleep: Callable[[float], None] = time.sleep
    redo: RedoRule | None = None
    busy: float = BUSY_CPU_FRACTION  # the share taken above which a start counts as busy

    def set_aside(self, load: MachineLoad | None, redone: int) -> str | None:
        """Why the start whose window ``load`` is must be measured again (None: keep it)."""
        return set_aside_reason(load, self.redo, redone)

    def open(self, journal: Callable[..., None], where: dict[str, object]) -> Opened:
        """Wait for a quiet machine where the rule says so; then the window's first reading."""
        if self.quiet is None:
            return Opened(self.read())
        waited, quiet = self.wait_quiet(self.quiet, journal, where)
        return Opened(self.read(), waited, quiet)

    def close(self, opened: Opened) -> MachineLoad:
        """The rest of the machine's load since ``opened``."""
        return machine_load(opened.snapshot, self.read(), opened.waited_s, opened.quiet)

    def wait_quiet(
        self, rule: QuietRule, journal: Callable[..., None], where: dict[str, object]
    ) -> tuple[float, bool]:
        """Look at the machine (``rule.look_s`` at a time) until other processes use at most
        the rule's share of the CPUs or another look would pass ``rule.max_wait_s``. A wait is
        journaled when it begins and when it ends; a machine quiet at the first look is not.
        Returns the seconds spent looking and whether the machine was quiet at the end."""
        first = previous = self.read()
        announced = False
        looks = 0
        while True:
            self.sleep(rule.look_s)
            now = self.read()
            looks += 1
            load = machine_load(previous, now)
            waited = max(0.0, now.monotonic - first.monotonic)
            step = quiet_step(load, rule, looks)
            if step == "quiet" and not announced:
                return waited, True
            if step != "wait" or not announced:
                journal(
                    CycleState.EXPERIMENT,
                    quiet_message(step, load, rule, waited),
                    step=JournalStep.QUIET,
                    waiting=step == "wait",
                    waited_s=round(waited, 1),
                    other_cpu_fraction=load.other_cpu_fraction,
                    cpus=load.cpus,
                    load_avg_1m=load.load_avg_1m,
                    **where,
                )
            if step != "wait":
                return waited, step == "quiet"
            announced = True
            previous = now
