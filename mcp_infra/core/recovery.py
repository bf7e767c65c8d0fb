"""What to do with an unfinished cycle: a pure function of its journal.

The journal is written before each side effect, so its last durable lines say how far a cycle got.
The rule that matters most: a promotion that already passed verification is kept, never undone.
"""

from __future__ import annotations

from enum import StrEnum

from mcp_infra.contracts import CycleState, Event, JournalStep, JSONValue, Outcome, Part

PRE_PROMOTION = {
    CycleState.QUEUED,
    CycleState.PREFLIGHT,
    CycleState.PREPARE,
    CycleState.BASELINE,
    CycleState.MAINTENANCE,
    CycleState.EXPERIMENT,
    CycleState.SELECT,
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
    promoted_recipe: dict[str, JSONValue] | None = None  # a Recipe as the journal holds it
    # FINISH_SEALING: the sealing line's selected, reason and speedup
    decided: dict[str, JSONValue] | None = None


def _outcome(event: Event) -> Outcome | None:
    """The outcome a sealing line recorded, or None when it is missing or not one we know."""
    raw = event.fields.get("outcome")
    if not isinstance(raw, str):
        return None
    try:
        return Outcome(raw)
    except ValueError:
        return None


def decide(events: list[Event]) -> RecoveryDecision:
    """Decide from the durable journal of one cycle what recovery must do. The reason says
    where the cycle was interrupted; it is sealed as the cycle's reason as it is."""
    if not events:
        return RecoveryDecision(
            action=Action.NOTHING,
            outcome=None,
            reason="the cycle left no journal lines; nothing was touched",
        )
    last = events[-1].state
    if any(e.state == CycleState.SEALED and e.step == JournalStep.DONE for e in events):
        return RecoveryDecision(
            action=Action.NOTHING,
            outcome=None,
            last_state=last,
            reason="the cycle is already sealed",
        )
    sealing = [e for e in events if e.state == CycleState.SEALED and "outcome" in e.fields]
    decided = _outcome(sealing[-1]) if sealing else None
    if decided is not None:
        fields = sealing[-1].fields
        return RecoveryDecision(
            action=Action.FINISH_SEALING,
            outcome=decided,
            last_state=last,
            decided={k: fields.get(k) for k in ("selected", "reason", "speedup_pct")},
            reason="interrupted while sealing: the outcome was already "
            f"decided ({decided.value}); finish sealing the evidence",
        )
    unreadable = (
        f"the sealing line's outcome {str(sealing[-1].fields.get('outcome'))[:40]!r} "
        "is not one mcp-infra knows, so it is decided again from the journal; "
        if sealing
        else ""
    )
    return _from_the_cycles_lines(events, unreadable)


def _from_the_cycles_lines(events: list[Event], unreadable: str) -> RecoveryDecision:
    """What to do for a cycle with no decided outcome: by how far its own lines got."""
    last = events[-1].state
    # The cycle's own lines: a recovery's lines (after RECOVER) replay a decision, never make one.
    first_recover = next(
        (i for i, e in enumerate(events) if e.state == CycleState.RECOVER), len(events)
    )
    own = events[:first_recover]
    states = {e.state for e in own}
    promote = [e for e in own if e.state == CycleState.PROMOTE and "recipe" in e.fields]
    recipe = promote[-1].fields["recipe"] if promote else None
    # What settled the promotion is the last of: verification passed, COMMIT, ROLLBACK. A ROLLBACK
    # after COMMIT (writing the committed state failed) means the cycle was rolling back.
    settling = [
        e
        for e in own
        if e.state in (CycleState.COMMIT, CycleState.ROLLBACK)
        or (e.state == CycleState.VERIFY and e.step == JournalStep.PASSED)
    ]
    if settling and settling[-1].state != CycleState.ROLLBACK:
        return RecoveryDecision(
            action=Action.KEEP_PROMOTION,
            outcome=Outcome.PROMOTED,
            last_state=last,
            promoted_recipe=recipe,
            reason=unreadable + f"interrupted in {last.value} after the promoted recipe had "
            "passed verification; keep it and commit",
        )
    if CycleState.ROLLBACK in states:
        # An error the cycle journaled before restoring is what the user needs to read first.
        errors = [
            str(e.fields["error"])[:400]
            for e in own
            if e.state == CycleState.ROLLBACK and "error" in e.fields
        ]
        return RecoveryDecision(
            action=Action.RESTORE_PREVIOUS,
            outcome=Outcome.RESTORED_AFTER_ERROR if errors else Outcome.ROLLED_BACK,
            last_state=last,
            reason=unreadable
            + (f"{errors[-1]}; then " if errors else "")
            + "interrupted during rollback; restore the previous recipe",
        )
    if CycleState.PROMOTE in states or CycleState.VERIFY in states:
        return RecoveryDecision(
            action=Action.RESTORE_PREVIOUS,
            outcome=Outcome.RESTORED_AFTER_ERROR,
            last_state=last,
            reason=unreadable + f"interrupted in {last.value} before "
            "verification passed; restore the previous recipe",
        )
    return RecoveryDecision(
        action=Action.RESTORE_PREVIOUS,
        outcome=Outcome.RESTORED_AFTER_ERROR,
        last_state=last,
        reason=unreadable + f"interrupted in {last.value}, "
        "before the service was touched; stop stray candidates and make "
        "sure the live recipe serves",
    )
