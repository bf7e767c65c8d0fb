"""Pure rules for the service through a cycle: memory admission, downtime, live-traffic limits,
route transitions. No I/O: the supervisor and the front call these with what they measured."""

from __future__ import annotations

from datetime import datetime
from types import EllipsisType
from typing import Literal

from pydantic import Field

from mcp_infra.contracts import FrontRoute, Part, Window

Mode = Literal["concurrent", "exclusive"]


class Admission(Part):
    """Whether a candidate may run beside the live backend, and why."""

    mode: Mode
    reason: str
    need_gb: float | None = Field(None, description="candidate peak + live footprint")
    budget_gb: float


def admit(
    candidate_peak_gb: float | None,
    live_footprint_gb: float | None,
    total_memory_gb: float,
    budget_fraction: float,
    *,
    peak_source: str = "manifest",
    live_source: str = "measured",
) -> Admission:
    """Concurrent only when both figures are known and their sum fits the budget; an unknown
    figure cannot prove a fit, so it means exclusive (never risk the live backend being killed)."""
    budget = round(total_memory_gb * budget_fraction, 2)
    if candidate_peak_gb is None or candidate_peak_gb <= 0:
        return Admission(
            mode="exclusive",
            budget_gb=budget,
            reason="the candidate's peak memory is unknown, so running it beside the "
            "live backend cannot be shown to fit",
        )
    live = live_footprint_gb or 0.0
    need = round(candidate_peak_gb + live, 2)
    words = (
        f"candidate peak {candidate_peak_gb:.2f} GB ({peak_source}) + live backend "
        f"{live:.2f} GB ({live_source}) = {need:.2f} GB"
    )
    if need <= budget:
        return Admission(
            mode="concurrent",
            need_gb=need,
            budget_gb=budget,
            reason=f"{words} fits the memory budget of {budget:.2f} GB "
            f"({budget_fraction:.0%} of {total_memory_gb:.1f} GB)",
        )
    return Admission(
        mode="exclusive",
        need_gb=need,
        budget_gb=budget,
        reason=f"{words} exceeds the memory budget of {budget:.2f} GB "
        f"({budget_fraction:.0%} of {total_memory_gb:.1f} GB): the live backend "
        "is stopped while candidates run",
    )


def combine(admissions: list[Admission]) -> Admission | None:
    """One mode per cycle: exclusive if any candidate needs it (the first such one says why)."""
    if not admissions:
        return None
    for item in admissions:
        if item.mode == "exclusive":
            return item
    return max(admissions, key=lambda a: a.need_gb or 0.0)


def expected_downtime_s(
    mode: Mode, *, candidates: int, per_candidate_s: float, load_s: float
) -> float:
    """Seconds the stable endpoint is expected not to serve. Concurrent: none (the front
    switches between two running backends). Exclusive: every candidate's experiment while the
    live backend is stopped, plus reloading the live backend, plus a promotion's swap."""
    if mode == "concurrent":
        return 0.0
    return round(candidates * (per_candidate_s + load_s) + 2 * load_s, 1)


UnservedAction = Literal["run", "hold", "refuse"]


def unserved_limit(
    mode: Mode, unserved_s: float | None, limit_s: float | None, window: Window
) -> tuple[UnservedAction, str]:
    """Whether a plan whose stable endpoint is projected to go ``unserved_s`` seconds unserved
    may run whenever the window lets it (``run``), waits for the maintenance window (``hold``),
    or cannot run under this policy (``refuse``), and why. Only an exclusive plan leaves the
    endpoint unserved; an unknown projection cannot show it stays within the limit. A window
    that is always open (mode ``always``, or a whole-day window) is no maintenance window, and
    ``never`` opens none, so a plan over the limit is refused there."""
    if limit_s is None or mode != "exclusive":
        return "run", ""
    if unserved_s is not None and unserved_s <= limit_s:
        return "run", (
            f"projected {unserved_s:.0f} s unserved, within service.max_unserved_s "
            f"({limit_s:.0f} s)"
        )
    over = (
        f"this exclusive-mode plan is projected to leave the stable endpoint unserved for "
        f"about {unserved_s:.0f} s, over service.max_unserved_s ({limit_s:.0f} s)"
        if unserved_s is not None
        else "this exclusive-mode plan's unserved time cannot be projected (no measured "
        f"timings), so it cannot be shown to stay within service.max_unserved_s ({limit_s:.0f} s)"
    )
    if window.mode == "window" and window.start != window.end:
        return "hold", (
            f"{over}: it runs only inside the maintenance window {window.start}-{window.end} "
            f"{window.timezone}"
        )
    fix = "set a maintenance window (window.mode: window) or raise service.max_unserved_s"
    if window.mode == "never":
        return "refuse", f"{over}, and the policy's window is 'never': {fix}"
    return "refuse", (
        f"{over}, and the policy has no maintenance window to wait for (its window is always "
        f"open): {fix}"
    )


def route_to(
    current: FrontRoute | None,
    *,
    mode: Literal["serve", "hold"],
    now: datetime,
    backend_url: str | None = None,
    candidate_id: str | None = None,
    max_hold_s: float | None = None,
    scope: str | None | EllipsisType = ...,  # ...: keep the current route's scope
    reason: str = "",
) -> FrontRoute:
    """The next route: a new generation, so the supervisor can wait for the front to adopt it.
    Holding keeps the backend it held for (a restarted front still knows what comes back);
    serving needs a backend."""
    if mode == "serve" and not backend_url:
        raise ValueError("a serving route needs a backend")
    url = backend_url or (current.backend_url if current else None)
    cid = candidate_id or (current.candidate_id if current and not backend_url else None)
    return FrontRoute(
        generation=(current.generation + 1) if current else 1,
        mode=mode,
        backend_url=url,
        candidate_id=cid,
        max_hold_s=max_hold_s
        if max_hold_s is not None
        else (current.max_hold_s if current else 120.0),
        scope=(current.scope if current else None) if scope is ... else scope,
        reason=reason[:300],
        updated_at=now,
    )


def hold_expired(waited_s: float, max_hold_s: float) -> bool:
    return waited_s >= max_hold_s


def retry_after_s(max_hold_s: float) -> int:
    """What a 503 tells the client to wait: a swap is bounded by the hold, so retry within it."""
    return max(1, min(int(max_hold_s), 30))
