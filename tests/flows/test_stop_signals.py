"""A stop request (SIGINT, SIGTERM) and the plan the supervisor takes from the queue: the signal
lands before the plan is taken or after its cycle's first journal line, never between, so the
plan is either still queued or accounted for by recovery (sealed as interrupted), never lost.
In process, with the command's own handler (``stop_requested``) and a real SIGTERM sent from
inside the step it must not split."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from mcp_infra.contracts import CycleState
from mcp_infra.errors import Interrupted
from mcp_infra.flows import cycle
from mcp_infra.flows.journal import stop_requested, stops_held
from mcp_infra.flows.projection import simulated_plan
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.store import Home


@pytest.fixture
def raising_on_sigterm() -> Iterator[list[float]]:
    """SIGTERM handled as `mcp-infra supervise` does; the times it arrived are recorded."""
    seen: list[float] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(time.monotonic())
        stop_requested(signum)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_held_stop_is_delivered_as_the_step_ends(raising_on_sigterm: list[float]) -> None:
    done = []
    with pytest.raises(Interrupted) as stopped, stops_held():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler has run by now
        assert len(raising_on_sigterm) == 1
        done.append("the step")  # ...and the step went on to its end
    assert done == ["the step"] and stopped.value.signum == signal.SIGTERM
    with pytest.raises(Interrupted):  # outside a held step: at once
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)


def test_a_stop_while_a_plan_is_taken_comes_after_its_first_journal_line(
    bare_home: Home, raising_on_sigterm: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = simulated_plan(load_policy("default"), ["sim:a"])

    def stop_now(cdir: object, home: object) -> None:  # the step between the folder and the line
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(cycle.usage, "cycle_start", stop_now)
    begun = None
    with pytest.raises(Interrupted), stops_held():
        begun = cycle.begin_cycle(bare_home, plan)
    assert begun is not None  # the step finished before the stop was delivered
    events, problems = bare_home.read_journal(begun.cycle_id)
    assert problems == [] and [e.state for e in events] == [CycleState.QUEUED]
    assert events[0].fields["plan_id"] == plan.plan_id  # recovery finds the plan it accounts for
