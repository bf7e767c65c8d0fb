"""How a speed ratio is said as a percentage, in one place (pure)."""

from __future__ import annotations

from mcp_infra.contracts import Verdict


def speedup_pct(ratio: float) -> float:
    """1.237 → 23.7: a candidate/baseline ratio as a percent change, rounded to 0.01."""
    return round((ratio - 1) * 100, 2)


def fmt_pct(ratio: float | None, digits: int = 1) -> str:
    """1.237 → "+23.7%"; None → "-"."""
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.{digits}f}%"


def selected_speedup_pct(verdict: Verdict, candidate: str | None) -> float | None:
    """The verdict's speedup estimate of ``candidate`` as a percent change (None if none)."""
    for item in verdict.candidates:
        if item.candidate == candidate and item.speedup_estimate is not None:
            return speedup_pct(item.speedup_estimate)
    return None
