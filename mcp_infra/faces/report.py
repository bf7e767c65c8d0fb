"""`mcp-infra evidence report ID`: one self-contained HTML page, built around the decision.

The page needs nothing from any network: styles are inline, charts are matplotlib figures
rendered to SVG (glyphs as paths) and embedded as markup, the icon is a data: URI, and there is
no script. Every figure on it is one the bundle states: the verdict's own estimates and intervals
(no second statistics path), the run files' per-cell figures, the held-out check as the cycle's
own code reaches it from ``runs/heldout--*.json`` (and only where that matches the journal),
cost, service impact and the verification. Each figure is bound to where it comes from: an
element with ``data-src`` (``<file>#<JSON pointer>``) and ``data-fmt`` (a key of ``FORMATS``),
so a test, or a reader, can check every number against its source.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_infra.contracts import (
    CandidateRun,
    CycleCost,
    CycleSummary,
    EnvironmentFingerprint,
    FrozenPlan,
    ServiceImpact,
    Verdict,
)
from mcp_infra.state.store import CycleFiles, read_model, read_optional

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;
max-width:1180px;padding:0 1rem;color:#1d2430;line-height:1.45}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #d8dde6;padding-bottom:.2rem}h3{font-size:1rem;margin:1.2rem 0 .3rem}
.decision{font-size:1.1rem;background:#f3f6fa;border-left:5px solid #2f6fb3;padding:.6rem 1rem}
.ok{color:#1c7c3c;font-weight:600}.failed{color:#b3261e;font-weight:600}.skipped{color:#7a6500}
.warn{background:#fdf3e7;border-left:5px solid #c4572a;padding:.5rem 1rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}td,th{border:1px solid #d8dde6;
padding:.3rem .5rem;text-align:left;vertical-align:top}th{background:#f3f6fa}
td.n,th.n{text-align:right;white-space:nowrap}
tr.rejected td{color:#80868f;background:#f6f6f7}tr.selected td{background:#eef5ff}
.tag{display:inline-block;border-radius:3px;padding:0 .35rem;font-size:.8rem;font-weight:600}
.decisive{background:#2f6fb3;color:#fff}.reported{background:#d8dde6;color:#1d2430}
.headline{background:#1c7c3c;color:#fff}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.86em;
overflow-wrap:anywhere}
.muted{color:#5b6472;font-size:.9rem}figure{margin:.5rem 0}svg{max-width:100%;height:auto}
details{margin:.3rem 0}summary{cursor:pointer;color:#2f6fb3}
"""

NONE = "–"  # a figure the source holds as null

FORMATS: dict[str, Callable[[Any], str]] = {
    "x3": lambda v: f"{v:.3f}×",
    "pct2": lambda v: f"{v:+.2f}%",  # a percent change already in percent (summary.json)
    "pct1": lambda v: f"{v:.1f}%",
    "level": lambda v: f"{v * 100:.1f}%",  # a confidence, 0.955 → 95.5%
    "required": lambda v: f"{1 + v / 100:.3f}×",  # a minimum speedup in percent, as a ratio
    "tolerance": lambda v: f"{1 - v / 100:.3f}×",  # a largest slowdown in percent, as a ratio
    "tps": lambda v: f"{v:.1f}",
    "s3": lambda v: f"{v:.3f} s",
    "s2": lambda v: f"{v:.2f} s",
    "s1": lambda v: f"{v:.1f} s",
    "gb": lambda v: f"{v:.2f} GB",
    "j1": lambda v: f"{v:.1f} J",
    "int": lambda v: f"{int(v)}",
}

PALETTE = {"selected": "#2f6fb3", "qualified": "#3a8d4c", "inconclusive": "#c08a12"}
GREY = "#a3a8b0"
BASE_COLOR = "#3b4250"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def pointer(doc: str, *path: object) -> str:
    """``doc#/a/0/b`` (RFC 6901: ``~`` and ``/`` inside a key escaped as ``~0`` and ``~1``)."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return doc + "#/" + "/".join(parts)


def resolve(docs: dict[str, Any], ref: str) -> Any:
    doc, _, path = ref.partition("#")
    value = docs[doc]
    for token in path.split("/")[1:] if path else []:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    return value


@dataclass
class Sources:
    """The documents a page's figures come from, by name (a bundle file, or ``verification``,
    ``heldout`` and ``bundle`` for what the page was given or recomputed), and the markup that
    binds a figure to its source."""

    docs: dict[str, Any] = field(default_factory=dict)

    def get(self, ref: str) -> Any:
        return resolve(self.docs, ref)

    def num(self, ref: str, fmt: str, cls: str = "") -> str:
        value = self.get(ref)
        shown = NONE if value is None else FORMATS[fmt](value)
        klass = f" class='{cls}'" if cls else ""
        return f"<span{klass} data-src='{_e(ref)}' data-fmt='{fmt}'>{_e(shown)}</span>"

    def text(self, ref: str, limit: int | None = None, code: bool = False) -> str:
        value = self.get(ref)
        shown = NONE if value is None else str(value)
        trunc = ""
        if limit is not None and len(shown) > limit:
            shown, trunc = shown[:limit] + "…", f" data-trunc='{limit}'"
        tag = "code" if code else "span"
        return f"<{tag} data-src='{_e(ref)}'{trunc}>{_e(shown)}</{tag}>"

    def key(self, ref: str, code: bool = False) -> str:
        """The last key of ``ref`` itself (a dict's key, e.g. a model path), bound to it."""
        self.get(ref)
        shown = ref.rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
        tag = "code" if code else "span"
        return f"<{tag} data-src='{_e(ref)}' data-part='key'>{_e(shown)}</{tag}>"

    def has(self, ref: str) -> bool:
        try:
            return self.get(ref) is not None
        except (KeyError, IndexError, ValueError, TypeError):
            return False


# ---------------------------------------------------------------------------------------------
# What the page reads
# ---------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    bundle: Path
    summary: CycleSummary
    verdict: Verdict | None
    plan: FrozenPlan | None
    cost: CycleCost | None
    impact: ServiceImpact | None
    env: EnvironmentFingerprint | None
    runs: dict[str, tuple[str, CandidateRun]]  # selection runs by candidate: (doc name, run)
    heldout: dict[str, tuple[str, CandidateRun]]
    journal: list[dict[str, Any]]
    src: Sources


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", by_alias=True)


def load(bundle: Path, verification: Any | None) -> Loaded:
    files = CycleFiles(bundle)
    summary = read_optional(files.summary, CycleSummary)
    if summary is None:
        raise FileNotFoundError(f"{bundle} has no summary.json")
    verdict = read_optional(files.verdict, Verdict)
    plan = read_optional(files.plan, FrozenPlan)
    cost = read_optional(bundle / "cost.json", CycleCost)
    impact = read_optional(bundle / "service_impact.json", ServiceImpact)
    env = read_optional(files.environment, EnvironmentFingerprint)
    docs: dict[str, Any] = {
        "summary.json": _dump(summary),
        "verdict.json": _dump(verdict),
        "plan.json": _dump(plan),
        "cost.json": _dump(cost),
        "service_impact.json": _dump(impact),
        "environment.json": _dump(env),
        "verification": _dump(verification),
        "bundle": {"path": str(bundle)},
    }
    runs: dict[str, tuple[str, CandidateRun]] = {}
    heldout: dict[str, tuple[str, CandidateRun]] = {}
    for path in sorted(files.runs.glob("*.json")) if files.runs.is_dir() else []:
        run = read_model(path, CandidateRun)
        name = f"runs/{path.name}"
        docs[name] = _dump(run)
        if run.purpose == "selection":
            runs[run.candidate] = (name, run)
        elif run.purpose == "heldout":
            heldout[run.candidate] = (name, run)
    journal: list[dict[str, Any]] = []
    if files.journal.is_file():
        for line in files.journal.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    journal.append(json.loads(line))
                except ValueError:
                    journal.append({})
    docs["journal.ndjson"] = journal
    return Loaded(
        bundle, summary, verdict, plan, cost, impact, env, runs, heldout, journal, Sources(docs)
    )


@dataclass
class HeldOut:
    """The held-out check: the journal's record of it and, where the cycle's own code run again
    on the held-out run files reaches the same words, its figures (doc ``heldout``)."""

    candidate: str
    candidate_ref: str
    passed: bool
    journal_ref: str
    figures: bool  # the recomputed verdict is in the sources and matches the journal
    why_not: str = ""


def heldout_check(data: Loaded) -> HeldOut | None:
    """Find the journal's held-out record and re-derive its figures with the cycle's code."""
    index = next(
        (
            i
            for i, e in reversed(list(enumerate(data.journal)))
            if e.get("state") == "SELECT"
            and (e.get("fields") or {}).get("step") in ("heldout-passed", "heldout-failed")
        ),
        None,
    )
    if index is None:
        return None
    event = data.journal[index]
    candidate = str(event["fields"].get("candidate"))
    held = HeldOut(
        candidate=candidate,
        candidate_ref=pointer("journal.ndjson", index, "fields", "candidate"),
        passed=event["fields"]["step"] == "heldout-passed",
        journal_ref=pointer("journal.ndjson", index, "message"),
        figures=False,
    )
    if data.plan is None or data.verdict is None:
        held.why_not = "the bundle has no plan or verdict to re-derive it from"
        return held
    from mcp_infra.core.selector import DECISION_METHOD, select
    from mcp_infra.flows.confirm import as_measured, heldout_protocol

    if data.verdict.method != DECISION_METHOD:
        held.why_not = "the verdict was reached by another decision method than this mcp-infra's"
        return held
    base, win = data.heldout.get("baseline"), data.heldout.get(candidate)
    if base is None or win is None:
        held.why_not = "the held-out run files are not in the bundle"
        return held
    again = select(
        as_measured(base[1]),
        [as_measured(win[1])],
        data.plan.thresholds,
        heldout_protocol(data.plan.protocol),
        data.plan.auto_promote,
        confirmation=True,
    )
    (judged,) = again.candidates
    words = " ".join(judged.reasons)
    if event.get("message") not in (
        ("held-out prompts: " + words)[:1000],
        ("gain not seen on held-out prompts: " + words)[:1000],
    ):
        held.why_not = (
            "re-deriving it from the held-out run files does not give the journal's words"
        )
        return held
    data.src.docs["heldout"] = _dump(again)
    held.figures = True
    return held


# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------


def _table(
    rows: list[list[str]], head: list[str], cls: str = "", row_classes: list[str] | None = None
) -> str:
    out = [f"<table{f' id={cls!r}' if cls else ''}><tr>"]
    out += [f"<th>{h}</th>" for h in head]
    out.append("</tr>")
    for i, row in enumerate(rows):
        klass = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        out.append(f"<tr{klass}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _status(data: Loaded, i: int) -> str:
    """selected | qualified | inconclusive | rejected: how a candidate is drawn."""
    assert data.verdict is not None
    item = data.verdict.candidates[i]
    if item.candidate == data.verdict.selected:
        return "selected"
    return item.decision.value


def _failed_gates(data: Loaded, i: int) -> list[int]:
    assert data.verdict is not None
    return [j for j, g in enumerate(data.verdict.candidates[i].gates) if not g.passed]


def _why_rejected(data: Loaded, i: int) -> str:
    """The short reason, bound: the gates that failed, else the verdict's first reason."""
    src = data.src
    failed = _failed_gates(data, i)
    if failed:
        names = ", ".join(
            src.text(pointer("verdict.json", "candidates", i, "gates", j, "gate")) for j in failed
        )
        return f"{names} gate{'s' if len(failed) > 1 else ''} failed"
    return src.text(pointer("verdict.json", "candidates", i, "reasons", 0), limit=90)


def _chart_reason(data: Loaded, i: int) -> str:
    """The same reason as plain text, for a chart label."""
    assert data.verdict is not None
    item = data.verdict.candidates[i]
    failed = [item.gates[j].gate for j in _failed_gates(data, i)]
    if failed:
        return f"{', '.join(failed)} gate{'s' if len(failed) > 1 else ''} failed"
    short = _short_of(data, i)
    if short is not None:
        return "interval below the " + ("A/A noise floor" if short == "floor" else "threshold")
    return item.reasons[0][:60] + ("…" if len(item.reasons[0]) > 60 else "")


def _short_of(data: Loaded, i: int) -> str | None:
    """Which bar an inconclusive interval's lower end does not clear: "floor" (the A/A noise
    floor) or "threshold" (the required speedup), or None when it is another reason."""
    assert data.verdict is not None
    item = data.verdict.candidates[i]
    if item.ci_low is None:
        return None
    if item.noise_floor is not None and item.ci_low <= item.noise_floor:
        return "floor"
    if data.plan is not None and item.ci_low < 1 + data.plan.thresholds.min_speedup_pct / 100:
        return "threshold"
    return None


def _why_inconclusive(data: Loaded, i: int) -> str:
    """Bound: the interval's lower end against the bar it does not clear, else the reason."""
    src, at = data.src, pointer("verdict.json", "candidates", i)
    short = _short_of(data, i)
    if short == "floor":
        return (
            f"the interval's lower end {src.num(f'{at}/ci_low', 'x3')} does not clear the A/A "
            f"noise floor {src.num(f'{at}/noise_floor', 'x3')}"
        )
    if short == "threshold":
        return (
            f"the interval's lower end {src.num(f'{at}/ci_low', 'x3')} does not clear the "
            f"required {src.num(pointer('plan.json', 'thresholds', 'min_speedup_pct'), 'required')}"
        )
    return src.text(f"{at}/reasons/0", limit=120)


def _interval(src: Sources, ref: str, low: str, high: str, fmt: str = "x3") -> str:
    if not (src.has(f"{ref}/{low}") and src.has(f"{ref}/{high}")):
        return NONE
    return f"{src.num(f'{ref}/{low}', fmt)} to {src.num(f'{ref}/{high}', fmt)}"


def summary_table(data: Loaded, held: HeldOut | None) -> str:
    """One row per candidate: the decision and the figures it was taken on."""
    src, verdict = data.src, data.verdict
    if verdict is None:
        return "<p class='muted'>No verdict: selection did not run.</p>"
    rows, classes = [], []
    for i, item in enumerate(verdict.candidates):
        at = pointer("verdict.json", "candidates", i)
        status = _status(data, i)
        decision = src.text(f"{at}/decision")
        if status == "selected":
            decision = f"<b>{decision}, selected</b>"
        elif status == "rejected":
            decision += f": {_why_rejected(data, i)}"
        elif status == "inconclusive":
            decision += f": {_why_inconclusive(data, i)}"
        level = (
            f" <span class='muted'>at {src.num(f'{at}/interval_level', 'level')}</span>"
            if item.interval_level is not None
            else ""
        )
        worst = (
            f"{src.text(f'{at}/worst_prompt', code=True)} {src.num(f'{at}/worst_speedup', 'x3')}"
            if item.worst_prompt
            else NONE
        )
        gates = (
            " ".join(
                f"{src.text(f'{at}/gates/{j}/gate')}&nbsp;"
                + ("<span class='ok'>✓</span>" if g.passed else "<span class='failed'>✗</span>")
                for j, g in enumerate(item.gates)
            )
            or "<span class='muted'>none ran</span>"
        )
        rows.append(
            [
                src.text(f"{at}/candidate", code=True),
                decision,
                src.num(f"{at}/speedup_estimate", "x3"),
                _interval(src, at, "ci_low", "ci_high") + level,
                src.num(f"{at}/noise_floor", "x3"),
                _heldout_cell(data, held, item.candidate),
                worst,
                gates,
            ]
        )
        classes.append(status if status in ("selected", "rejected") else "")
    head = [
        "candidate",
        "decision",
        "speedup",
        "interval",
        "A/A noise floor",
        "held-out confirmation",
        "worst prompt",
        "gates",
    ]
    table = _table(rows, head, "summary", classes)
    rule = ""
    if data.plan is not None:
        t = pointer("plan.json", "thresholds")
        rule = (
            "<p class='muted'>Speedup: the candidate's decode tok/s over the live recipe's "
            "(geometric mean over prompts) in the headline workload cell. A candidate qualifies "
            "when its interval's lower end clears the required "
            f"{src.num(f'{t}/min_speedup_pct', 'required')} (minimum speedup "
            f"{src.num(f'{t}/min_speedup_pct', 'pct1')}) and the A/A noise "
            "floor (the speedup the live recipe shows against itself), its gates pass and no "
            f"prompt is slower than {src.num(f'{t}/worst_prompt_tolerance_pct', 'tolerance')}. "
            "The statistics are described in the README (“how the statistics decide”).</p>"
        )
    return table + rule


def _heldout_cell(data: Loaded, held: HeldOut | None, candidate: str) -> str:
    if held is None or held.candidate != candidate:
        return "<span class='muted'>not checked (only the selected candidate is)</span>"
    word = (
        "<span class='ok'>confirmed</span>"
        if held.passed
        else "<span class='failed'>not confirmed</span>"
    )
    if not held.figures:
        return f"{word} <span class='muted'>(see below)</span>"
    at = pointer("heldout", "candidates", 0)
    return (
        f"{data.src.num(f'{at}/speedup_estimate', 'x3')} "
        f"({_interval(data.src, at, 'ci_low', 'ci_high')}) {word}"
    )


# ---------------------------------------------------------------------------------------------
# Charts: the verdict's numbers, log-scaled, threshold and A/A floor drawn
# ---------------------------------------------------------------------------------------------


def _svg(fig: Any) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "mcp-infra"}):
        fig.savefig(
            buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None}
        )
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _log_axis(ax: Any, values: list[float]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    low, high = min(values) / 1.12, max(values) * 1.12
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    gap = math.log(high / low) / 9  # ticks at least a ninth of the axis apart
    ticks: list[float] = []
    for t in (1.0, 0.9, 0.8, 0.67, 0.5, 0.33, 0.25, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0):
        if low <= t <= high and all(abs(math.log(t / k)) >= gap for k in ticks):
            ticks.append(t)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.grid(axis="x", color="#e3e7ee")


@dataclass
class Point:
    label: str
    point: float
    low: float | None
    high: float | None
    status: str
    floor: float | None = None


def _charted(div_id: str, svg: str, rows: list[list[str]], head: list[str]) -> str:
    """A chart with the figures it draws, as a table a reader can open under it."""
    return (
        f"<div id='{div_id}'><figure>{svg}</figure>"
        + "<details><summary>the charted figures (from verdict.json)</summary>"
        + _table(rows, head)
        + "</details></div>"
    )


def interval_chart(
    name: str,
    points: list[Point],
    title: str,
    lines: list[tuple[float, str, str, str]],
    xlabel: str,
) -> str:
    """Points with intervals on a log axis; ``lines``: (ratio, label, colour, SVG id) drawn
    across; each point's A/A floor as a shaded band from 1× to it; rejected points grey and
    hollow. Artists carry SVG ids (``<name>-point-<i>-<status>``, ``<name>-aa-floor-<i>``,
    ``<name>-<line id>``) a test can find."""
    from matplotlib.figure import Figure

    if not points:
        return "<p class='muted'>Nothing measured to chart.</p>"
    fig = Figure(figsize=(10, 0.5 * len(points) + 1.9))
    ax = fig.add_subplot()
    lines = [line for line in lines if line[0] > 0]  # a floor of 0× (any slowdown) has no place
    values = [1.0] + [v for p in points for v in (p.point, p.low, p.high, p.floor) if v and v > 0]
    values += [r for r, _, _, _ in lines]
    floor_drawn = False
    for i, p in enumerate(points):
        y = len(points) - 1 - i
        grey = p.status == "rejected"
        color = GREY if grey else PALETTE.get(p.status, PALETTE["qualified"])
        if p.floor:
            ax.fill_betweenx(
                [y - 0.3, y + 0.3],
                1.0,
                p.floor,
                color="#d9dde3",
                linewidth=0,
                zorder=0,
                label=None if floor_drawn else "A/A noise floor (the live recipe against itself)",
                gid=f"{name}-aa-floor-{i}",
            )
            floor_drawn = True
        err = (
            [[p.point - p.low], [p.high - p.point]]
            if p.low is not None and p.high is not None
            else None
        )
        drawn = ax.errorbar(
            [p.point],
            [y],
            xerr=err,
            fmt="o",
            color=color,
            capsize=4,
            markersize=7,
            linewidth=1.8,
            markerfacecolor="white" if grey else color,
            zorder=3,
        )
        drawn.lines[0].set_gid(f"{name}-point-{i}-{p.status}")
    ax.set_yticks(range(len(points) - 1, -1, -1), labels=[p.label for p in points], fontsize=8)
    for tick, p in zip(ax.get_yticklabels(), points, strict=True):
        tick.set_color("#80868f" if p.status == "rejected" else "#1d2430")
    ax.axvline(1.0, color="#444", linewidth=1)
    for ratio, label, colour, gid in lines:
        ax.axvline(
            ratio,
            color=colour,
            linewidth=1.2,
            linestyle="--",
            label=label,
            zorder=2,
            gid=f"{name}-{gid}",
        )
    _log_axis(ax, values)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False, ncol=3)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.set_ylim(-0.6, len(points) - 0.4)
    fig.tight_layout()
    return _svg(fig)


def _threshold_lines(data: Loaded) -> list[tuple[float, str, str, str]]:
    if data.plan is None:
        return []
    pct = data.plan.thresholds.min_speedup_pct
    label = f"required {1 + pct / 100:.3f}× (minimum speedup {pct:g}%)"
    return [(1 + pct / 100, label, "#b3261e", "threshold")]


def candidates_chart(data: Loaded) -> str:
    src, verdict = data.src, data.verdict
    if verdict is None:
        return ""
    points, rows = [], []
    for i, item in enumerate(verdict.candidates):
        if item.speedup_estimate is None:
            continue
        status = _status(data, i)
        label = item.candidate + (
            f"\n{status}: {_chart_reason(data, i)}"
            if status in ("rejected", "inconclusive")
            else f"\n{status}"
        )
        points.append(
            Point(label, item.speedup_estimate, item.ci_low, item.ci_high, status, item.noise_floor)
        )
        at = pointer("verdict.json", "candidates", i)
        rows.append(
            [
                src.text(f"{at}/candidate", code=True),
                src.num(f"{at}/speedup_estimate", "x3"),
                src.num(f"{at}/ci_low", "x3"),
                src.num(f"{at}/ci_high", "x3"),
                src.num(f"{at}/noise_floor", "x3"),
                status,
            ]
        )
    svg = interval_chart(
        "candidates",
        points,
        "Decode speedup over the live recipe, headline cell (point and interval)",
        _threshold_lines(data),
        "candidate / live recipe, decode tok/s (log scale)",
    )
    head = ["candidate", "speedup", "interval low", "interval high", "A/A floor", "drawn as"]
    return _charted("chart-candidates", svg, rows, head)


def prompts_chart(data: Loaded) -> str:
    src, verdict = data.src, data.verdict
    if verdict is None:
        return ""
    points, rows = [], []
    for i, item in enumerate(verdict.candidates):
        status = _status(data, i)
        for k, p in enumerate(item.per_prompt):
            points.append(
                Point(f"{item.candidate} · {p.prompt_id}", p.speedup, p.ci_low, p.ci_high, status)
            )
            at = pointer("verdict.json", "candidates", i, "per_prompt", k)
            rows.append(
                [
                    src.text(pointer("verdict.json", "candidates", i, "candidate"), code=True),
                    src.text(f"{at}/prompt_id", code=True),
                    src.num(f"{at}/baseline_tps", "tps"),
                    src.num(f"{at}/candidate_tps", "tps"),
                    src.num(f"{at}/speedup", "x3"),
                    _interval(src, at, "ci_low", "ci_high"),
                ]
            )
    lines = _threshold_lines(data)
    if data.plan is not None:
        tol = data.plan.thresholds.worst_prompt_tolerance_pct
        lines.append(
            (
                1 - tol / 100,
                f"worst-prompt floor {1 - tol / 100:.3f}× (no prompt slower)",
                "#7a6500",
                "worst-prompt-floor",
            )
        )
    svg = interval_chart(
        "prompts",
        points,
        "Decode speedup per prompt (point and interval, as the verdict computed them)",
        lines,
        "candidate / live recipe, decode tok/s (log scale)",
    )
    head = ["candidate", "prompt", "live tok/s", "candidate tok/s", "speedup", "interval"]
    return _charted("chart-prompts", svg, rows, head)


# ---------------------------------------------------------------------------------------------
# Workload cells
# ---------------------------------------------------------------------------------------------

METRICS = (
    # label, key in a verdict cell (after candidate_/baseline_), key in a run file's cell, format
    ("aggregate output tok/s", "output_tps", "aggregate_tps", "tps"),
    ("TTFT p50", "ttft_p50_s", "ttft_p50_s", "s3"),
    ("TTFT p99", "ttft_p99_s", "ttft_p99_s", "s3"),
    ("decode tok/s", "decode_tps", "decode_tps", "tps"),
)


@dataclass
class CellRow:
    config: str
    status: str  # baseline | selected | qualified | inconclusive | rejected
    name_ref: str
    refs: dict[str, str]  # metric key → pointer (missing: not measured)
    ratio_ref: str | None = None  # aggregate ratio to the baseline
    ratio_low: str | None = None
    ratio_high: str | None = None
    decode_ratio_ref: str | None = None
    requests_ref: str | None = None
    source: str = ""


@dataclass
class Cell:
    request_class: str
    concurrency: int
    role: str
    headline: bool
    concurrency_ref: str
    rows: list[CellRow]


def _cell_keys(data: Loaded) -> list[tuple[str, int, str]]:
    keys: list[tuple[str, int, str]] = []
    for item in data.verdict.candidates if data.verdict else []:
        for c in item.cells:
            keys.append((c.request_class, c.concurrency, c.role))
    for _, run in [*data.runs.values()]:
        for f in run.cells:
            keys.append((f.request_class, f.concurrency, f.role))
    order: dict[tuple[str, int], int] = {
        (c.request_class, c.concurrency): i
        for i, c in enumerate(data.plan.protocol.workload if data.plan else [])
    }
    unique = list(dict.fromkeys(keys))
    return sorted(unique, key=lambda k: order.get((k[0], k[1]), len(order)))


def workload_cells(data: Loaded) -> list[Cell]:
    """Each workload cell's rows: the verdict's figures where the verdict judged the cell (the
    decisive ones), else the run files' (cells measured and reported, not decided on)."""
    cells = []
    verdict = data.verdict
    for request_class, concurrency, role in _cell_keys(data):
        key = (request_class, concurrency)
        judged = {
            i: j
            for i, item in enumerate(verdict.candidates if verdict else [])
            for j, c in enumerate(item.cells)
            if (c.request_class, c.concurrency) == key
        }
        rows: list[CellRow] = []
        concurrency_ref = ""
        headline = False
        if judged:
            i0, j0 = next(iter(judged.items()))
            at = pointer("verdict.json", "candidates", i0, "cells", j0)
            concurrency_ref = f"{at}/concurrency"
            headline = bool(data.src.get(f"{at}/headline"))
            rows.append(
                CellRow(
                    "baseline",
                    "baseline",
                    "",
                    {v: f"{at}/baseline_{v}" for _, v, _, _ in METRICS},
                    requests_ref=f"{at}/baseline_requests",
                    source="verdict.json",
                )
            )
        elif "baseline" in data.runs:
            doc, run = data.runs["baseline"]
            j = next(
                (j for j, f in enumerate(run.cells) if (f.request_class, f.concurrency) == key),
                None,
            )
            if j is not None:
                at = pointer(doc, "cells", j)
                concurrency_ref = f"{at}/concurrency"
                rows.append(
                    CellRow(
                        "baseline",
                        "baseline",
                        "",
                        {v: f"{at}/{r}" for _, v, r, _ in METRICS},
                        requests_ref=f"{at}/requests",
                        source=doc,
                    )
                )
        for i, item in enumerate(verdict.candidates if verdict else []):
            status = _status(data, i)
            name_ref = pointer("verdict.json", "candidates", i, "candidate")
            if i in judged:
                at = pointer("verdict.json", "candidates", i, "cells", judged[i])
                rows.append(
                    CellRow(
                        item.candidate,
                        status,
                        name_ref,
                        {v: f"{at}/candidate_{v}" for _, v, _, _ in METRICS},
                        ratio_ref=f"{at}/output_ratio",
                        ratio_low=f"{at}/output_ci_low",
                        ratio_high=f"{at}/output_ci_high",
                        decode_ratio_ref=f"{at}/decode_speedup",
                        requests_ref=f"{at}/candidate_requests",
                        source="verdict.json",
                    )
                )
                continue
            if item.candidate not in data.runs:
                continue
            doc, run = data.runs[item.candidate]
            j = next(
                (j for j, f in enumerate(run.cells) if (f.request_class, f.concurrency) == key),
                None,
            )
            if j is None:
                continue
            at = pointer(doc, "cells", j)
            concurrency_ref = concurrency_ref or f"{at}/concurrency"
            # Not the judged row above: a run's own figures, for a cell the verdict did not judge.
            rows.append(
                CellRow(
                    item.candidate,
                    status,
                    name_ref,
                    {v: f"{at}/{r}" for _, v, r, _ in METRICS},
                    ratio_ref=f"{at}/aggregate_vs_baseline",
                    decode_ratio_ref=f"{at}/decode_vs_baseline",
                    requests_ref=f"{at}/requests",
                    source=doc,
                )
            )
        if rows and concurrency_ref:
            cells.append(Cell(request_class, concurrency, role, headline, concurrency_ref, rows))
    return cells


def cell_chart(data: Loaded, cell: Cell) -> str:
    """The cell's figures side by side: aggregate output tok/s, TTFT p50/p99, decode tok/s."""
    from matplotlib.figure import Figure

    src = data.src
    fig = Figure(figsize=(11, 0.42 * len(cell.rows) + 1.3))
    axes = fig.subplots(1, 3, sharey=True)
    labels = [r.config for r in cell.rows]
    ys = list(range(len(cell.rows) - 1, -1, -1))

    def colour(row: CellRow) -> str:
        if row.status == "baseline":
            return BASE_COLOR
        return GREY if row.status == "rejected" else PALETTE.get(row.status, PALETTE["qualified"])

    def value(row: CellRow, metric: str) -> float:
        ref = row.refs.get(metric)
        got = src.get(ref) if ref and src.has(ref) else None
        return float(got) if got is not None else 0.0

    panels = [
        (axes[0], ["output_tps"], "aggregate output tok/s (higher is better)"),
        (
            axes[1],
            ["ttft_p50_s", "ttft_p99_s"],
            "TTFT p50 (solid) and p99 (light), s (lower is better)",
        ),
        (axes[2], ["decode_tps"], "decode tok/s per request (higher is better)"),
    ]
    for ax, metrics, title in panels:
        height = 0.7 / len(metrics)
        for k, metric in enumerate(metrics):
            offset = (k - (len(metrics) - 1) / 2) * height
            ax.barh(
                [y - offset for y in ys],
                [value(r, metric) for r in cell.rows],
                height=height * 0.92,
                color=[colour(r) for r in cell.rows],
                alpha=1.0 if k == 0 else 0.45,
            )
        ax.set_title(title, fontsize=8.5)
        ax.grid(axis="x", color="#e3e7ee")
        ax.tick_params(labelsize=8)
    axes[0].set_yticks(ys, labels=labels, fontsize=8)
    for tick, row in zip(axes[0].get_yticklabels(), cell.rows, strict=True):
        tick.set_color("#80868f" if row.status == "rejected" else "#1d2430")
    who = (
        "one request at a time"
        if cell.concurrency == 1
        else f"{cell.concurrency} requests at a time"
    )
    fig.suptitle(
        f"{cell.request_class} requests, {who} — {cell.role}"
        + (", headline" if cell.headline else ""),
        fontsize=10,
    )
    fig.tight_layout()
    return _svg(fig)


def cells_html(data: Loaded) -> str:
    src = data.src
    parts = []
    for cell in workload_cells(data):
        tags = f"<span class='tag {cell.role}'>{cell.role}</span>"
        several = cell.concurrency > 1
        if cell.headline:
            tags += (
                " <span class='tag headline'>headline: the speedup above is computed here</span>"
            )
        meaning = (
            "decisive: a candidate that loses here beyond the tolerance is not promoted"
            if cell.role == "decisive"
            else "reported: measured and shown, it does not decide"
        )
        parts.append(
            f"<h3 data-cell='{_e(cell.request_class)}@{cell.concurrency}'>{_e(cell.request_class)} "
            f"requests, {src.num(cell.concurrency_ref, 'int')} at a time {tags}</h3>"
            f"<p class='muted'>{meaning}."
            + (
                " With several requests in flight a user gets the aggregate output tok/s and "
                "waits the TTFT; each request's own decode speed leaves the waiting out."
                if several
                else ""
            )
            + "</p>"
        )
        parts.append(f"<figure>{cell_chart(data, cell)}</figure>")
        rows, classes = [], []
        for row in cell.rows:
            name = (
                "<b>baseline</b> (live recipe)"
                if row.status == "baseline"
                else src.text(row.name_ref, code=True)
            )
            figures = [
                src.num(row.refs[m], fmt) if src.has(row.refs[m]) else NONE
                for _, m, _, fmt in METRICS
            ]
            ratio = NONE
            if row.ratio_ref and src.has(row.ratio_ref):
                ratio = src.num(row.ratio_ref, "x3")
                if (
                    row.ratio_low
                    and src.has(row.ratio_low)
                    and row.ratio_high
                    and src.has(row.ratio_high)
                ):
                    ratio += f" ({src.num(row.ratio_low, 'x3')} to {src.num(row.ratio_high, 'x3')})"
            elif row.status == "baseline":
                ratio = ""
            decode_ratio = (
                src.num(row.decode_ratio_ref, "x3")
                if row.decode_ratio_ref and src.has(row.decode_ratio_ref)
                else ("" if row.status == "baseline" else NONE)
            )
            rows.append(
                [
                    name,
                    figures[0],
                    ratio,
                    figures[1],
                    figures[2],
                    figures[3],
                    decode_ratio,
                    src.num(row.requests_ref, "int") if row.requests_ref else NONE,
                    f"<span data-from='{_e(row.source)}'>"
                    + ("verdict" if row.source == "verdict.json" else "run file")
                    + "</span>",
                ]
            )
            classes.append(row.status if row.status in ("selected", "rejected") else "")
        parts.append(
            _table(
                rows,
                [
                    "configuration",
                    "aggregate output tok/s",
                    "vs baseline",
                    "TTFT p50",
                    "TTFT p99",
                    "decode tok/s",
                    "vs baseline",
                    "requests",
                    "from",
                ],
                row_classes=classes,
            )
        )
    if not parts:
        return "<p class='muted'>No per-cell figures in this bundle.</p>"
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# The decision, the held-out check, gates, cost, environment, verification
# ---------------------------------------------------------------------------------------------

OUTCOME_WORDS = {
    "promoted": "Promoted",
    "kept_baseline": "Kept the live recipe",
    "rolled_back": "Rolled back",
    "refused": "Refused",
    "restored_after_error": "Restored after an error",
    "needs_operator": "Needs an operator",
}


def _verified_online(data: Loaded) -> bool:
    return any(
        e.get("state") == "VERIFY" and (e.get("fields") or {}).get("step") == "passed"
        for e in data.journal
    )


def decision_html(data: Loaded, held: HeldOut | None) -> str:
    src, summary = data.src, data.summary
    word = OUTCOME_WORDS.get(summary.outcome.value, summary.outcome.value)
    if summary.outcome.value == "promoted" and summary.selected and data.verdict is not None:
        i = next(
            (k for k, c in enumerate(data.verdict.candidates) if c.candidate == summary.selected),
            None,
        )
        speed = ""
        if i is not None:
            at = pointer("verdict.json", "candidates", i)
            speed = (
                f": decode {src.num(f'{at}/speedup_estimate', 'x3')} the live recipe's "
                f"({src.num(pointer('summary.json', 'speedup_pct'), 'pct2')}, interval "
                f"{_interval(src, at, 'ci_low', 'ci_high')})"
            )
        confirmed = ""
        if held is not None and held.candidate == summary.selected and held.passed:
            confirmed = "; confirmed on held-out prompts" + (
                f" at {src.num(pointer('heldout', 'candidates', 0, 'speedup_estimate'), 'x3')}"
                if held.figures
                else ""
            )
        online = "; verified online on the stable port" if _verified_online(data) else ""
        line = (
            f"{word} {src.text(pointer('summary.json', 'selected'), code=True)}"
            f"{speed}{confirmed}{online}."
        )
    else:
        line = f"{word}."
    return (
        f"<p class='decision'>{line}</p>"
        f"<p class='muted'>The cycle's reason: {src.text(pointer('summary.json', 'reason'))}</p>"
    )


def verification_html(data: Loaded, verification: Any | None) -> str:
    if verification is None:
        return "<p class='warn'>Not verified: this page was rendered without a verification.</p>"
    src = data.src
    if not verification.failed:
        head = (
            "<p class='ok'>Evidence verified: every check passed or did not apply (signature, "
            "chain, hashes, every sample, verdict and gates recomputed; see Verification).</p>"
        )
    else:
        names = ", ".join(
            src.text(pointer("verification", "failed", i)) for i in range(len(verification.failed))
        )
        head = (
            f"<p class='failed'>Evidence does NOT verify: failed {names}. The figures below are "
            "what the bundle claims, not what it proves.</p>"
        )
    fp = pointer("verification", "key_fingerprint")
    if verification.key_fingerprint is None:
        key = f"<p class='warn'>{src.text(pointer('verification', 'key_note'))}</p>"
    else:
        pinned = pointer("verification", "pinned_fingerprint")
        if verification.key_trust == "home":
            trust = "<span class='ok'>this home's own key</span>"
        elif verification.key_trust == "pinned":
            trust = "<span class='ok'>the fingerprint pinned with --fingerprint</span>"
        elif verification.pinned_fingerprint:
            trust = (
                "<b>NOT the pinned key</b> (pinned: "
                f"{src.text(pinned, limit=16, code=True)}), so this bundle is not shown to be "
                "signed by the pinned key"
            )
        else:
            trust = (
                "<b>NOT this home's key and NOT pinned</b>: the signature shows only that "
                "whoever holds this key sealed these files, not who that is. Compare the "
                "fingerprint with one the bundle's owner published apart from the bundle, then "
                "pin it with --fingerprint"
            )
        klass = "muted" if verification.key_trust in ("home", "pinned") else "warn"
        key = (
            f"<p class='{klass}' id='key'>Signed with the key "
            f"{src.text(fp, limit=16, code=True)} (in full {src.text(fp, code=True)}: SHA-256 "
            f"of the raw Ed25519 public key), read from "
            f"{src.text(pointer('verification', 'key_path'), code=True)}: {trust}.</p>"
            f"<p class='muted'>Check it yourself: {verify_command_html(data, verification)}</p>"
        )
    return head + key


def verify_command_html(data: Loaded, verification: Any) -> str:
    src = data.src
    key = (
        f" --key {src.text(pointer('verification', 'key_path'))}"
        if verification.key_trust != "home" and verification.key_path
        else ""
    )
    return (
        f"<code class='mono'>mcp-infra evidence verify {src.text(pointer('bundle', 'path'))}"
        f"{key} --fingerprint {src.text(pointer('verification', 'key_fingerprint'))}</code>"
    )


def heldout_html(data: Loaded, held: HeldOut | None) -> str:
    src = data.src
    if held is None:
        return (
            "<p class='muted'>No held-out check in this cycle: it runs on the selected "
            "candidate only, after selection.</p>"
        )
    word = "<span class='ok'>passed</span>" if held.passed else "<span class='failed'>failed</span>"
    out = [
        f"<p>The check {word} for {src.text(held.candidate_ref, code=True)}: "
        "the winner and the live recipe are measured on prompts that selection never saw, "
        "each in a fresh start, and the selector must qualify the winner there too.</p>",
        f"<p class='muted'>The journal: {src.text(held.journal_ref)}</p>",
    ]
    if not held.figures:
        out.append(f"<p class='muted'>Its figures are not shown: {_e(held.why_not)}.</p>")
        return "".join(out)
    at = pointer("heldout", "candidates", 0)
    rows = []
    for k, _ in enumerate(src.get(f"{at}/per_prompt")):
        p = f"{at}/per_prompt/{k}"
        rows.append(
            [
                src.text(f"{p}/prompt_id", code=True),
                src.num(f"{p}/baseline_tps", "tps"),
                src.num(f"{p}/candidate_tps", "tps"),
                src.num(f"{p}/speedup", "x3"),
                _interval(src, p, "ci_low", "ci_high"),
            ]
        )
    rows.append(
        [
            "<b>all held-out prompts</b>",
            src.num(f"{at}/baseline_tps", "tps"),
            src.num(f"{at}/candidate_tps", "tps"),
            src.num(f"{at}/speedup_estimate", "x3"),
            _interval(src, at, "ci_low", "ci_high"),
        ]
    )
    out.append(
        _table(rows, ["held-out prompt", "live tok/s", "winner tok/s", "speedup", "interval"])
    )
    out.append(
        "<p class='muted'>Figures: the cycle's own held-out selection, run again on the "
        "held-out run files of this bundle; its words equal the journal's above.</p>"
    )
    return "".join(out)


def gates_html(data: Loaded) -> str:
    src, verdict = data.src, data.verdict
    if verdict is None:
        return "<p class='muted'>No verdict: selection did not run.</p>"
    parts = []
    for i, item in enumerate(verdict.candidates):
        at = pointer("verdict.json", "candidates", i)
        parts.append(
            f"<h3>{src.text(f'{at}/candidate', code=True)} — {src.text(f'{at}/decision')}</h3>"
        )
        parts.append(
            "<ul>"
            + "".join(
                f"<li>{src.text(f'{at}/reasons/{k}', limit=600)}</li>"
                for k in range(len(item.reasons))
            )
            + "</ul>"
        )
        rows = []
        for j, gate in enumerate(item.gates):
            g = f"{at}/gates/{j}"
            first = next((k for k, c in enumerate(gate.comparisons) if not c.identical), None)
            if first is None:
                divergence = "none (all identical)" if gate.comparisons else NONE
            else:
                c = f"{g}/comparisons/{first}"
                divergence = (
                    f"prompt {src.text(f'{c}/prompt_id', code=True)} at token "
                    f"{src.num(f'{c}/first_divergence', 'int')}: baseline "
                    f"{src.text(f'{c}/baseline_context', limit=80, code=True)} vs candidate "
                    f"{src.text(f'{c}/candidate_context', limit=80, code=True)}"
                )
            status = "ok" if gate.passed else "failed"
            rows.append(
                [
                    src.text(f"{g}/gate"),
                    f"<span class='{status}'>{'passed' if gate.passed else 'FAILED'}</span>",
                    src.text(f"{g}/detail", limit=300),
                    divergence,
                ]
            )
        parts.append(
            _table(rows, ["gate", "result", "detail", "first token divergence"])
            if rows
            else "<p class='muted'>No gate ran (not measured).</p>"
        )
    return "".join(parts)


def cost_html(data: Loaded) -> str:
    """Service impact and cost, with the one downtime figure, defined once: the seconds the
    stable port had no backend able to serve, as the front measured them; only a bundle without
    that measurement falls back to the journal's upper bound."""
    src, cost, impact = data.src, data.cost, data.impact
    rows: list[list[str]] = []
    si, co = pointer("service_impact.json"), pointer("cost.json")
    si, co = si.rstrip("/"), co.rstrip("/")
    if impact is not None and impact.unserved_s is not None:
        rows.append(
            [
                "<b>downtime</b>",
                f"<b>{src.num(f'{si}/unserved_s', 's2')}</b> <span class='muted'>: seconds the "
                "stable port had no backend able to serve a request, measured by the front that "
                "owns the port</span>",
            ]
        )
    elif cost is not None and cost.downtime_s is not None:
        rows.append(
            [
                "<b>downtime</b>",
                f"<b>at most {src.num(f'{co}/downtime_s', 's2')}</b> <span class='muted'>: "
                f"an upper bound from the journal ({src.text(f'{co}/downtime_source')}); the "
                "front's own measurement is not in this bundle</span>",
            ]
        )
    else:
        rows.append(["<b>downtime</b>", "not recorded in this bundle"])
    if impact is not None:
        rows += [
            [
                "how candidates ran",
                f"{src.text(f'{si}/mode')} <span class='muted'>("
                f"{src.text(f'{si}/mode_reason')})</span>",
            ],
            [
                "requests the front held",
                f"{src.num(f'{si}/requests_held', 'int')} (longest "
                f"{src.num(f'{si}/longest_hold_s', 's2')})",
            ],
            ["answered HTTP 503 (unavailable)", src.num(f"{si}/rejected_503", "int")],
            ["upstream errors", src.num(f"{si}/upstream_errors", "int")],
            ["live requests served during the cycle", src.num(f"{si}/live_requests", "int")],
        ]
    if cost is not None:
        rows += [
            ["wall time", src.num(f"{co}/wall_s", "s1")],
            [
                "per phase",
                ", ".join(
                    f"{_e(k)} {src.num(pointer('cost.json', 'phases_s', k), 's1')}"
                    for k in cost.phases_s
                ),
            ],
            ["supervisor CPU", src.num(f"{co}/supervisor_cpu_s", "s1")],
            [
                "bytes downloaded",
                f"{src.num(f'{co}/bytes_downloaded', 'int')} <span class='muted'>"
                f"({src.text(f'{co}/bytes_note')})</span>",
            ],
            [
                "energy",
                src.num(f"{co}/energy_j", "j1")
                if cost.energy_j is not None
                else src.text(f"{co}/energy_note"),
            ],
            ["cost against gain", src.text(f"{co}/gain_note")],
        ]
    if impact is None and cost is None:
        return "<p class='muted'>This bundle has neither cost.json nor service_impact.json.</p>"
    out = _table(rows, ["figure", "value"])
    if cost is not None and cost.servers:
        servers = [
            [
                src.text(pointer("cost.json", "servers", k, "label"), code=True),
                src.text(pointer("cost.json", "servers", k, "role")),
                src.num(pointer("cost.json", "servers", k, "pid"), "int"),
                src.num(pointer("cost.json", "servers", k, "cpu_s"), "s1"),
                src.num(pointer("cost.json", "servers", k, "peak_rss_gb"), "gb"),
                src.text(pointer("cost.json", "servers", k, "note")),
            ]
            for k in range(len(cost.servers))
        ]
        out += (
            "<details><summary>every server process of the cycle</summary>"
            + _table(servers, ["server", "role", "pid", "CPU", "peak memory", "note"])
            + "</details>"
        )
    return out


def env_html(data: Loaded) -> str:
    src, env = data.src, data.env
    if env is None:
        return "<p class='muted'>No environment.json.</p>"
    e = "environment.json"
    rows = [
        ["platform", src.text(pointer(e, "platform"))],
        ["machine / CPU", f"{src.text(pointer(e, 'machine'))} · {src.text(pointer(e, 'cpu'))}"],
        [
            "cores / memory",
            f"{src.num(pointer(e, 'cpu_count'), 'int')} · {src.num(pointer(e, 'memory_gb'), 'gb')}",
        ],
        [
            "accelerator / BLAS",
            f"{src.text(pointer(e, 'accelerator'))} · {src.text(pointer(e, 'blas'))}",
        ],
        ["python", src.text(pointer(e, "python"))],
        [
            "packages",
            ", ".join(
                f"{src.key(pointer(e, 'packages', k))} {src.text(pointer(e, 'packages', k))}"
                for k in env.packages
            ),
        ],
        [
            "models",
            "<br>".join(
                f"{src.key(pointer(e, 'models', k), code=True)} "
                f"{src.text(pointer(e, 'models', k), limit=40)}"
                for k in env.models
            ),
        ],
    ]
    return _table(rows, ["", ""])


def checks_html(data: Loaded, verification: Any | None) -> str:
    if verification is None:
        return ""
    src = data.src
    rows = [
        [
            src.text(pointer("verification", "checks", k, "name")),
            f"<span class='{c.status}'>{src.text(pointer('verification', 'checks', k, 'status'))}"
            "</span>",
            src.text(pointer("verification", "checks", k, "detail")),
        ]
        for k, c in enumerate(verification.checks)
    ]
    word = "every check passed or did not apply" if not verification.failed else "FAILED"
    return f"<h2>Verification: {word}</h2>" + _table(rows, ["check", "result", "detail"])


def render(bundle: Path, verification: Any | None = None) -> str:
    """The report's HTML for a bundle (``verification``: a ``verification.Verification``)."""
    data = load(bundle, verification)
    held = heldout_check(data)
    src, summary = data.src, data.summary
    s = "summary.json"
    body = [
        f"<h1>Cycle {src.text(pointer(s, 'cycle_id'))}</h1>",
        f"<p class='muted'>plan {src.text(pointer(s, 'plan_id'))} · "
        f"{src.text(pointer(s, 'started_at'))} → {src.text(pointer(s, 'ended_at'))} · live "
        f"recipe now {src.text(pointer(s, 'active_recipe'), code=True)}</p>",
        decision_html(data, held),
        "<h2>Summary</h2>",
        summary_table(data, held),
        verification_html(data, verification),
        "<h2>Speedup of each candidate</h2>",
        candidates_chart(data),
        "<h2>Each workload cell: throughput, latency, decode speed</h2>",
        cells_html(data),
        "<h2>Held-out confirmation</h2>",
        heldout_html(data, held),
        "<h2>Speedup per prompt</h2>",
        prompts_chart(data),
        "<h2>Candidates and gates</h2>",
        gates_html(data),
        "<h2>Service impact and cost</h2>",
        cost_html(data),
        "<h2>Environment</h2>",
        env_html(data),
        checks_html(data, verification),
        f"<p class='muted'>Bundle: {src.text(pointer('bundle', 'path'), code=True)}.</p>",
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>mcp-infra cycle {_e(summary.cycle_id)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
