"""`mcp-infra supervise --watch`: keep supervising — run queued plans when the maintenance window
lets them start and finish, and (if the policy allows) re-check candidates that changed.

Each look: recover and run what is queued (``supervisor.supervise``, which enforces the window and
retries a failed cycle a bounded number of times with backoff); then, if
``policy.watch.recheck_changed`` is on, the queue is empty and the window allows a cycle, propose
a re-check of up to three candidates whose latest remembered outcome was judged under another
manifest, policy or environment (``memory.changed_candidates``). Each such change is re-checked
at most ``budgets.retries + 1`` times, waiting ``budgets.retry_backoff_s`` (doubled per attempt)
between attempts; the attempts are kept in ``state/watch.json``. Between looks it sleeps
``policy.watch.interval_s``, or until the window opens if that is sooner. It stops when a cycle
needs an operator, when ``max_cycles`` or ``max_looks`` is reached, or on SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcp_infra.contracts import CycleSummary, RecheckAttempt, WatchState
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state import memory
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.context import HomeContext, window_state
from mcp_infra.state.store import CorruptFile, Home, LockHeld, read_optional, write_model

__all__ = ["recheck_plan", "watch"]


def _state_path(home: Home) -> Path:
    return home.watch_file


def _load_state(home: Home) -> WatchState:
    try:
        return read_optional(_state_path(home), WatchState) or WatchState()
    except CorruptFile:
        return WatchState()


def recheck_plan(home: Home, now: float | None = None) -> tuple[dict[str, Any] | None, str]:
    """The re-check plan the watcher would propose now (None and why not, if none)."""
    ctx = HomeContext(home)
    policy = ctx.policy
    if not policy.watch.recheck_changed:
        return None, "the policy does not re-check changed candidates (watch.recheck_changed)"
    recipes = {
        f"{m.id}:{v.id}": resolve_recipe(
            m, v, home.models, home.hf_cache, runtimes=home.runtimes, builds=home.builds
        )
        for m in ctx.manifests.values()
        for v in m.variants
    }
    recipes = {c: r for c, r in recipes.items() if r.key() != ctx.live.key()}
    p_hash = ctx.policy_hash
    changed = memory.changed_candidates(home, recipes, p_hash)
    state = _load_state(home)
    attempts = state.rechecks
    now = time.time() if now is None else now
    env = memory.environment()
    due = []
    for cid, what in changed.items():
        key = sha256_bytes(
            json.dumps(
                [cid, recipes[cid].manifest_hash, p_hash, memory.environment_key(env, recipes[cid])]
            ).encode()
        )
        record = attempts.get(key, RecheckAttempt())
        if record.count > policy.budgets.retries:
            continue
        wait = policy.budgets.retry_backoff_s * 2 ** max(0, record.count - 1)
        if record.count and now - record.last < wait:
            continue
        due.append((cid, what, key))
    if not due:
        return None, "no changed candidate is due for a re-check"
    due = due[:3]
    for _, _, key in due:
        attempts[key] = RecheckAttempt(
            count=attempts.get(key, RecheckAttempt()).count + 1, last=now
        )
    write_model(_state_path(home), state)
    plan = {
        "hypothesis": "re-check: " + "; ".join(f"{c} ({w})" for c, w, _ in due)[:280],
        "candidates": [c for c, _, _ in due],
        "notes": "proposed by `mcp-infra supervise --watch` because what these candidates "
        "were judged under has changed",
    }
    return plan, f"re-checking {', '.join(c for c, _, _ in due)}"


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
    from mcp_infra.flows import api as app

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
            if not home.queued() and (state.may_start or ignore_window):
                plan, why = recheck_plan(home)
                if plan is not None:
                    view = app.propose(home, plan, proposed_by="watch", start_supervisor=False)
                    log(
                        f"watch: {why}: "
                        + (
                            "queued " + str(view.plan_id)
                            if view.accepted
                            else "refused: " + view.message
                        )
                    )
                    if view.accepted:
                        continue  # run it now
            if max_looks is not None and looks >= max_looks:
                break
            policy = HomeContext(home).policy
            pause = interval_s if interval_s is not None else policy.watch.interval_s
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
