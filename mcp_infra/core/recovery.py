"""What to do with an unfinished cycle: a pure function of its journal.

The journal is written before each side effect, so its last durable lines say how far a cycle got.
The rule that matters most: a promotion that already passed verification is kept, never undone.
"""

from __future__ import annotations

from enum import StrEnum

from mcp_infra.contracts import CycleState, Event, Outcome, Part

PRE_PROMOTION = {
    CycleState.QUEUED, CycleState.PREFLIGHT, CycleState.PREPARE, CycleState.BASELINE,
    CycleState.MAINTENANCE, CycleState.EXPERIMENT, CycleState.SELECT,
}


class Action(StrEnum):
    NOTHING = "nothing"
    FINISH_SEALING = "finish_sealing"
    RESTORE_PREVIOUS = "restore_previous"
    KEEP_PROMOTION = "keep_promotion"


class RecoveryDecision(Part):
    action: Action
    outcome: Outcome | None
    reason: str
    last_state: CycleState | None = None
    promoted_recipe: dict | None = None


def _step(event: Event) -> str:
    return str(event.fields.get("step", ""))


def decide(events: list[Event]) -> RecoveryDecision:
    """Decide from the durable journal of one cycle what recovery must do."""
    if not events:
        return RecoveryDecision(action=Action.NOTHING, outcome=None,
                                reason="the cycle left no journal lines; nothing was touched")
    last = events[-1].state
    states = {e.state for e in events}
    if any(e.state == CycleState.SEALED and _step(e) == "done" for e in events):
        return RecoveryDecision(action=Action.NOTHING, outcome=None, last_state=last,
                                reason="the cycle is already sealed")
    sealing = [e for e in events if e.state == CycleState.SEALED and "outcome" in e.fields]
    if sealing:
        outcome = Outcome(sealing[-1].fields.get("outcome", Outcome.RESTORED_AFTER_ERROR))
        return RecoveryDecision(action=Action.FINISH_SEALING, outcome=outcome, last_state=last,
                                reason="interrupted while sealing: the outcome was already "
                                f"decided ({outcome.value}); finish sealing the evidence")
    promote = [e for e in events if e.state == CycleState.PROMOTE and "recipe" in e.fields]
    recipe = promote[-1].fields["recipe"] if promote else None
    verified = any(e.state == CycleState.VERIFY and _step(e) == "passed" for e in events)
    if CycleState.COMMIT in states or verified:
        return RecoveryDecision(action=Action.KEEP_PROMOTION, outcome=Outcome.PROMOTED,
                                last_state=last, promoted_recipe=recipe,
                                reason="the promoted recipe had passed verification before the "
                                "interruption; keep it and commit")
    if CycleState.ROLLBACK in states:
        return RecoveryDecision(action=Action.RESTORE_PREVIOUS, outcome=Outcome.ROLLED_BACK,
                                last_state=last, reason="interrupted during rollback; restore "
                                "the previous recipe")
    if CycleState.PROMOTE in states or CycleState.VERIFY in states:
        return RecoveryDecision(action=Action.RESTORE_PREVIOUS,
                                outcome=Outcome.RESTORED_AFTER_ERROR, last_state=last,
                                reason=f"interrupted in {last.value} before verification passed; "
                                "restore the previous recipe")
    return RecoveryDecision(action=Action.RESTORE_PREVIOUS, outcome=Outcome.RESTORED_AFTER_ERROR,
                            last_state=last, reason=f"interrupted in {last.value}, before the "
                            "service was touched; stop stray candidates and make sure the live "
                            "recipe serves")
