"""recovery.decide: every last durable state of a cycle maps to one action and outcome."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mcp_infra.contracts import CycleState, Event, Outcome
from mcp_infra.core.recovery import PRE_PROMOTION, Action, decide

S = CycleState
T = datetime(2026, 11, 29, tzinfo=UTC)
RECIPE = {"candidate_id": "demo-tiny:draft-k4", "template": "mlx_lm_server", "model_path": "/m"}


def ev(state: CycleState, **fields: object) -> Event:
    return Event(ts=T, cycle_id="c-1", state=state, message="m", fields=fields)


def path_to(state: CycleState) -> list[Event]:
    order = [S.QUEUED, S.PREFLIGHT, S.PREPARE, S.BASELINE, S.MAINTENANCE, S.EXPERIMENT, S.SELECT]
    events = [ev(s) for s in order[: order.index(state) + 1]] if state in order else [
        ev(s) for s in order]
    if state in (S.PROMOTE, S.VERIFY, S.COMMIT, S.ROLLBACK):
        events.append(ev(S.PROMOTE, step="enter", recipe=RECIPE))
    if state in (S.VERIFY, S.COMMIT):
        events.append(ev(S.VERIFY, step="enter"))
    if state == S.COMMIT:
        events += [ev(S.VERIFY, step="passed"), ev(S.COMMIT)]
    if state == S.ROLLBACK:
        events.append(ev(S.ROLLBACK, step="enter"))
    return events


def test_empty_journal_means_nothing_was_touched() -> None:
    assert decide([]).action == Action.NOTHING


@pytest.mark.parametrize("state", sorted(PRE_PROMOTION))
def test_before_promotion_the_live_recipe_is_restored(state: CycleState) -> None:
    decision = decide(path_to(state))
    assert decision.action == Action.RESTORE_PREVIOUS
    assert decision.outcome == Outcome.RESTORED_AFTER_ERROR
    assert decision.last_state == state


@pytest.mark.parametrize("state", [S.PROMOTE, S.VERIFY])
def test_promotion_not_yet_verified_is_undone(state: CycleState) -> None:
    decision = decide(path_to(state))
    assert decision.action == Action.RESTORE_PREVIOUS
    assert decision.outcome == Outcome.RESTORED_AFTER_ERROR
    assert "before verification passed" in decision.reason


def test_verified_promotion_is_kept_even_before_commit() -> None:
    events = path_to(S.VERIFY) + [ev(S.VERIFY, step="passed")]
    decision = decide(events)
    assert decision.action == Action.KEEP_PROMOTION
    assert decision.outcome == Outcome.PROMOTED
    assert decision.promoted_recipe == RECIPE


def test_committed_promotion_is_kept() -> None:
    decision = decide(path_to(S.COMMIT))
    assert (decision.action, decision.outcome) == (Action.KEEP_PROMOTION, Outcome.PROMOTED)


def test_interrupted_rollback_is_finished() -> None:
    decision = decide(path_to(S.ROLLBACK))
    assert (decision.action, decision.outcome) == (Action.RESTORE_PREVIOUS, Outcome.ROLLED_BACK)


def test_failed_verification_is_not_mistaken_for_a_pass() -> None:
    events = path_to(S.VERIFY) + [ev(S.VERIFY, step="failed")]
    assert decide(events).action == Action.RESTORE_PREVIOUS


def test_sealing_interrupted_keeps_the_decided_outcome() -> None:
    events = path_to(S.COMMIT) + [ev(S.SEALED, step="enter", outcome="promoted")]
    decision = decide(events)
    assert (decision.action, decision.outcome) == (Action.FINISH_SEALING, Outcome.PROMOTED)


def test_a_failed_seal_keeps_the_outcome_decided_before_it() -> None:
    events = path_to(S.COMMIT) + [ev(S.SEALED, step="enter", outcome="promoted"),
                                  ev(S.SEALED, step="failed")]
    decision = decide(events)
    assert (decision.action, decision.outcome) == (Action.FINISH_SEALING, Outcome.PROMOTED)


def test_sealed_cycle_needs_nothing() -> None:
    events = path_to(S.SELECT) + [ev(S.SEALED, step="enter", outcome="kept_baseline"),
                                  ev(S.SEALED, step="done")]
    assert decide(events).action == Action.NOTHING


def test_every_state_has_a_decision() -> None:
    for state in CycleState:
        if state in (S.SEALED, S.RECOVER):
            continue
        decision = decide(path_to(state))
        assert decision.action in set(Action) and decision.reason
