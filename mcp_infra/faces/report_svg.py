"""The report's two kinds of chart, drawn as inline SVG by this module (no plotting library).

``interval_chart``: points with their intervals on a log axis of ratios, lines drawn across (1×,
the required speedup, the worst-prompt floor) and each point's A/A noise floor as a band from 1×.
``bar_panels``: a workload cell's figures side by side, one horizontal bar per configuration.
Elements a test (or a reader) looks for carry ids: ``<name>-point-<i>-<status>``,
``<name>-aa-floor-<i>``, ``<name>-<line id>``. Text is real SVG text (searchable, selectable),
in the page's own font.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

PALETTE = {"selected": "#2f6fb3", "qualified": "#3a8d4c", "inconclusive": "#c08a12"}
GREY = "#a3a8b0"
BASE_COLOR = "#3b4250"
INK, MUTED, GRID = "#1d2430", "#80868f", "#e3e7ee"
LABEL_W, ROW_H, FONT = 270, 36, 12
TICKS = (1.0, 0.9, 0.8, 0.67, 0.5, 0.33, 0.25, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def colour(status: str) -> str:
    """How a configuration is drawn: the baseline dark, a rejected one grey."""
    if status == "baseline":
        return BASE_COLOR
    return GREY if status == "rejected" else PALETTE.get(status, PALETTE["qualified"])


def _text(x: float, y: float, words: str, **attrs: object) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{_e(v)}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{FONT}"{extra}>{_e(words)}</text>'


def _svg(width: float, height: float, parts: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{_e(title)}" '
        'font-family="system-ui,-apple-system,Segoe UI,Roboto,sans-serif">'
        + "".join(parts)
        + "</svg>"
    )


@dataclass
class Point:
    label: str  # a second line after "\n"
    point: float
    low: float | None
    high: float | None
    status: str
    floor: float | None = None


@dataclass(frozen=True)
class Line:
    """A ratio drawn across the chart, dashed, with its legend words."""

    ratio: float
    label: str
    colour: str
    gid: str


class LogAxis:
    """Ratios on a log scale between ``x0`` and ``x1`` pixels."""

    def __init__(self, values: Sequence[float], x0: float, x1: float) -> None:
        self.low, self.high = min(values) / 1.12, max(values) * 1.12
        self.x0, self.x1 = x0, x1

    def x(self, value: float) -> float:
        span = math.log(self.high / self.low)
        return self.x0 + (self.x1 - self.x0) * math.log(value / self.low) / span

    def ticks(self) -> list[float]:
        """Round ratios inside the axis, at least a ninth of the axis apart."""
        gap = math.log(self.high / self.low) / 9
        chosen: list[float] = []
        for t in TICKS:
            if self.low <= t <= self.high and all(abs(math.log(t / k)) >= gap for k in chosen):
                chosen.append(t)
        return sorted(chosen)


def interval_chart(
    name: str, points: list[Point], title: str, lines: list[Line], xlabel: str
) -> str:
    """Points with intervals on a log axis (see the module's docstring); rejected points grey
    and hollow; a line at a ratio of 0 (any slowdown allowed) has no place on a log axis."""
    if not points:
        return "<p class='muted'>Nothing measured to chart.</p>"
    lines = [line for line in lines if line.ratio > 0]
    values = [1.0, *(v for p in points for v in (p.point, p.low, p.high, p.floor) if v and v > 0)]
    values += [line.ratio for line in lines]
    width, top = 960.0, 34.0
    axis = LogAxis(values, LABEL_W, width - 20)
    bottom = top + ROW_H * len(points)
    parts = [_text(width / 2, 20, title, text_anchor="middle", font_weight="600")]
    for t in axis.ticks():
        x = axis.x(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{GRID}"/>')
        parts.append(_text(x, bottom + 16, f"{t:g}×", text_anchor="middle", fill=MUTED))
    for i, p in enumerate(points):
        parts += _point(name, i, p, axis, top + ROW_H * i + ROW_H / 2)
    one = axis.x(1.0)
    parts.append(f'<line x1="{one:.1f}" y1="{top}" x2="{one:.1f}" y2="{bottom}" stroke="#444"/>')
    for line in lines:
        x = axis.x(line.ratio)
        parts.append(
            f'<line id="{_e(name)}-{_e(line.gid)}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" '
            f'y2="{bottom}" stroke="{line.colour}" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
    parts.append(_text((LABEL_W + width) / 2, bottom + 34, xlabel, text_anchor="middle"))
    legend = [(line.label, line.colour, "dash") for line in lines]
    if any(p.floor for p in points):
        legend.append(("A/A noise floor (the live recipe against itself)", "#d9dde3", "band"))
    parts += _legend(legend, LABEL_W, bottom + 56)
    return _svg(width, bottom + 66 + 18 * math.ceil(len(legend) / 2), parts, title)


def _point(name: str, i: int, p: Point, axis: LogAxis, y: float) -> list[str]:
    grey = p.status == "rejected"
    ink = colour(p.status)
    out = []
    if p.floor:
        x0, x1 = sorted((axis.x(1.0), axis.x(p.floor)))
        out.append(
            f'<rect id="{_e(name)}-aa-floor-{i}" x="{x0:.1f}" y="{y - 11:.1f}" '
            f'width="{x1 - x0:.1f}" height="22" fill="#d9dde3"/>'
        )
    first, _, second = p.label.partition("\n")
    out.append(
        _text(
            LABEL_W - 10,
            y - 2 if second else y + 4,
            first,
            text_anchor="end",
            fill=MUTED if grey else INK,
        )
    )
    if second:
        out.append(_text(LABEL_W - 10, y + 12, second, text_anchor="end", fill=MUTED))
    mark = [f'<g id="{_e(name)}-point-{i}-{_e(p.status)}">']
    if p.low is not None and p.high is not None:
        lo, hi = axis.x(p.low), axis.x(p.high)
        mark.append(
            f'<path d="M{lo:.1f} {y:.1f}H{hi:.1f}M{lo:.1f} {y - 5:.1f}V{y + 5:.1f}'
            f'M{hi:.1f} {y - 5:.1f}V{y + 5:.1f}" stroke="{ink}" stroke-width="2" fill="none"/>'
        )
    fill = "white" if grey else ink
    mark.append(
        f'<circle cx="{axis.x(p.point):.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="{ink}" '
        'stroke-width="2"/></g>'
    )
    return out + mark


def _legend(items: list[tuple[str, str, str]], x: float, y: float) -> list[str]:
    out = []
    for k, (label, ink, kind) in enumerate(items):
        lx, ly = x + (k % 2) * 340, y + 18 * (k // 2)
        if kind == "band":
            out.append(f'<rect x="{lx:.1f}" y="{ly - 9:.1f}" width="22" height="10" fill="{ink}"/>')
        else:
            out.append(
                f'<line x1="{lx:.1f}" y1="{ly - 4:.1f}" x2="{lx + 22:.1f}" y2="{ly - 4:.1f}" '
                f'stroke="{ink}" stroke-width="1.5" stroke-dasharray="6 4"/>'
            )
        out.append(_text(lx + 28, ly, label, fill=INK))
    return out


@dataclass(frozen=True)
class Panel:
    """One panel of bars: a title and, per configuration, its values (two values: the second
    drawn lighter beside the first, e.g. TTFT p99 beside p50)."""

    title: str
    values: list[tuple[float, ...]]


def bar_panels(title: str, labels: list[tuple[str, str]], panels: list[Panel]) -> str:
    """Horizontal bars, one row per (label, status), one panel per figure, sharing the rows."""
    width, top, label_w = 1000.0, 62.0, 200.0
    panel_w = (width - label_w - 20) / len(panels)
    bottom = top + 26 * len(labels)
    parts = [_text(width / 2, 18, title, text_anchor="middle", font_weight="600")]
    for r, (label, status) in enumerate(labels):
        y = top + 26 * r + 17
        parts.append(
            _text(
                label_w - 8,
                y,
                label,
                text_anchor="end",
                fill=MUTED if status == "rejected" else INK,
            )
        )
    for k, panel in enumerate(panels):
        parts += _panel(panel, labels, label_w + k * panel_w + 10, panel_w - 20, (top, bottom))
    return _svg(width, bottom + 24, parts, title)


def _panel(
    panel: Panel, labels: list[tuple[str, str]], x0: float, w: float, rows: tuple[float, float]
) -> list[str]:
    top, bottom = rows
    most = max((v for row in panel.values for v in row), default=0.0) or 1.0
    step = _nice(most / 4)
    scale = w / (step * math.ceil(most / step))
    name, _, note = panel.title.partition(" (")
    parts = [_text(x0 + w / 2, top - 22, name, text_anchor="middle", fill=INK)]
    if note:
        parts.append(_text(x0 + w / 2, top - 8, note.rstrip(")"), text_anchor="middle", fill=MUTED))
    tick = 0.0
    while tick <= most + step / 2:
        x = x0 + tick * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{GRID}"/>')
        parts.append(_text(x, bottom + 14, f"{tick:g}", text_anchor="middle", fill=MUTED))
        tick += step
    for r, ((_, status), row) in enumerate(zip(labels, panel.values, strict=True)):
        height = 18 / len(row)
        for j, value in enumerate(row):
            y = top + 26 * r + 4 + j * height
            parts.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{value * scale:.1f}" '
                f'height="{height - 1:.1f}" fill="{colour(status)}"'
                + (' fill-opacity="0.45"' if j else "")
                + "/>"
            )
    return parts


def _nice(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``raw``."""
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
