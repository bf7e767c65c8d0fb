"""The supervisor: the one process that holds the home's lock, finishes or undoes unfinished
cycles (``recovery.decide`` on each journal), runs queued plans in order while the maintenance
window allows, and re-queues a plan whose cycle failed by error, a bounded number of times.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from mcp_infra.contracts import (
    CycleState,
    CycleSummary,
    FrozenPlan,
    Outcome,
    Recipe,
    SupervisorRecord,
)
from mcp_infra.core.recovery import Action, decide
from mcp_infra.errors import ServerUnavailable
from mcp_infra.flows.cycle import begin_cycle, run_cycle
from mcp_infra.flows.journal import Journal, stops_held, supervisor_record
from mcp_infra.flows.promotion import CycleResult, commit, conclude, restore
from mcp_infra.procs.identity import same_start
from mcp_infra.procs.logpipe import CYCLE_ROOM_BYTES, room_problem
from mcp_infra.procs.runtime import PortBusy, ServerStartError
from mcp_infra.procs.service import (
    ServiceError,
    ensure_serving,
    stop_stray_candidates,
)
from mcp_infra.state import evidence
from mcp_infra.state.context import (
    HomeContext,
    active_recipe,
    load_config,
    mark_needs_operator,
    window_state,
)
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    LockHeld,
    read_model,
    read_optional,
    utcnow,
    write_model,
)


def recover(home: Home, cause: str | None = None) -> list[str]:
    """Finish or undo every unfinished cycle, by ``recovery.decide`` on its journal. ``cause``:
    what ended the cycles, where it is known (a stop signal), said before recovery's reason."""
    notes: list[str] = []
    if not home.cycles.is_dir():
        return notes
    for cdir in sorted(p for p in home.cycles.iterdir() if p.is_dir()):
        cycle_id = cdir.name
        if (home.bundle_files(cycle_id).manifest).exists():
            continue
        events, problems = home.read_journal(cycle_id)
        decision = decide(events)
        if decision.action == Action.NOTHING and not events:
            continue
        if cause:
            decision = decision.model_copy(update={"reason": f"{cause}; {decision.reason}"})
        journal = Journal(home, cycle_id)
        plan = read_optional(CycleFiles(cdir).plan, FrozenPlan)
        journal(
            CycleState.RECOVER,
            decision.reason,
            action=decision.action.value,
            last_state=decision.last_state.value if decision.last_state else None,
            journal_problems=problems,
        )
        outcome = decision.outcome or Outcome.RESTORED_AFTER_ERROR
        selected, reason, speedup = None, decision.reason, None
        if decision.action == Action.KEEP_PROMOTION and decision.promoted_recipe:
            winner = Recipe.model_validate(decision.promoted_recipe)
            live = active_recipe(home)
            if live.key() != winner.key():
                commit(home, live, winner)
            selected = winner.candidate_id
            outcome = restore(home, journal, decision.reason, outcome=Outcome.PROMOTED)
        elif decision.action in (Action.RESTORE_PREVIOUS, Action.FINISH_SEALING):
            outcome = restore(home, journal, decision.reason, outcome=outcome)
        finishing = decision.action == Action.FINISH_SEALING and decision.decided
        if finishing and outcome == decision.outcome and decision.decided:
            # what the cycle decided is sealed, with how it came to be sealed
            selected = decision.decided.get("selected")
            speedup = decision.decided.get("speedup_pct")
            decided_reason = decision.decided.get("reason")
            if decided_reason:
                reason = f"{decided_reason} (sealed by recovery: {decision.reason})"
        if plan is None:
            notes.append(f"{cycle_id}: no readable plan; journal kept as is")
            continue
        conclude(
            home,
            plan,
            cycle_id,
            journal,
            events[0].ts if events else utcnow(),
            CycleResult(outcome, selected, reason, speedup),
            interrupted=True,
            recovery=decision.action.value,
        )
        _retire_queue_entries(home, plan.plan_id)  # an interrupted plan is never silently re-run
        notes.append(f"{cycle_id}: {decision.action.value} → {outcome.value}")
    return notes


def _retire_queue_entries(home: Home, plan_id: str) -> None:
    for entry in home.queued():
        if entry.stem.endswith(plan_id):
            home.retire(entry)


def failed_attempts(home: Home, plan_id: str) -> int:
    """Cycles of this plan that ended by an error (not by a decision), from sealed evidence."""
    return sum(
        1
        for s in evidence.list_cycles(home)
        if s.plan_id == plan_id
        and s.outcome == Outcome.RESTORED_AFTER_ERROR
        and s.reason.startswith("cycle failed")
    )


def _maybe_retry(home: Home, plan: FrozenPlan, summary: CycleSummary) -> None:
    """Re-queue a plan whose cycle failed by error, a bounded number of times, with backoff."""
    if summary.outcome != Outcome.RESTORED_AFTER_ERROR or not summary.reason.startswith(
        "cycle failed"
    ):
        return
    budgets = HomeContext(home).policy.budgets
    attempts = failed_attempts(home, plan.plan_id)
    if attempts > budgets.retries:
        return
    time.sleep(budgets.retry_backoff_s * 2 ** (attempts - 1))
    home.enqueue(plan)


@contextmanager
def supervising(home: Home) -> Iterator[None]:
    with home.supervisor_lock():
        write_model(home.supervisor_file, supervisor_record(None))
        try:
            yield
        finally:
            (home.supervisor_file).unlink(missing_ok=True)
            (home.current_file).unlink(missing_ok=True)


def supervise(home: Home, *, ignore_window: bool = False) -> list[CycleSummary]:
    """Recover, then run every queued plan in order; return when the queue is empty, or when
    the policy's maintenance window does not let the next cycle start and finish in time
    (``window.window_state``; the plan stays queued). ``ignore_window``: an operator's override.
    With the home's disk full no cycle starts: ``OSError`` (ENOSPC) with the reason, before
    anything is written; the plan stays queued.

    A plan queued after the last look at an empty queue, while the lock is still held, starts
    no supervisor (``proposal.ensure_supervisor`` sees the lock held), so the queue is looked at
    once more after the lock is released: a plan found then is run here, unless another
    supervisor took the lock first (it runs the plan)."""
    home.ensure()
    if home.queued() and (full := room_problem(home.root, CYCLE_ROOM_BYTES)) is not None:
        raise OSError(errno.ENOSPC, f"no cycle starts: {full}; the plan stays queued")
    summaries: list[CycleSummary] = []
    looked_again = False
    while True:
        try:
            with supervising(home):
                recover(home)
                _revive_front(home)
                emptied = _run_queue(home, summaries, ignore_window)
        except LockHeld:
            if looked_again:  # another supervisor took the lock after ours: it runs the plan
                return summaries
            raise
        if not (emptied and home.queued()):
            return summaries
        looked_again = True


def _run_queue(home: Home, summaries: list[CycleSummary], ignore_window: bool) -> bool:
    """Run queued plans in order, each summary added to ``summaries``; True when the queue was
    found empty (not stopped by the window or a need for a person)."""
    while True:
        if (home.needs_operator_file).exists():
            return False
        queued = home.queued()
        if not queued:
            return True
        if not ignore_window and not window_state(home).may_start:
            return False  # the plan waits in the queue for the window
        entry = queued[0]
        plan = read_model(entry, FrozenPlan)
        # A stop request (SIGINT, SIGTERM) lands before the plan is taken (it stays queued) or
        # after its cycle's first journal line (recovery seals it as interrupted), never between.
        with stops_held():
            begun = begin_cycle(home, plan)
        try:
            summary = run_cycle(home, plan, begun)
        finally:
            home.retire(entry)
        summaries.append(summary)
        _maybe_retry(home, plan, summary)


def _revive_front(home: Home) -> None:
    """A front that was started and died (its record remains) is restarted, and the route put
    back on the live backend; a service stopped on purpose (no record) stays stopped."""
    from mcp_infra.procs.front import front_record, front_running

    if front_record(home) is None or front_running(home):
        return
    with contextlib.suppress(ServerStartError, PortBusy, ServiceError, OSError, RuntimeError):
        ensure_serving(home, active_recipe(home), load_config(home))


def operator_recover(home: Home) -> list[str]:
    """`mcp-infra recover`: recover unfinished cycles, then clear needs-operator if the live
    recipe can be served again."""
    home.ensure()
    notes: list[str] = []
    with supervising(home):
        notes += recover(home)
        marker = home.needs_operator_file
        stopped = stop_stray_candidates(home)
        notes += [f"stopped stray candidate {s}" for s in stopped]
        live = active_recipe(home)
        try:
            done = ensure_serving(home, live, load_config(home))
        except ServerUnavailable as exc:
            notes.append(f"still needs an operator: {exc}")
            if not marker.exists():
                mark_needs_operator(home, "recover", str(exc))
            return notes
        notes.append(f"live recipe {live.candidate_id} serves ({done})")
        if marker.exists():
            marker.unlink()
            notes.append("needs-operator cleared")
    return notes


def _record(home: Home) -> SupervisorRecord | None:
    """The running supervisor's record (None: none, or a torn one)."""
    try:
        return read_optional(home.supervisor_file, SupervisorRecord)
    except CorruptFile:
        return None


def _exited(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited: gone, or a zombie its parent has not reaped yet."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def stop_supervisor(home: Home, timeout: float = 300.0, *, starting_s: float = 0.0) -> str:
    """Ask the home's supervisor to stop (SIGTERM: it seals the cycle it runs as interrupted and
    restores the live recipe, then exits; a queued plan stays queued) and wait for it; say what
    happened. ``starting_s``: how long to wait for the record of a supervisor that holds the
    lock, or was started for a queued plan, but has not written its record yet."""
    deadline = time.monotonic() + starting_s
    record = None
    while True:
        record = _record(home)
        if record is not None or time.monotonic() >= deadline:
            break
        if not (home.lock_is_held() or home.queued()):
            break
        time.sleep(0.2)
    if record is None:
        return "no supervisor was running"
    try:
        proc = psutil.Process(record.pid)
        if not same_start(proc.create_time(), record.create_time):
            return "the supervisor had already exited"
        proc.send_signal(signal.SIGTERM)
    except psutil.Error:
        return "the supervisor had already exited"
    deadline = time.monotonic() + timeout
    while not _exited(proc):  # not proc.wait(): the supervisor may be another's child
        if time.monotonic() > deadline:
            return f"the supervisor (pid {record.pid}) did not stop within {timeout:.0f} s"
        time.sleep(0.2)
    if record.cycle_id:
        return f"the supervisor stopped the cycle {record.cycle_id}"
    return "the supervisor stopped (no cycle was running)"


def stop_running(home: Home, timeout: float = 300.0) -> list[str]:
    """`supervise --stop` (and `service stop` while a cycle runs): stop the supervisor, then
    say how the cycle it ran was sealed and what stays queued."""
    running = _record(home) if home.lock_is_held() else None
    lines = [stop_supervisor(home, timeout, starting_s=2.0)]
    cycles = evidence.list_cycles(home)
    if running and running.cycle_id and cycles and cycles[0].cycle_id == running.cycle_id:
        c = cycles[0]
        sealed = "sealed as interrupted" if c.interrupted else "sealed"
        lines.append(f"cycle {c.cycle_id} {sealed}: {c.outcome.value} — {c.reason}")
    if queued := home.queued():
        lines.append(
            f"{len(queued)} plan(s) still queued: the next `mcp-infra supervise` runs them"
        )
    return lines
