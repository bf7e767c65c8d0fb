"""The cycle's journal: one line per transition, appended (fsynced) before its side effect, so
``recovery.decide`` can always tell what a killed cycle had done; the supervisor's record and
the cycle in progress are rewritten beside each line, for ``status``.

``Journal`` is the one that writes a home's files; ``JournalWriter`` is what measurement needs
of any journal (the cost projection passes one that keeps nothing).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import psutil

from mcp_infra.contracts import (
    CurrentCycle,
    CycleState,
    Event,
    JournalStep,
    SupervisorRecord,
)
from mcp_infra.errors import Interrupted
from mcp_infra.state.store import (
    Home,
    utcnow,
    write_model,
)

PAUSE_ENV = "MCP_INFRA_PAUSE_AT"
"""``STATE`` or ``STATE:step``: a journal line there pauses its process until a test releases
it (fault injection: ``demo.faults``)."""


class JournalWriter(Protocol):
    """What measurement needs of a journal: the cycle's id and a way to append one line
    (``Journal``; the cost projection passes one that keeps nothing)."""

    cycle_id: str

    def __call__(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: Any
    ) -> None: ...


class Journal:
    """A cycle's journal in its home: ``journal(state, message, step, **fields)`` appends one
    line (fsynced), then records the supervisor and the cycle in progress beside it."""

    def __init__(self, home: Home, cycle_id: str) -> None:
        self.home = home
        self.cycle_id = cycle_id

    def __call__(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: Any
    ) -> None:
        """Append the event (fsynced) first; then, if asked to, pause here for fault injection."""
        if step is not None:
            fields = {"step": JournalStep(step).value, **fields}
        self.home.append_event(
            Event(ts=utcnow(), cycle_id=self.cycle_id, state=state, message=message, fields=fields)
        )
        write_model(self.home.supervisor_file, supervisor_record(self.cycle_id))
        write_model(
            self.home.current_file,
            CurrentCycle(
                cycle_id=self.cycle_id,
                state=state,
                message=message,
                **{k: v for k, v in fields.items() if k in {"candidate", "index", "total"}},
            ),
        )
        at = JournalStep(step or JournalStep.ENTER).value
        pause = os.environ.get(PAUSE_ENV)
        if pause and (pause == f"{state.value}:{at}" or (pause, at) == (state.value, "enter")):
            marker = self.home.state / f"paused-at-{pause.replace(':', '-')}"
            marker.write_text(f"{os.getpid()}\n")
            while marker.exists():  # a seam for tests: wait until killed, or released (unlinked)
                time.sleep(0.1)
            os.environ.pop(PAUSE_ENV, None)  # released: the seam holds once per process

    def quietly(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: Any
    ) -> None:
        """A line on a failure path: a journal that cannot be written (a full disk) must not stop
        the restore that follows; recovery then decides from the lines that were written."""
        with contextlib.suppress(OSError):
            self(state, message, step, **fields)


def supervisor_record(cycle_id: str | None) -> SupervisorRecord:
    """This process as the home's supervisor, running ``cycle_id`` (None: between cycles)."""
    return SupervisorRecord(
        pid=os.getpid(),
        create_time=psutil.Process().create_time(),
        started_at=utcnow(),
        cycle_id=cycle_id,
    )


class _Stops:
    """A stop signal that reached a held step, for ``stops_held`` to raise as the step ends."""

    depth = 0
    pending: int | None = None


_STOPS = _Stops()


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """A step that a stop request (SIGINT, SIGTERM through ``stop_requested``) does not split:
    one that arrives meanwhile raises ``Interrupted`` as the step ends."""
    _STOPS.depth += 1
    try:
        yield
    finally:
        _STOPS.depth -= 1
    if _STOPS.depth == 0 and _STOPS.pending is not None:
        signum, _STOPS.pending = _STOPS.pending, None
        raise Interrupted(signum)


def stop_requested(signum: int) -> None:
    """What a long-running command's SIGINT or SIGTERM handler does: raise ``Interrupted`` in
    the main thread now, or, inside a held step (``stops_held``), as that step ends."""
    if _STOPS.depth:
        _STOPS.pending = signum
        return
    raise Interrupted(signum)
