"""Maintenance windows: IANA zones, windows across midnight, and an enforced end."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml

from mcp_infra.contracts import Window
from mcp_infra.core.schedule import check, local_zone_name
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state.context import window_state
from mcp_infra.state.store import Home


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


NIGHT = {"mode": "window", "start": "22:00", "end": "02:00"}


@pytest.mark.parametrize(
    ("zone", "now", "budget", "may", "open_", "closes_utc", "phrase"),
    [
        # Berlin in January is UTC+1: the window is 21:00-01:00 UTC
        ("Europe/Berlin", utc(2026, 1, 10, 22, 30), 60, True, True, utc(2026, 1, 11, 1), "fits"),
        ("Europe/Berlin", utc(2026, 1, 10, 22, 30), 150, True, True, utc(2026, 1, 11, 1), "fits"),
        (
            "Europe/Berlin",
            utc(2026, 1, 10, 22, 30),
            151,
            False,
            True,
            utc(2026, 1, 11, 1),
            "would run past it",
        ),
        # after local midnight, still the window that opened the day before
        ("Europe/Berlin", utc(2026, 1, 11, 0, 30), 20, True, True, utc(2026, 1, 11, 1), "fits"),
        (
            "Europe/Berlin",
            utc(2026, 1, 11, 0, 30),
            45,
            False,
            True,
            utc(2026, 1, 11, 1),
            "would run past it",
        ),
        (
            "Europe/Berlin",
            utc(2026, 1, 11, 12, 0),
            30,
            False,
            False,
            utc(2026, 1, 12, 1),
            "opens 2026-01-11 22:00 CET (21:00 UTC)",
        ),
        # New York in January is UTC-5: the window is 03:00-07:00 UTC; the same instants differ
        (
            "America/New_York",
            utc(2026, 1, 10, 22, 30),
            60,
            False,
            False,
            utc(2026, 1, 11, 7),
            "opens 2026-01-10 22:00 EST (03:00 UTC)",
        ),
        ("America/New_York", utc(2026, 1, 11, 4, 0), 180, True, True, utc(2026, 1, 11, 7), "fits"),
        (
            "America/New_York",
            utc(2026, 1, 11, 4, 0),
            181,
            False,
            True,
            utc(2026, 1, 11, 7),
            "would run past it",
        ),
        # summer time: the same wall-clock window moves in UTC
        ("America/New_York", utc(2026, 7, 11, 2, 30), 60, True, True, utc(2026, 7, 11, 6), "fits"),
    ],
)
def test_window_across_midnight_in_two_zones(
    zone: str,
    now: datetime,
    budget: float,
    may: bool,
    open_: bool,
    closes_utc: datetime,
    phrase: str,
) -> None:
    state = check(Window(**NIGHT, timezone=zone), now, budget)
    assert (state.may_start, state.open) == (may, open_), state.reason
    assert state.closes_at == closes_utc
    assert state.zone == zone
    assert phrase in state.reason


def test_next_start_and_wait_are_given_when_closed() -> None:
    state = check(Window(**NIGHT, timezone="Europe/Berlin"), utc(2026, 1, 10, 22, 30), 240)
    # the open window is too short for 4 hours; the next one (21:00 UTC next day) fits exactly
    assert not state.may_start
    assert state.next_start == utc(2026, 1, 11, 21)
    assert state.wait_s(utc(2026, 1, 10, 22, 30)) == pytest.approx(22.5 * 3600)
    never_fits = check(Window(**NIGHT, timezone="Europe/Berlin"), utc(2026, 1, 10, 12), 300)
    assert never_fits.next_start is None and "never fits" in never_fits.reason


def test_dst_change_inside_a_window_is_measured_in_real_time() -> None:
    # Europe/Berlin falls back on 2026-10-25 at 03:00 CEST: 22:00-04:00 lasts 7 hours that night
    window = Window(mode="window", start="22:00", end="04:00", timezone="Europe/Berlin")
    opened = utc(2026, 10, 24, 20, 0)  # 22:00 CEST
    assert check(window, opened, 7 * 60).may_start
    assert not check(window, opened, 7 * 60 + 1).may_start


def test_always_never_and_whole_day() -> None:
    now = utc(2026, 3, 1, 12)
    assert check(Window(mode="always"), now, 10_000).may_start
    never = check(Window(mode="never"), now, 1)
    assert not never.may_start and "--ignore-window" in never.reason
    whole = Window(mode="window", start="05:00", end="05:00", timezone="Asia/Tokyo")
    assert check(whole, now, 600).may_start


def test_default_zone_is_the_machines_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Window().timezone == "local"
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert local_zone_name() == "Asia/Tokyo"
    state = check(Window(**NIGHT), utc(2026, 1, 10, 14, 0), 60)  # 23:00 in Tokyo
    assert state.zone == "Asia/Tokyo" and state.may_start
    with pytest.raises(ValueError, match="unknown IANA time zone"):
        Window(timezone="Mars/Olympus_Mons")


def test_supervise_leaves_a_plan_queued_outside_the_window(home: Home) -> None:
    """The window is enforced where cycles start: a queued plan waits, nothing is run."""
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["window"] = {"mode": "never", "start": "00:00", "end": "00:00", "timezone": "UTC"}
    path.write_text(yaml.safe_dump(data))
    from mcp_infra.flows import api as app

    view = app.propose(
        home,
        {"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"]},
        proposed_by="test",
        start_supervisor=False,
    )
    assert view.accepted, view
    assert not window_state(home).may_start
    assert supervise(home) == []
    assert len(home.queued()) == 1  # still waiting for the window
