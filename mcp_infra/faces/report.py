"""`mcp-infra evidence report ID`: one self-contained HTML page, built around the decision.

The page is a template (``report.html``, package data: styles inline, no script, the icon a
data: URI) filled with sections made here from the bundle's data (``report_data``: every figure
bound to its source). The charts are SVG drawn by ``report_svg`` and embedded as markup: nothing
is fetched from any network.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from mcp_infra.faces.report_data import (
    METRICS,
    NONE,
    Cell,
    CellRow,
    HeldOut,
    Loaded,
    Sources,
    esc,
    failed_gates,
    heldout_check,
    load,
    pointer,
    short_of,
    status_of,
    workload_cells,
)
from mcp_infra.faces.report_svg import Line, Panel, Point, bar_panels, interval_chart
from mcp_infra.faces.report_tables import (
    checks_html,
    cost_html,
    env_html,
    gates_html,
    table,
    verification_html,
)


def _why_rejected(data: Loaded, i: int) -> str:
    """The short reason, bound: the gates that failed, else the verdict's first reason."""
    src = data.src
    failed = failed_gates(data, i)
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
    failed = [item.gates[j].gate for j in failed_gates(data, i)]
    if failed:
        return f"{', '.join(failed)} gate{'s' if len(failed) > 1 else ''} failed"
    short = short_of(data, i)
    if short is not None:
        return "interval below the " + ("A/A noise floor" if short == "floor" else "threshold")
    return item.reasons[0][:60] + ("…" if len(item.reasons[0]) > 60 else "")


def _why_inconclusive(data: Loaded, i: int) -> str:
    """Bound: the interval's lower end against the bar it does not clear, else the reason."""
    src, at = data.src, pointer("verdict.json", "candidates", i)
    short = short_of(data, i)
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
        status = status_of(data, i)
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
    shown = table(rows, head, "summary", classes)
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
    return shown + rule


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


def _charted(div_id: str, svg: str, rows: list[list[str]], head: list[str]) -> str:
    """A chart with the figures it draws, as a table a reader can open under it."""
    return (
        f"<div id='{div_id}'><figure>{svg}</figure>"
        + "<details><summary>the charted figures (from verdict.json)</summary>"
        + table(rows, head)
        + "</details></div>"
    )


def _threshold_lines(data: Loaded) -> list[Line]:
    if data.plan is None:
        return []
    pct = data.plan.thresholds.min_speedup_pct
    label = f"required {1 + pct / 100:.3f}× (minimum speedup {pct:g}%)"
    return [Line(1 + pct / 100, label, "#b3261e", "threshold")]


def candidates_chart(data: Loaded) -> str:
    src, verdict = data.src, data.verdict
    if verdict is None:
        return ""
    points, rows = [], []
    for i, item in enumerate(verdict.candidates):
        if item.speedup_estimate is None:
            continue
        status = status_of(data, i)
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
        status = status_of(data, i)
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
        floor = f"worst-prompt floor {1 - tol / 100:.3f}× (no prompt slower)"
        lines.append(Line(1 - tol / 100, floor, "#7a6500", "worst-prompt-floor"))
    svg = interval_chart(
        "prompts",
        points,
        "Decode speedup per prompt (point and interval, as the verdict computed them)",
        lines,
        "candidate / live recipe, decode tok/s (log scale)",
    )
    head = ["candidate", "prompt", "live tok/s", "candidate tok/s", "speedup", "interval"]
    return _charted("chart-prompts", svg, rows, head)


def cell_chart(data: Loaded, cell: Cell) -> str:
    """The cell's figures side by side: aggregate output tok/s, TTFT p50/p99, decode tok/s."""
    src = data.src

    def value(row: CellRow, metric: str) -> float:
        ref = row.refs.get(metric)
        got = src.get(ref) if ref and src.has(ref) else None
        return float(got) if got is not None else 0.0

    def panel(title: str, *metrics: str) -> Panel:
        return Panel(title, [tuple(value(r, m) for m in metrics) for r in cell.rows])

    who = "one request at a time" if cell.concurrency == 1 else f"{cell.concurrency} at a time"
    title = f"{cell.request_class} requests, {who} — {cell.role}" + (
        ", headline" if cell.headline else ""
    )
    return bar_panels(
        title,
        [(r.config, r.status) for r in cell.rows],
        [
            panel("aggregate output tok/s (higher is better)", "output_tps"),
            panel("TTFT p50 and p99, s (lower is better; p99 lighter)", "ttft_p50_s", "ttft_p99_s"),
            panel("decode tok/s per request (higher is better)", "decode_tps"),
        ],
    )


def cells_html(data: Loaded) -> str:
    parts = []
    for cell in workload_cells(data):
        parts.append(_cell_heading(data.src, cell))
        parts.append(f"<figure>{cell_chart(data, cell)}</figure>")
        rows = [_cell_row(data.src, row) for row in cell.rows]
        classes = [
            row.status if row.status in ("selected", "rejected") else "" for row in cell.rows
        ]
        parts.append(table(rows, CELL_HEAD, row_classes=classes))
    if not parts:
        return "<p class='muted'>No per-cell figures in this bundle.</p>"
    return "".join(parts)


CELL_HEAD = [
    "configuration",
    "aggregate output tok/s",
    "vs baseline",
    "TTFT p50",
    "TTFT p99",
    "decode tok/s",
    "vs baseline",
    "requests",
    "from",
]


def _cell_heading(src: Sources, cell: Cell) -> str:
    tags = f"<span class='tag {cell.role}'>{cell.role}</span>"
    if cell.headline:
        tags += " <span class='tag headline'>headline: the speedup above is computed here</span>"
    meaning = (
        "decisive: a candidate that loses here beyond the tolerance is not promoted"
        if cell.role == "decisive"
        else "reported: measured and shown, it does not decide"
    )
    several = (
        " With several requests in flight a user gets the aggregate output tok/s and waits the "
        "TTFT; each request's own decode speed leaves the waiting out."
        if cell.concurrency > 1
        else ""
    )
    return (
        f"<h3 data-cell='{esc(cell.request_class)}@{cell.concurrency}'>{esc(cell.request_class)} "
        f"requests, {src.num(cell.concurrency_ref, 'int')} at a time {tags}</h3>"
        f"<p class='muted'>{meaning}.{several}</p>"
    )


def _cell_row(src: Sources, row: CellRow) -> list[str]:
    """One configuration's figures in a cell, each bound to the verdict or its run file."""
    name = (
        "<b>baseline</b> (live recipe)"
        if row.status == "baseline"
        else src.text(row.name_ref, code=True)
    )
    figures = [
        src.num(row.refs[m], fmt) if src.has(row.refs[m]) else NONE for _, m, _, fmt in METRICS
    ]
    ratio = "" if row.status == "baseline" else NONE
    if row.ratio_ref and src.has(row.ratio_ref):
        ratio = src.num(row.ratio_ref, "x3")
        if row.ratio_low and row.ratio_high and src.has(row.ratio_low) and src.has(row.ratio_high):
            ratio += f" ({src.num(row.ratio_low, 'x3')} to {src.num(row.ratio_high, 'x3')})"
    decode_ratio = (
        src.num(row.decode_ratio_ref, "x3")
        if row.decode_ratio_ref and src.has(row.decode_ratio_ref)
        else ("" if row.status == "baseline" else NONE)
    )
    source = "verdict" if row.source == "verdict.json" else "run file"
    return [
        name,
        figures[0],
        ratio,
        figures[1],
        figures[2],
        figures[3],
        decode_ratio,
        src.num(row.requests_ref, "int") if row.requests_ref else NONE,
        f"<span data-from='{esc(row.source)}'>{source}</span>",
    ]


# ---------------------------------------------------------------------------------------------
# The decision and the held-out check
# ---------------------------------------------------------------------------------------------

OUTCOMES = {  # outcome → the word the decision box opens with, and its colour (a CSS class)
    "promoted": ("Promoted", "promoted"),
    "kept_baseline": ("Baseline kept", "kept"),
    "rolled_back": ("Rolled back", "rolled-back"),
    "refused": ("Refused", "refused"),
    "restored_after_error": ("Restored after an error", "rolled-back"),
    "needs_operator": ("Needs an operator", "rolled-back"),
}


def _verified_online(data: Loaded) -> bool:
    return any(
        e.get("state") == "VERIFY" and (e.get("fields") or {}).get("step") == "passed"
        for e in data.journal
    )


def decision_html(data: Loaded, held: HeldOut | None) -> str:
    """The outcome first, in words and in its colour, then what it rests on and the reason (its
    opening in view, the whole of a long one a click away)."""
    src, summary = data.src, data.summary
    outcome = summary.outcome.value
    word, klass = OUTCOMES.get(outcome, (outcome, "refused"))
    live = src.text(pointer("summary.json", "active_recipe"), code=True)
    selected = src.text(pointer("summary.json", "selected"), code=True)
    if outcome == "promoted" and summary.selected:
        line = f"{selected}{_promoted_figures(data, held)}; it serves now."
    elif outcome == "rolled_back" and (started := _promoted(data)):
        line = f"{src.text(started, code=True)} {_how_it_failed(data)}; {live} serves again."
    elif outcome in ("kept_baseline", "refused"):
        line = f"{_why_kept(data, held)}the live recipe {live} keeps serving."
    else:
        line = f"the live recipe now is {live}."
    reason = pointer("summary.json", "reason")
    whole = ""
    if len(summary.reason) > REASON_SHOWN:
        whole = f"<details><summary>the whole reason</summary><p>{src.text(reason)}</p></details>"
    return (
        f"<div class='decision {klass}' id='decision'><span class='outcome'>{word}</span> "
        f"{line}</div>"
        f"<p class='muted'>The cycle's reason: {src.text(reason, limit=REASON_SHOWN)}</p>{whole}"
    )


REASON_SHOWN = 240  # characters of the cycle's reason under the decision box


def _why_kept(data: Loaded, held: HeldOut | None) -> str:
    """Why nothing took over, in a clause: a selection the held-out check did not confirm (the
    reason under the box says where it fell short), or no selection at all."""
    src, verdict = data.src, data.verdict
    if verdict is None:
        return ""
    if verdict.selected is None:
        return "no candidate was selected; "
    if held is None or held.passed or held.candidate != verdict.selected:
        return ""
    return (
        f"{src.text(held.candidate_ref, code=True)} was selected"
        f"{_speedup(data, verdict.selected)} but the held-out check did not confirm it; "
    )


def _speedup(data: Loaded, candidate: str) -> str:
    """`: decode N× the live recipe's (interval …)` for a candidate of the verdict, or ''."""
    src = data.src
    candidates = data.verdict.candidates if data.verdict else []
    i = next((k for k, c in enumerate(candidates) if c.candidate == candidate), None)
    if i is None:
        return ""
    at = pointer("verdict.json", "candidates", i)
    return (
        f" at decode {src.num(f'{at}/speedup_estimate', 'x3')} the live recipe's (interval "
        f"{_interval(src, at, 'ci_low', 'ci_high')})"
    )


def _how_it_failed(data: Loaded) -> str:
    """What a rolled-back winner did, from the journal: failed its online check on the stable
    port, or never came up there."""
    steps = [
        (e.get("fields") or {}).get("step") for e in data.journal if e.get("state") == "VERIFY"
    ]
    if "failed" in steps:
        return "took over but failed the online check on the stable port, and was taken back out"
    if not steps:
        return "was started to take over but did not come up, and was taken back out"
    return "was started to take over and taken back out"


def _promoted(data: Loaded) -> str | None:
    """Where the journal names the recipe a promotion started (its last PROMOTE)."""
    for i in range(len(data.journal) - 1, -1, -1):
        event = data.journal[i]
        recipe = (event.get("fields") or {}).get("recipe")
        if (
            event.get("state") == "PROMOTE"
            and isinstance(recipe, dict)
            and recipe.get("candidate_id")
        ):
            return pointer("journal.ndjson", i, "fields", "recipe", "candidate_id")
    return None


def _promoted_figures(data: Loaded, held: HeldOut | None) -> str:
    """What a promotion rests on: its speedup and interval, the held-out confirmation, the
    online check on the stable port."""
    src, summary = data.src, data.summary
    candidates = data.verdict.candidates if data.verdict else []
    i = next((k for k, c in enumerate(candidates) if c.candidate == summary.selected), None)
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
    return f"{speed}{confirmed}{online}"


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
        out.append(f"<p class='muted'>Its figures are not shown: {esc(held.why_not)}.</p>")
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
        table(rows, ["held-out prompt", "live tok/s", "winner tok/s", "speedup", "interval"])
    )
    out.append(
        "<p class='muted'>Figures: the cycle's own held-out selection, run again on the "
        "held-out run files of this bundle; its words equal the journal's above.</p>"
    )
    return "".join(out)


TEMPLATE = Template(resources.files("mcp_infra.faces").joinpath("report.html").read_text("utf-8"))


def render(bundle: Path, verification: Any | None = None) -> str:
    """The report's HTML for a bundle (``verification``: a ``verification.Verification``)."""
    data = load(bundle, verification)
    held = heldout_check(data)
    src, s = data.src, "summary.json"
    return TEMPLATE.substitute(
        title=esc(f"mcp-infra cycle {data.summary.cycle_id}"),
        cycle=src.text(pointer(s, "cycle_id")),
        about=f"plan {src.text(pointer(s, 'plan_id'))} · "
        f"{src.num(pointer(s, 'started_at'), 'utc')} → {src.num(pointer(s, 'ended_at'), 'utc')} · "
        "live recipe now "
        f"{src.text(pointer(s, 'active_recipe'), code=True)}",
        decision=decision_html(data, held),
        summary=summary_table(data, held),
        verification=verification_html(data, verification),
        candidates_chart=candidates_chart(data),
        cells=cells_html(data),
        heldout=heldout_html(data, held),
        prompts_chart=prompts_chart(data),
        gates=gates_html(data),
        cost=cost_html(data),
        environment=env_html(data),
        checks=checks_html(data, verification),
        bundle=src.text(pointer("bundle", "path"), code=True),
    )
