"""How far a running cycle is, and how long its measuring has left, from its journal alone.

Pure: journal events and the time now in, a ``Progress`` out. The journal says, per server
start, which round it belongs to (``round``), its place in that round (``index`` of ``total``)
and the phase (``measure`` or ``heldout``); the MAINTENANCE event gives the protocol's
``min_starts`` and ``max_starts``. So the time left in the measuring rounds is bounded from the
starts done so far: at least the rounds up to the minimum, at most the rounds up to the maximum
(early stopping lands in between). Requests inside one start are not journaled: progress moves
per start, not per request.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from mcp_infra.contracts import CycleState, Event


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str | None = None  # measure | heldout, while servers are started and measured
    round: int | None = None  # 1-based
    min_rounds: int | None = None
    max_rounds: int | None = None
    start_in_round: int | None = None  # 1-based place of the running start in its round
    starts_in_round: int | None = None
    starts_done: int = 0
    seconds_per_start: float | None = None
    left_s_low: float | None = None
    left_s_high: float | None = None
    left_note: str | None = None


def _starts(events: list[Event], phase: str) -> list[Event]:
    return [
        e
        for e in events
        if e.state == CycleState.EXPERIMENT
        and e.fields.get("step") == "enter"
        and e.fields.get("phase", "measure") == phase
    ]


def progress(events: list[Event], now: datetime) -> Progress:
    """Where the cycle is, and (while it measures) a low and a high bound on the time left."""
    plan = next((e.fields for e in reversed(events) if e.fields.get("max_starts")), {})
    low_rounds, high_rounds = plan.get("min_starts"), plan.get("max_starts")
    last = events[-1] if events else None
    if last is None or last.state != CycleState.EXPERIMENT:
        return Progress(min_rounds=low_rounds, max_rounds=high_rounds)
    current = next((e for e in reversed(events) if e.fields.get("step") == "enter"), None)
    if current is None:
        return Progress(min_rounds=low_rounds, max_rounds=high_rounds)
    phase = str(current.fields.get("phase", "measure"))
    starts = _starts(events, phase)
    done = len(starts) - 1
    index, total = int(current.fields.get("index") or 1), int(current.fields.get("total") or 1)
    round_no = int(current.fields.get("round") or 0) + 1
    out = Progress(
        phase=phase,
        round=round_no,
        min_rounds=low_rounds,
        max_rounds=high_rounds,
        start_in_round=index,
        starts_in_round=total,
        starts_done=max(done, 0),
    )
    if done < 1:
        out.left_note = "time left: known after the first start"
        return out
    # the most recent round's worth of starts: a configuration's first start also runs the
    # greedy passes, so the first round's starts are slower than the later ones
    recent = starts[-min(len(starts), total + 1) :]
    per_start = (recent[-1].ts - recent[0].ts).total_seconds() / (len(recent) - 1)
    in_start = max(0.0, per_start - (now - current.ts).total_seconds())
    this_round = in_start + (total - index) * per_start
    out.seconds_per_start = round(per_start, 1)
    if phase == "heldout":
        out.left_s_low = out.left_s_high = round(this_round, 1)
        out.left_note = "the held-out check; then promotion and verification, if it passes"
        return out
    later_low = max(0, (low_rounds or round_no) - round_no) * total * per_start
    later_high = max(0, (high_rounds or round_no) - round_no) * total * per_start
    out.left_s_low = round(this_round + later_low, 1)
    out.left_s_high = round(this_round + later_high, 1)
    out.left_note = (
        "measuring rounds only (early stopping ends them between the two bounds); the "
        "held-out check, promotion and verification follow"
    )
    return out


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min``, ``1 h 5 min``: a person's unit for a time left."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def left_text(p: Progress) -> str | None:
    """``about 40 s to 2 min left`` (or one figure when both bounds agree)."""
    if p.left_s_low is None or p.left_s_high is None:
        return None
    low, high = duration_text(p.left_s_low), duration_text(p.left_s_high)
    return f"about {low} left" if low == high else f"about {low} to {high} left"
