"""How a speed ratio is said as a percentage, in one place (pure)."""

from __future__ import annotations


def speedup_pct(ratio: float) -> float:
    """1.237 → 23.7: a candidate/baseline ratio as a percent change, rounded to 0.01."""
    return round((ratio - 1) * 100, 2)


def fmt_pct(ratio: float | None, digits: int = 1) -> str:
    """1.237 → "+23.7%"; None → "-"."""
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.{digits}f}%"
