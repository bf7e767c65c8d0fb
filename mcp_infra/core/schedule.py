"""Maintenance windows: may a cycle start now, and if not, when?

Pure functions of a policy ``Window``, an instant and a cycle budget (the only I/O is reading
which time zone this machine is in, for ``timezone: local``). Wall-clock times are interpreted in
the window's IANA zone with ``zoneinfo`` and every comparison is made in UTC, so windows that span
midnight and days when the clocks change are handled by the time-zone database, not by
arithmetic on local times:

* ``end`` earlier than ``start`` (say 22:00-02:00) spans midnight: the window that opens on one
  local day closes on the next.
* ``start == end`` in ``mode: window`` means the whole day (no end to enforce).
* A window's end is enforced: a cycle may start only if ``now + budget`` is at or before the end
  of the window that contains ``now``.
* A start time that does not exist on a spring-forward day is read with the offset before the
  change (zoneinfo's ``fold=0``), so 02:30 becomes 03:30 local; an ambiguous one on a fall-back
  day is its first occurrence.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, time, timedelta
from functools import partial
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict

from mcp_infra.contracts import Window

__all__ = ["WindowState", "check", "local_zone_name", "may_start", "occurrence", "zone_of"]


class WindowState(BaseModel):
    """The answer for one instant: is the window open, may a cycle of this budget start, why."""

    model_config = ConfigDict(extra="forbid")

    mode: str
    zone: str
    open: bool
    may_start: bool
    reason: str
    now_local: datetime
    opens_at: datetime | None = None
    closes_at: datetime | None = None
    next_start: datetime | None = None

    def wait_s(self, now: datetime) -> float | None:
        """Seconds from ``now`` until a cycle could start (0 if now; None if never)."""
        if self.may_start:
            return 0.0
        if self.next_start is None:
            return None
        return max(0.0, (self.next_start - now).total_seconds())


def local_zone_name() -> str:
    """This machine's IANA zone: ``$TZ`` if it names one, else the /etc/localtime link, else UTC."""
    env = os.environ.get("TZ", "").lstrip(":")
    if env and _valid(env):
        return env
    link = Path("/etc/localtime")
    try:
        target = str(link.resolve())
    except OSError:
        target = ""
    if "zoneinfo/" in target:
        name = target.split("zoneinfo/", 1)[1]
        if _valid(name):
            return name
    timezone_file = Path("/etc/timezone")
    if timezone_file.is_file():
        name = timezone_file.read_text(encoding="utf-8", errors="replace").strip()
        if _valid(name):
            return name
    return "UTC"


def _valid(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def zone_of(window: Window) -> ZoneInfo:
    return ZoneInfo(local_zone_name() if window.timezone == "local" else window.timezone)


def _hm(text: str) -> time:
    hour, minute = text.split(":")
    return time(int(hour), int(minute))


def occurrence(window: Window, day: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The window that opens on local ``day``: (start, end) in UTC; ends next day if it spans
    midnight."""
    start_t, end_t = _hm(window.start), _hm(window.end)
    end_day = day + timedelta(days=1) if end_t <= start_t else day
    start = datetime.combine(day, start_t, tzinfo=zone).astimezone(UTC)
    end = datetime.combine(end_day, end_t, tzinfo=zone).astimezone(UTC)
    return start, end


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)


def check(window: Window, now: datetime, budget_minutes: float = 0.0) -> WindowState:
    """May a cycle with this budget start at ``now`` (aware datetime) under ``window``?"""
    now = _utc(now)
    zone = zone_of(window)
    zone_name = str(zone.key)
    local = now.astimezone(zone)
    budget = timedelta(minutes=max(0.0, budget_minutes))
    state = partial(WindowState, mode=window.mode, zone=zone_name, now_local=local)
    if window.mode == "always" or (window.mode == "window" and window.start == window.end):
        why = (
            "the policy's window is 'always'"
            if window.mode == "always"
            else f"the window {window.start}-{window.end} {zone_name} spans the whole day"
        )
        return state(open=True, may_start=True, reason=why)
    if window.mode == "never":
        return state(
            open=False,
            may_start=False,
            reason="the policy's window is 'never': no cycle starts on its own "
            "(`mcp-infra supervise --ignore-window` runs queued plans now)",
        )
    spans = [occurrence(window, local.date() + timedelta(days=d), zone) for d in (-1, 0, 1, 2)]
    label = f"{window.start}-{window.end} {zone_name}"
    current = next(((s, e) for s, e in spans if s <= now < e), None)
    if current is not None:
        start, end = current
        if now + budget <= end:
            return state(
                open=True,
                may_start=True,
                opens_at=start,
                closes_at=end,
                reason=f"inside the window {label} until "
                f"{_show(end, zone)}; a {budget_minutes:g}-minute cycle fits",
            )
        following = next(s for s, _ in spans if s > now)
        return state(
            open=True,
            may_start=False,
            opens_at=start,
            closes_at=end,
            next_start=following,
            reason=f"the window {label} closes at {_show(end, zone)}; a cycle's "
            f"budget of {budget_minutes:g} minutes would run past it; next "
            f"window opens {_show(following, zone)}",
        )
    start, end = next((s, e) for s, e in spans if s > now)
    fits = start + budget <= end
    reason = f"outside the window {label}; it opens {_show(start, zone)}"
    if not fits:
        reason += (
            f", but a {budget_minutes:g}-minute cycle never fits in it: lengthen the window "
            "or lower budgets.cycle_minutes"
        )
    return state(
        open=False,
        may_start=False,
        opens_at=start,
        closes_at=end,
        next_start=start if fits else None,
        reason=reason,
    )


def may_start(window: Window, now: datetime, budget_minutes: float) -> tuple[bool, str]:
    state = check(window, now, budget_minutes)
    return state.may_start, state.reason


def _show(instant: datetime, zone: ZoneInfo) -> str:
    local = instant.astimezone(zone)
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()} ({instant.astimezone(UTC):%H:%M} UTC)"
