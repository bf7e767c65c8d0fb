"""What `status` says while a cycle runs (issue 20 item 3): notifications on change only,
progress per round and server start with the time left, the running plan shown as running.

Real MCP sessions (in-memory) on a home with no built models; the cycle's journal and state
records are written by the cycle's own ``Journal`` under the supervisor lock, as a supervisor
writes them. The same with a real front rewriting its status file: tests/faces/test_live_status.py.
"""

from __future__ import annotations

import json
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_infra.contracts import CycleState, Event, FrozenPlan
from mcp_infra.core.progress import left_text, progress
from mcp_infra.faces import render
from mcp_infra.faces.live_status import STATUS_URI, change_digest
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.flows import api as app
from mcp_infra.flows.journal import Journal
from mcp_infra.state.store import Home, read_journal_file, utcnow
from tests.helpers.paths import SHIPPED

pytestmark = pytest.mark.anyio
CYCLE = "c-20990101-000000-abcdef"


def shipped_journal() -> list[Event]:
    return read_journal_file(SHIPPED[0] / "journal.ndjson")[0]


def test_progress_moves_per_start_and_bounds_the_time_left() -> None:
    events = shipped_journal()
    selected = next(e.ts for e in events if e.state == CycleState.SELECT)
    seen = []
    for i, event in enumerate(events):
        if event.fields.get("step") != "enter" or event.fields.get("phase") != "measure":
            continue
        now = event.ts + timedelta(seconds=1)
        p = progress(events[: i + 1], now)
        assert (p.phase, p.round, p.start_in_round) == (
            "measure",
            event.fields["round"] + 1,
            event.fields["index"],
        )
        assert (p.min_rounds, p.max_rounds) == (2, 4)
        seen.append((p.round, p.start_in_round))
        if p.starts_done == 0:
            assert p.left_s_low is None and "after the first start" in (p.left_note or "")
            continue
        assert p.left_s_low is not None and p.left_s_high is not None
        assert 0 <= p.left_s_low <= p.left_s_high
        actual = (selected - now).total_seconds()
        if p.round >= 2:  # from the second round on, the bounds hold what happened
            assert p.left_s_low * 0.5 <= actual <= p.left_s_high * 1.5 + 5, (p, actual)
        assert left_text(p) and left_text(p).startswith("about ")  # type: ignore[union-attr]
    assert seen == sorted(seen), "progress only moves forward"
    assert len(seen) == len(set(seen)) == 13
    later = progress(events[:8], events[7].ts + timedelta(seconds=600))
    assert later.left_s_low is not None and later.left_s_low >= 0, "never negative"
    done = progress(events, events[-1].ts)
    assert done.round is None and done.left_s_low is None, "nothing measured after the rounds"


def test_the_held_out_check_is_its_own_phase() -> None:
    events = shipped_journal()
    second = [
        i
        for i, e in enumerate(events)
        if e.fields.get("phase") == "heldout" and e.fields.get("step") == "enter"
    ][1]
    p = progress(events[: second + 1], events[second].ts)
    assert p.phase == "heldout" and p.start_in_round == 2 and p.starts_in_round == 2
    assert p.left_s_low == p.left_s_high and p.left_s_low is not None
    assert "held-out" in (p.left_note or "")


def _run_cycle_events(home: Home, plan: FrozenPlan, upto: int) -> None:
    """Replay the shipped cycle's first ``upto`` events through the cycle's own Journal."""
    journal = Journal(home, CYCLE)
    for event in shipped_journal()[:upto]:
        fields = dict(event.fields)
        if event.state == CycleState.QUEUED:
            fields["plan_id"] = plan.plan_id
        journal(event.state, event.message, **fields)


def _queued_plan(home: Home) -> FrozenPlan:
    plan = FrozenPlan.model_validate_json((SHIPPED[0] / "plan.json").read_text())
    plan = plan.model_copy(update={"created_at": utcnow()})
    home.enqueue(plan)
    return plan


def test_the_running_plan_is_shown_as_running_not_queued(bare_home: Home) -> None:
    plan = _queued_plan(bare_home)
    assert app.status(bare_home).queue == [plan.plan_id]
    with bare_home.supervisor_lock():
        _run_cycle_events(bare_home, plan, 12)
        view = app.status(bare_home)
        text = render.status_text(view)
    assert view.queue == [] and view.cycle is not None and view.cycle.plan_id == plan.plan_id
    assert view.cycle.measuring is not None and view.cycle.measuring.round == 1
    assert f"running plan {plan.plan_id}" in text
    assert "Queue (waiting): empty." in text
    assert "round 1 of 2 to 4" in text and "start 4 of 4 in this round" in text
    assert "left of measuring" in text, text


async def test_an_idle_subscriber_is_told_nothing(bare_home: Home, anyio_backend: str) -> None:
    """Files rewritten with the same meaning (a front's probe timestamps, the clock in every
    age) are no news; a new round is; each change is told once."""
    plan = _queued_plan(bare_home)
    told: list[str] = []

    async def on_message(message: Any) -> None:
        uri = getattr(getattr(getattr(message, "root", message), "params", None), "uri", None)
        if uri is not None:
            told.append(str(uri))

    server = build_server(bare_home, "read-only", start_supervisor=False)
    notifier = server.status_notifier  # type: ignore[attr-defined]
    notifier.interval = 0.1
    probe = bare_home.state / "front_status.json"
    with bare_home.supervisor_lock():
        _run_cycle_events(bare_home, plan, 8)
        async with Client(server, mode="legacy", message_handler=on_message) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource(STATUS_URI)
            for tick in range(25):  # 2.5 s of rewrites, each with new bytes and a new mtime
                probe.write_text(json.dumps({"checked_at": str(utcnow()), "tick": tick}))
                (bare_home.state / "supervisor.json").touch()
                await anyio.sleep(0.1)
            assert told == [] and notifier.sent == 0, "nothing changed: nothing told"
            _run_cycle_events_from(bare_home, 8, 10)  # the next server start
            with anyio.fail_after(10):
                while not told:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)
            # two journal lines: one notice, or two when a look fell between them (a busy
            # machine), never more, and only for the status resource
            assert set(told) == {STATUS_URI} and 1 <= len(told) <= 2
            assert notifier.sent == len(told)


def _run_cycle_events_from(home: Home, start: int, stop: int) -> None:
    journal = Journal(home, CYCLE)
    for event in shipped_journal()[start:stop]:
        journal(event.state, event.message, **event.fields)


def test_the_digest_ignores_clocks_and_sees_meaning(bare_home: Home) -> None:
    plan = _queued_plan(bare_home)
    with bare_home.supervisor_lock():
        _run_cycle_events(bare_home, plan, 8)
        first = app.status(bare_home)
        later = first.model_copy(
            update={"cycle": first.cycle.model_copy(update={"elapsed_s": 999.0})}  # type: ignore[union-attr]
        )
        assert change_digest(first) == change_digest(later)
        _run_cycle_events_from(bare_home, 8, 10)
        assert change_digest(app.status(bare_home)) != change_digest(first)


async def test_a_proposal_followed_sends_progress_until_sealed(
    tmp_path: Path, anyio_backend: str
) -> None:
    """propose_plan with follow_s and a progress token: MCP progress notifications while the
    cycle moves (each further than the last), and a result once the cycle is sealed. The cycle
    is written by the cycle's own Journal and sealing (tests/helpers/synthetic_bundle.py), as a
    supervisor would, in a thread beside the session."""
    import threading

    from mcp_infra.demo.homes import make_home
    from mcp_infra.demo.models import build_demo_models
    from mcp_infra.state.store import read_model
    from tests.helpers.synthetic_bundle import seal_one

    home = make_home(tmp_path / "home", build_demo_models(tmp_path / "models"))
    server = build_server(home, start_supervisor=False)
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress / (total or 1.0), message))

    def supervisor() -> None:
        """Waits for the queued plan, journals part of a cycle, then seals the plan."""
        while not home.queued():
            time.sleep(0.05)
        plan = read_model(home.queued()[0], FrozenPlan)
        with home.supervisor_lock():
            journal = Journal(home, CYCLE)
            for event in shipped_journal()[:12]:
                fields = dict(event.fields)
                if event.state == CycleState.QUEUED:
                    fields["plan_id"] = plan.plan_id
                journal(event.state, event.message, **fields)
                time.sleep(0.35)
            home.current_file.unlink()
            seal_one(home, plan)
            for entry in home.queued():
                home.retire(entry)
            home.current_file.unlink(missing_ok=True)

    worker = threading.Thread(target=supervisor, daemon=True)
    worker.start()
    async with Client(server, mode="legacy") as client:
        plan = {"hypothesis": "a 2-token drafter is faster", "candidates": ["demo-tiny:draft-k2"]}
        with anyio.fail_after(120):
            result = await client.call_tool(
                "propose_plan", {"plan": plan, "follow_s": 90}, progress_callback=on_progress
            )
    worker.join(timeout=30)
    view = result.structured_content
    assert not result.is_error and view["accepted"], view
    assert "sealed: kept_baseline" in view["follow"], view["follow"]
    fractions = [f for f, _ in seen]
    assert len(seen) >= 4 and fractions == sorted(fractions), seen
    assert fractions[-1] == 1.0 and seen[-1][1] and "sealed" in seen[-1][1]
    assert any(m and "round 1 of 2 to 4" in m for _, m in seen), seen
