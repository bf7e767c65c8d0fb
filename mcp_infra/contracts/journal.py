"""The cycle's journal: states, steps inside a state, outcomes, one line (Event)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from mcp_infra.contracts.base import Contract, JSONValue


class CycleState(StrEnum):
    QUEUED = "QUEUED"
    PREFLIGHT = "PREFLIGHT"
    PREPARE = "PREPARE"
    BASELINE = "BASELINE"
    MAINTENANCE = "MAINTENANCE"
    EXPERIMENT = "EXPERIMENT"
    SELECT = "SELECT"
    PROMOTE = "PROMOTE"
    VERIFY = "VERIFY"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    RECOVER = "RECOVER"
    SEALED = "SEALED"


class JournalStep(StrEnum):
    """Where inside a state a journal line stands (``Event.fields["step"]``). Recovery, the cost
    record and the verifier read these; a line without one is its state's entry."""

    ENTER = "enter"
    MEASURING = "measuring"  # EXPERIMENT: a fresh server is ready and being measured
    JUDGED = "judged"  # EXPERIMENT: the selector's look after a round
    SCREENED = "screened"  # EXPERIMENT: what screening dropped after its round (core.screening)
    QUIET = "quiet"  # EXPERIMENT: a start waits for a quiet machine (fields: waiting, figures)
    SET_ASIDE = "set-aside"  # EXPERIMENT: a start other processes slowed is measured again
    DRIFT = "drift"  # SELECT: the baseline re-measured for drift
    WORKLOAD = "workload"  # SELECT: a decisive workload cell kept the baseline
    HELDOUT = "heldout"  # SELECT: the winner's held-out confirmation begins
    HELDOUT_PASSED = "heldout-passed"
    HELDOUT_FAILED = "heldout-failed"
    PASSED = "passed"  # VERIFY: the winner reproduced its measured outputs online
    FAILED = "failed"  # VERIFY, ROLLBACK, SEALED: that state's work failed
    SWITCHED = "switched"  # COMMIT: the front serves the winner
    DONE = "done"  # ROLLBACK: the previous recipe serves again; SEALED: evidence sealed
    NOTE = "note"  # SEALED: something not recorded, never a failure of the cycle


class Outcome(StrEnum):
    PROMOTED = "promoted"
    KEPT_BASELINE = "kept_baseline"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"
    RESTORED_AFTER_ERROR = "restored_after_error"
    NEEDS_OPERATOR = "needs_operator"


class Event(Contract):
    """One journal line."""

    ts: datetime
    cycle_id: str
    state: CycleState
    message: str
    fields: dict[str, JSONValue] = Field(default_factory=dict)

    @property
    def step(self) -> JournalStep:
        """The line's step; a line without one (or with one this version does not know, from an
        older or newer writer) counts as its state's entry only when it has none."""
        raw = self.fields.get("step")
        if raw is None:
            return JournalStep.ENTER
        try:
            return JournalStep(raw)
        except ValueError:
            return JournalStep.NOTE
