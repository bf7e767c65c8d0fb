"""Several agents at once: plans proposed over MCP's streamable HTTP at the same moment while a
cycle runs, and a plan proposed just as a supervisor finds its queue empty. Each plan is
accounted for exactly once (run, queued or refused with the reason), none lost, none run
twice, and the journal, the audit log and the sealed evidence stay whole.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from typing import Any

import pytest

from mcp_infra.contracts import FrozenPlan
from mcp_infra.demo.agents import agent_plans, http_face, propose_at_once
from mcp_infra.demo.faults import (
    queue_plan,
    release,
    start_live,
    supervisor,
    wait_for,
    wait_paused,
)
from mcp_infra.demo.homes import ONE_START, write_test_policy
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state import evidence
from mcp_infra.state.store import Home, flock_held, read_model
from tests.helpers.mcp_clients import audit, supervisors

AGENTS = 10
PAUSE = "EXPERIMENT:measuring"


def _queued_ids(home: Home) -> list[str]:
    return [read_model(entry, FrozenPlan).plan_id for entry in home.queued()]


def _cycles(home: Home) -> list[str]:
    return sorted(p.name for p in home.cycles.iterdir()) if home.cycles.is_dir() else []


@pytest.mark.anyio
async def test_ten_agents_propose_at_once_while_a_cycle_runs(
    home: Home, anyio_backend: str
) -> None:
    """While a cycle measures (its supervisor held at a journal line), ten sessions of the HTTP
    server propose at one moment: nine runnable plans are queued behind the running one, each
    once, in distinct positions, the tenth refused with its reason; every call is audited once;
    no second supervisor is started. Then the running cycle seals, the supervisor takes the
    first of the nine, and is stopped there by the operator (SIGTERM): that cycle is sealed as
    interrupted, the eight others wait in the queue, each once; both bundles verify and both
    journals are whole.

    Its first run found two agents told the same queue position (a plan frozen first and
    queued second sorts before the other); proposals now queue one at a time (the test of
    that interleaving is below)."""
    write_test_policy(home, **{**ONE_START, "max_tokens": 8})
    start_live(home)
    running = queue_plan(home)
    proc = supervisor(home, pause_at=PAUSE)
    try:
        wait_paused(home, PAUSE, proc, 300)
        with http_face(home) as face:
            answers = await propose_at_once(face, agent_plans(AGENTS))
        accepted = [a for a in answers if a.get("accepted")]
        refused = [a for a in answers if not a.get("accepted")]
        assert len(accepted) == AGENTS - 1, answers
        assert [a["is_error"] for a in refused] == [True], refused
        assert "not a candidate of the registry" in refused[0]["message"], refused
        ids = [a["plan_id"] for a in accepted]
        assert len(set(ids)) == len(ids)
        queue = _queued_ids(home)
        assert queue[0] == running and Counter(queue[1:]) == Counter(ids), queue
        positions = sorted(a["queue_position"] for a in accepted)
        assert positions == list(range(1, AGENTS)), positions  # behind the running plan
        calls = [r for r in audit(home) if r.client.startswith("mcp:")]
        assert len(calls) == AGENTS, calls
        assert Counter(r.plan_id for r in calls if r.accepted) == Counter(ids)
        assert [p.pid for p in supervisors(home)] == [proc.pid]  # the lock was held: none new

        release(home, PAUSE)
        wait_for(lambda: len(_cycles(home)) == 2, 600, "the next plan's cycle", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sealed = evidence.list_cycles(home)[::-1]  # oldest first
    assert [s.plan_id for s in sealed] == [running, queue[1]]
    assert [s.interrupted for s in sealed] == [False, True]
    for summary in sealed:
        assert evidence.verify(evidence.bundle_path(home, summary.cycle_id)).ok
        assert home.read_journal(summary.cycle_id)[1] == []
    assert _queued_ids(home) == queue[2:]  # each waits once, in the order proposed
    assert not supervisors(home)
    assert app.status(home).queue == queue[2:]


def test_a_plan_proposed_as_the_supervisor_finds_its_queue_empty_is_run(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving that left a plan in the queue with nobody to run it: the supervisor
    reads an empty queue; before it releases its lock an agent proposes, and the proposal's
    `ensure_supervisor` sees the lock held and starts none. The moment lasts as long as two
    file removals, so no client hits it on purpose from outside: the home's ``queued`` is
    wrapped to propose exactly then (the proposal itself is the real one). The supervisor
    looks at the queue again once its lock is released, and runs the plan."""
    write_test_policy(home, **{**ONE_START, "max_tokens": 8})
    start_live(home)
    late: list[str] = []
    proposing: list[bool] = []
    real = Home.queued

    def queued(self: Home) -> list[Any]:
        found = real(self)
        if not found and not proposing and flock_held(self.lock_file):
            proposing.append(True)  # once: the proposal reads the queue too
            plan = {"hypothesis": "a late agent's drafter", "candidates": ["demo-tiny:draft-k2"]}
            view = app.propose(self, plan, proposed_by="late agent")
            assert view.accepted and view.plan_id, view
            late.append(view.plan_id)
        return found

    monkeypatch.setattr(Home, "queued", queued)
    summaries = supervise(home)
    assert late, "the queue was never found empty under the lock"
    assert not supervisors(home)  # the proposal started none: the lock was held
    assert [s.plan_id for s in summaries] == late
    assert real(home) == []
    assert evidence.verify(evidence.bundle_path(home, summaries[0].cycle_id)).ok


def test_proposals_side_by_side_are_told_their_own_queue_positions(home: Home) -> None:
    """The interleaving behind two agents told the same position: proposal A is frozen, and
    before it is queued proposal B is frozen and queued. A plan's place in the queue is its
    freezing time, so A then sorts before B, and B had counted without it. Forced here by
    wrapping the home's ``enqueue`` to start B (a real proposal, in its own thread) when A
    reaches it; proposals now take turns, so B waits for A."""
    real = Home.enqueue
    other: list[threading.Thread] = []
    views: dict[str, Any] = {}

    def propose(name: str) -> None:
        plan = {"hypothesis": f"agent {name}", "candidates": ["demo-tiny:draft-k2"]}
        views[name] = app.propose(home, plan, proposed_by=name, start_supervisor=False)

    def enqueue(self: Home, plan: FrozenPlan) -> Any:
        if not other:
            other.append(threading.Thread(target=propose, args=("B",)))
            other[0].start()
            other[0].join(2)  # B is queued meanwhile unless it waits for A's turn
        return real(self, plan)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Home, "enqueue", enqueue)
        propose("A")
        other[0].join(60)
    queue = _queued_ids(home)
    told = {name: view.queue_position for name, view in views.items()}
    assert told == {"A": 1, "B": 2}, told
    assert queue == [views["A"].plan_id, views["B"].plan_id]
