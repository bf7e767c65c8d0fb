"""`mcp-infra supervise --watch`: keep supervising — run queued plans when the maintenance window
lets them start and finish.

Each look recovers and runs what is queued (``supervisor.supervise``, which enforces the window and
retries a failed cycle a bounded number of times with backoff). Between looks it sleeps
``WATCH_INTERVAL_S`` (or ``--interval``), or until the window opens if that is sooner. It stops
when a cycle needs an operator, when ``max_cycles`` or ``max_looks`` is reached, or on
SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime

from mcp_infra.contracts import CycleSummary
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state.context import window_state
from mcp_infra.state.store import Home, LockHeld

__all__ = ["watch"]

WATCH_INTERVAL_S = 300.0
"""Seconds between looks of `supervise --watch` (``--interval`` sets another)."""


def _supervise_once(
    home: Home, ignore_window: bool, log: Callable[[str], None]
) -> list[CycleSummary]:
    """One look: what ``supervise`` ran, or nothing when another supervisor holds the lock or
    the home's disk is full (no cycle starts until it has room)."""
    try:
        return supervise(home, ignore_window=ignore_window)
    except LockHeld:
        log("watch: another supervisor holds the lock; looking again later")
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        log(f"watch: {exc.strerror}; looking again later")
    return []


def watch(
    home: Home,
    *,
    interval_s: float | None = None,
    max_cycles: int | None = None,
    max_looks: int | None = None,
    ignore_window: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
) -> list[CycleSummary]:
    """Supervise until stopped (see the module notes); return the cycles it ran."""
    summaries: list[CycleSummary] = []
    stop = {"flag": False}

    def _stop(signum: int, _frame: object) -> None:
        stop["flag"] = True
        log(f"watch: signal {signum}: stopping after this look")

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not the main thread: the caller stops us by max_looks or max_cycles instead
        with contextlib.suppress(ValueError):
            previous[sig] = signal.signal(sig, _stop)
    looks = 0
    try:
        while not stop["flag"]:
            looks += 1
            ran = _supervise_once(home, ignore_window, log)
            for summary in ran:
                log(f"watch: {summary.cycle_id}: {summary.outcome.value} ({summary.reason})")
            summaries += ran
            if (home.needs_operator_file).exists():
                log("watch: the service needs an operator (`mcp-infra recover`); stopping")
                break
            if max_cycles is not None and len(summaries) >= max_cycles:
                break
            state = window_state(home)
            if max_looks is not None and looks >= max_looks:
                break
            pause = interval_s if interval_s is not None else WATCH_INTERVAL_S
            if home.queued() and not state.may_start and not ignore_window:
                wait = state.wait_s(datetime.now(UTC))
                log(f"watch: queued plans wait: {state.reason}")
                if wait is not None:
                    pause = min(pause, max(1.0, wait))
            sleep(pause)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summaries
