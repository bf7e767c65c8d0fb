"""recovery.decide: every last durable state of a cycle maps to one action and outcome."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import CycleState, Event, Outcome
from mcp_infra.core.recovery import PRE_PROMOTION, Action, RecoveryDecision, decide

S = CycleState
T = datetime(2026, 11, 29, tzinfo=UTC)
RECIPE = {"candidate_id": "demo-tiny:draft-k4", "template": "mlx_lm_server", "model_path": "/m"}


def ev(state: CycleState, **fields: object) -> Event:
    return Event(ts=T, cycle_id="c-1", state=state, message="m", fields=fields)


def path_to(state: CycleState) -> list[Event]:
    order = [S.QUEUED, S.PREFLIGHT, S.PREPARE, S.BASELINE, S.MAINTENANCE, S.EXPERIMENT, S.SELECT]
    events = (
        [ev(s) for s in order[: order.index(state) + 1]]
        if state in order
        else [ev(s) for s in order]
    )
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
    events = path_to(S.COMMIT) + [
        ev(S.SEALED, step="enter", outcome="promoted"),
        ev(S.SEALED, step="failed"),
    ]
    decision = decide(events)
    assert (decision.action, decision.outcome) == (Action.FINISH_SEALING, Outcome.PROMOTED)


def test_sealed_cycle_needs_nothing() -> None:
    events = path_to(S.SELECT) + [
        ev(S.SEALED, step="enter", outcome="kept_baseline"),
        ev(S.SEALED, step="done"),
    ]
    assert decide(events).action == Action.NOTHING


# What each last state must lead to: restore before a verified promotion, keep after it.
EXPECTED = {
    **{s: (Action.RESTORE_PREVIOUS, Outcome.RESTORED_AFTER_ERROR) for s in PRE_PROMOTION},
    S.PROMOTE: (Action.RESTORE_PREVIOUS, Outcome.RESTORED_AFTER_ERROR),
    S.VERIFY: (Action.RESTORE_PREVIOUS, Outcome.RESTORED_AFTER_ERROR),
    S.COMMIT: (Action.KEEP_PROMOTION, Outcome.PROMOTED),
    S.ROLLBACK: (Action.RESTORE_PREVIOUS, Outcome.ROLLED_BACK),
}


def test_every_state_has_its_decision() -> None:
    assert set(EXPECTED) == set(CycleState) - {S.SEALED, S.RECOVER}
    for state, expected in EXPECTED.items():
        decision = decide(path_to(state))
        assert (decision.action, decision.outcome) == expected, state
        assert decision.last_state == state


def test_commit_then_rollback_is_a_rollback_not_a_kept_promotion() -> None:
    """Writing the committed state failed after COMMIT was journaled: the cycle was restoring the
    previous recipe (run_cycle's error path), so recovery finishes that, never re-commits."""
    events = path_to(S.COMMIT) + [ev(S.ROLLBACK, step="enter", error="cycle failed: OSError")]
    decision = decide(events)
    assert decision.action == Action.RESTORE_PREVIOUS
    assert decision.outcome == Outcome.RESTORED_AFTER_ERROR


def test_an_error_journaled_before_the_rollback_is_named_in_the_reason() -> None:
    """A full disk in EXPERIMENT: the error and the restore's lines were written, the sealing
    line was not. The sealed reason says what failed, not only that a rollback was cut short."""
    error = "cycle failed: OSError: [Errno 28] No space left on device"
    events = path_to(S.EXPERIMENT) + [
        ev(S.ROLLBACK, step="enter", error=error),
        ev(S.ROLLBACK, step="done"),
    ]
    decision = decide(events)
    assert (decision.action, decision.outcome) == (
        Action.RESTORE_PREVIOUS,
        Outcome.RESTORED_AFTER_ERROR,
    )
    assert decision.reason.startswith(error), decision.reason
    assert decision.reason.count("interrupted") == 1
    plain = decide(path_to(S.EXPERIMENT) + [ev(S.ROLLBACK, step="enter")])
    assert plain.outcome == Outcome.ROLLED_BACK and "cycle failed" not in plain.reason


def test_a_recoverys_own_lines_do_not_change_the_decision() -> None:
    """Recovery of a verified promotion journals RECOVER, then its restore (a ROLLBACK `done`
    line); if recovery is interrupted there, the next one keeps the promotion again."""
    events = path_to(S.COMMIT) + [
        ev(S.RECOVER, action="keep_promotion"),
        ev(S.ROLLBACK, step="done"),
    ]
    assert decide(events).action == Action.KEEP_PROMOTION


@pytest.mark.parametrize("outcome", ["promoted!", "", None, 7, "PROMOTED"])
def test_an_unknown_sealing_outcome_never_raises(outcome: object) -> None:
    events = path_to(S.COMMIT) + [ev(S.SEALED, step="enter", outcome=outcome)]
    decision = decide(events)  # no ValueError: recover must never crash on a journal line
    assert (decision.action, decision.outcome) == (Action.KEEP_PROMOTION, Outcome.PROMOTED)
    assert "not one mcp-infra knows" in decision.reason
    before = path_to(S.SELECT) + [ev(S.SEALED, step="enter", outcome=outcome)]
    assert decide(before).action == Action.RESTORE_PREVIOUS


# ---------------------------------------------------------------------------------------------
# Property: every journal a real cycle (and an interrupted recovery of it) can write maps to a
# decision that leaves exactly one recipe serving, and it is the promoted one iff the outcome says
# so. The journals follow cycle.run_cycle, promotion.promote/restore/conclude and
# supervisor.recover line by line; the world beside them is what the stable port runs and what
# state/active.json names.
# ---------------------------------------------------------------------------------------------

OLD, NEW = "old", "new"
Step = tuple[Event, dict[str, str]]  # a journal line, then the side effect that follows it


def _line(state: CycleState, **fields: object) -> Event:
    return ev(state, **fields)


def _seal_lines(outcome: Outcome) -> list[Step]:
    return [
        (_line(S.SEALED, step="enter", outcome=outcome.value), {}),
        (_line(S.SEALED, step="done"), {}),
    ]


def _restore_lines(error: bool) -> list[Step]:
    fields = {"error": "cycle failed: RuntimeError: x"} if error else {}
    return [
        (_line(S.ROLLBACK, step="enter", **fields), {}),
        (_line(S.ROLLBACK, step="done"), {"port": "active"}),
    ]


def real_cycle(branch: str, candidates: int, error_at: int | None) -> list[Step]:
    """The lines of one cycle, in the order cycle.py writes them, with their side effects."""
    steps: list[Step] = [
        (_line(S.QUEUED, plan_id="p"), {}),
        (_line(S.PREFLIGHT), {}),
        (_line(S.PREPARE, recipes={}), {}),
        (_line(S.BASELINE), {}),
        (_line(S.MAINTENANCE), {}),
    ]
    for i in range(candidates):
        steps += [
            (_line(S.EXPERIMENT, candidate=f"c{i}"), {}),
            (_line(S.EXPERIMENT, step="measuring", candidate=f"c{i}"), {}),
        ]
    steps.append((_line(S.SELECT), {}))
    if error_at is not None:  # an unexpected error after line `error_at` (run_cycle's except)
        cut = min(error_at, len(steps))
        return steps[:cut] + _restore_lines(error=True) + _seal_lines(Outcome.RESTORED_AFTER_ERROR)
    if branch == "kept":
        return steps + _seal_lines(Outcome.KEPT_BASELINE)
    steps.append((_line(S.PROMOTE, step="enter", recipe=RECIPE, previous="t"), {"port": NEW}))
    if branch == "winner_did_not_start":
        return steps + _restore_lines(error=False) + _seal_lines(Outcome.ROLLED_BACK)
    steps.append((_line(S.VERIFY, step="enter"), {}))
    if branch == "verify_failed":
        return (
            steps
            + [(_line(S.VERIFY, step="failed"), {})]
            + _restore_lines(error=False)
            + _seal_lines(Outcome.ROLLED_BACK)
        )
    steps += [(_line(S.VERIFY, step="passed"), {})]
    if branch == "commit_write_failed":  # COMMIT journaled, writing active.json raised OSError
        return (
            steps
            + [(_line(S.COMMIT), {})]
            + _restore_lines(error=True)
            + _seal_lines(Outcome.RESTORED_AFTER_ERROR)
        )
    return steps + [(_line(S.COMMIT), {"active": NEW})] + _seal_lines(Outcome.PROMOTED)


def apply(world: dict[str, str], effect: dict[str, str]) -> None:
    for key, value in effect.items():
        world[key] = world["active"] if value == "active" else value


def recover_world(events: list[Event], world: dict[str, str]) -> RecoveryDecision:
    """What supervisor.recover does to the world for a decision (the live recipe is active.json)."""
    decision = decide(events)
    if decision.action == Action.KEEP_PROMOTION:
        assert decision.promoted_recipe == RECIPE
        world["active"] = NEW
    if decision.action != Action.NOTHING:
        world["port"] = world["active"]  # _restore: ensure_serving(active_recipe)
    return decision


@settings(max_examples=200, deadline=None)
@given(
    branch=st.sampled_from(
        ["kept", "promoted", "winner_did_not_start", "verify_failed", "commit_write_failed"]
    ),
    candidates=st.integers(min_value=0, max_value=3),
    error_at=st.none() | st.integers(min_value=1, max_value=12),
    recovery_cut=st.integers(min_value=0, max_value=2),
)
def test_every_real_journal_prefix_leaves_exactly_one_recipe_serving(
    branch: str, candidates: int, error_at: int | None, recovery_cut: int
) -> None:
    steps = real_cycle(branch, candidates, error_at)
    for n in range(1, len(steps) + 1):
        world = {"port": OLD, "active": OLD}
        for _, effect in steps[:n]:
            apply(world, effect)
        events = [e for e, _ in steps[:n]]
        verified = any(e.state == S.VERIFY and _step_of(e) == "passed" for e in events)
        rolled_back_after = (
            verified
            and events
            and any(
                e.state == S.ROLLBACK for e in events[[e.state for e in events].index(S.VERIFY) :]
            )
        )
        decision = recover_world(events, world)
        assert world["port"] == world["active"], "exactly one recipe: the live one serves"
        if decision.action != Action.NOTHING:
            assert (world["port"] == NEW) == (decision.outcome == Outcome.PROMOTED), (
                branch,
                n,
                decision,
            )
            if verified and not rolled_back_after:
                assert world["port"] == NEW, "a verified promotion is never undone"
        # The recovery itself interrupted after `recovery_cut` of its own lines: decided again,
        # the outcome must not change.
        if decision.action == Action.NOTHING:
            continue
        outcome = decision.outcome or Outcome.RESTORED_AFTER_ERROR
        own = [
            _line(S.RECOVER, action=decision.action.value),
            _line(S.ROLLBACK, step="done"),
            _line(S.SEALED, step="enter", outcome=outcome.value),
        ]
        again = decide(events + own[: recovery_cut + 1])
        assert again.outcome == decision.outcome
        served = dict(world)
        recover_world(events + own[: recovery_cut + 1], served)
        assert served["port"] == served["active"] == world["port"]


def _step_of(event: Event) -> str:
    return str(event.fields.get("step", ""))


SEALING_PATHS = {
    "before promotion": path_to(S.EXPERIMENT),
    "promotion not verified": path_to(S.VERIFY),
    "verified promotion": path_to(S.COMMIT),
    "rollback": path_to(S.ROLLBACK),
    "sealing": path_to(S.SELECT)
    + [ev(S.SEALED, step="enter", outcome="kept_baseline", reason="r", selected=None)],
}


@pytest.mark.parametrize("name", sorted(SEALING_PATHS))
def test_the_reason_names_where_the_cycle_stopped_once(name: str) -> None:
    """Recovery seals ``decision.reason`` as it is: it says where the cycle was interrupted,
    and says it once (it used to be prefixed with the same words again)."""
    decision = decide(SEALING_PATHS[name])
    assert decision.reason.count("interrupted") == 1, decision.reason
    assert decision.last_state is not None
    assert (
        f"interrupted in {decision.last_state.value}" in decision.reason
        or "interrupted while sealing" in decision.reason
        or "interrupted during rollback" in decision.reason
    )


def test_finishing_a_seal_keeps_what_the_cycle_decided() -> None:
    events = path_to(S.COMMIT) + [
        ev(
            S.SEALED,
            step="enter",
            outcome="promoted",
            selected="demo-tiny:draft-k4",
            reason="qualified",
            speedup_pct=12.5,
        )
    ]
    decision = decide(events)
    assert decision.action == Action.FINISH_SEALING
    assert decision.decided == {
        "selected": "demo-tiny:draft-k4",
        "reason": "qualified",
        "speedup_pct": 12.5,
    }
