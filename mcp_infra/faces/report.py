"""`mcp-infra evidence report ID`: one self-contained HTML page a person can read.

The page needs nothing from any network: styles are inline, charts are matplotlib figures
rendered to SVG and embedded as markup, the icon is a data: URI, and there is no script. The
figures come from the bundle (verdict, raw samples, cost, environment) and its verification.
"""

from __future__ import annotations

import html
import io
import statistics
from pathlib import Path
from typing import Any

from mcp_infra.contracts import (
    CandidateRun,
    CycleCost,
    CycleSummary,
    EnvironmentFingerprint,
    FrozenPlan,
    Sample,
    Verdict,
)
from mcp_infra.core.units import fmt_pct
from mcp_infra.state.store import CycleFiles, read_optional

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;
max-width:1100px;padding:0 1rem;color:#1d2430;line-height:1.45}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #d8dde6;padding-bottom:.2rem}
.decision{font-size:1.15rem;background:#f3f6fa;border-left:5px solid #2f6fb3;padding:.7rem 1rem}
.ok{color:#1c7c3c;font-weight:600}.failed{color:#b3261e;font-weight:600}.skipped{color:#7a6500}
table{border-collapse:collapse;margin:.5rem 0;font-size:.92rem}td,th{border:1px solid #d8dde6;
padding:.3rem .55rem;text-align:left;vertical-align:top}th{background:#f3f6fa}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.88em}
.muted{color:#5b6472;font-size:.9rem}figure{margin:.5rem 0}svg{max-width:100%;height:auto}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _interval(
    base: dict[str, list[float]],
    cand: dict[str, list[float]],
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float, float] | None:
    from mcp_infra.core.stats import bootstrap_interval, geometric_mean

    prompts = sorted(set(base) & set(cand))
    if not prompts:
        return None
    point = geometric_mean(
        [statistics.median(cand[p]) / statistics.median(base[p]) for p in prompts]
    )
    low, high = bootstrap_interval(
        {p: base[p] for p in prompts},
        {p: cand[p] for p in prompts},
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    return point, min(low, point), max(high, point)


def speedup_rows(
    baseline: CandidateRun, runs: list[CandidateRun], plan: FrozenPlan, resamples: int = 400
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per prompt and per workload cell (request class × concurrency): speedup and interval."""
    from mcp_infra.core.stats import measured_tps

    conf = plan.protocol.confidence
    seed = plan.protocol.seed
    per_prompt: list[dict[str, Any]] = []
    per_cell: list[dict[str, Any]] = []

    def cells(samples: list[Sample]) -> dict[tuple[str, int], list[Sample]]:
        out: dict[tuple[str, int], list[Sample]] = {}
        for s in samples:
            out.setdefault((s.request_class, s.concurrency), []).append(s)
        return out

    base_cells = cells(baseline.samples)
    base_all = measured_tps(baseline.samples)
    for run in runs:
        if not run.started:
            continue
        cand_all = measured_tps(run.samples)
        for pid in sorted(set(base_all) & set(cand_all)):
            got = _interval({pid: base_all[pid]}, {pid: cand_all[pid]}, conf, resamples, seed)
            if got:
                per_prompt.append(
                    {
                        "candidate": run.candidate,
                        "label": pid,
                        "point": got[0],
                        "low": got[1],
                        "high": got[2],
                    }
                )
        for key, samples in sorted(cells(run.samples).items()):
            got = _interval(
                measured_tps(base_cells.get(key, [])), measured_tps(samples), conf, resamples, seed
            )
            if got:
                per_cell.append(
                    {
                        "candidate": run.candidate,
                        "label": f"{key[0]} ×{key[1]}",
                        "point": got[0],
                        "low": got[1],
                        "high": got[2],
                    }
                )
    return per_prompt, per_cell


def chart_svg(rows: list[dict[str, Any]], title: str, threshold_pct: float | None) -> str:
    """A horizontal interval chart (speedup %, with its bootstrap interval) as inline SVG."""
    import matplotlib

    matplotlib.use("svg", force=False)
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure

    if not rows:
        return "<p class='muted'>No measured samples to chart.</p>"
    plt.rcParams["svg.fonttype"] = "path"  # glyphs as paths: no font is fetched or needed
    fig = Figure(figsize=(9, 0.42 * len(rows) + 1.3))
    ax = fig.add_subplot()
    candidates = list(dict.fromkeys(r["candidate"] for r in rows))
    palette = ["#2f6fb3", "#c4572a", "#3a8d4c", "#8a4fb0", "#a07a12"]
    labels = []
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        color = palette[candidates.index(row["candidate"]) % len(palette)]
        point, low, high = ((row[k] - 1) * 100 for k in ("point", "low", "high"))
        ax.errorbar(
            [point],
            [y],
            xerr=[[point - low], [high - point]],
            fmt="o",
            color=color,
            capsize=4,
            markersize=6,
            linewidth=1.6,
        )
        labels.append(f"{row['candidate']}  ·  {row['label']}")
    ax.set_yticks(range(len(rows) - 1, -1, -1), labels=labels, fontsize=8)
    ax.axvline(0, color="#444", linewidth=1)
    if threshold_pct is not None:
        ax.axvline(
            threshold_pct,
            color="#b3261e",
            linewidth=1,
            linestyle="--",
            label=f"minimum speedup {threshold_pct:g}%",
        )
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("decode speed vs the live recipe (%), point and interval", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", color="#e3e7ee")
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _decision(summary: CycleSummary, verdict: Verdict | None) -> str:
    if summary.outcome.value == "promoted" and summary.selected:
        item = next(
            (c for c in (verdict.candidates if verdict else []) if c.candidate == summary.selected),
            None,
        )
        interval = (
            f" (interval {fmt_pct(item.ci_low)} to {fmt_pct(item.ci_high)})"
            if item and item.ci_low is not None
            else ""
        )
        return (
            f"Promoted {summary.selected}: decode {summary.speedup_pct:+.2f}% faster than "
            f"the live recipe{interval}, verified online on the stable port."
        )
    words = {
        "kept_baseline": "Kept the live recipe",
        "rolled_back": "Rolled back",
        "refused": "Refused",
        "restored_after_error": "Restored after an error",
        "needs_operator": "Needs an operator",
    }
    return f"{words.get(summary.outcome.value, summary.outcome.value)}: {summary.reason}"


def _verified_line(verification: Any | None) -> str:
    if verification is None:
        return ""
    if not verification.failed:
        return (
            f"<p class='ok'>Evidence verified: {len(verification.checks)} checks passed "
            "(signature, chain, hashes, every sample, verdict and gates recomputed).</p>"
        )
    return (
        f"<p class='failed'>Evidence does NOT verify: failed "
        f"{_e(', '.join(verification.failed))} (details at the end).</p>"
    )


def _table(rows: list[list[str]], head: list[str]) -> str:
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _gates_html(verdict: Verdict | None) -> str:
    if verdict is None:
        return "<p class='muted'>No verdict: selection did not run.</p>"
    parts = []
    for item in verdict.candidates:
        parts.append(
            f"<h3>{_e(item.candidate)} — {_e(item.decision.value)} "
            f"({fmt_pct(item.speedup_estimate)})</h3>"
        )
        parts.append("<ul>" + "".join(f"<li>{_e(r)}</li>" for r in item.reasons) + "</ul>")
        rows = []
        for gate in item.gates:
            first = next((c for c in gate.comparisons if not c.identical), None)
            divergence = (
                "none (all identical)"
                if first is None
                else f"prompt <code>{_e(first.prompt_id)}</code> at token "
                f"{_e(first.first_divergence)}: baseline <code>"
                f"{_e(first.baseline_context[:80])}</code> vs candidate <code>"
                f"{_e(first.candidate_context[:80])}</code>"
            )
            status = "ok" if gate.passed else "failed"
            rows.append(
                [
                    _e(gate.gate),
                    f"<span class='{status}'>{'passed' if gate.passed else 'FAILED'}</span>",
                    _e(gate.detail[:300]),
                    divergence,
                ]
            )
        parts.append(
            _table(rows, ["gate", "result", "detail", "first token divergence"])
            if rows
            else "<p class='muted'>No gate ran (not measured).</p>"
        )
    return "".join(parts)


def _cost_html(cost: CycleCost | None) -> str:
    if cost is None:
        return "<p class='muted'>This bundle has no cost.json.</p>"
    rows = [
        ["wall time", f"{cost.wall_s:.1f} s"],
        ["per phase", ", ".join(f"{k} {v:.1f} s" for k, v in cost.phases_s.items())],
        [
            "supervisor CPU",
            f"{cost.supervisor_cpu_s:.1f} s" if cost.supervisor_cpu_s is not None else "–",
        ],
        [
            "downtime of the stable port",
            (f"{cost.downtime_s:.2f} s" if cost.downtime_s is not None else "unknown")
            + f" <span class='muted'>({_e(cost.downtime_source)})</span>",
        ],
        [
            "bytes downloaded",
            f"{cost.bytes_downloaded} <span class='muted'>({_e(cost.bytes_note)})</span>",
        ],
        ["energy", f"{cost.energy_j:.1f} J" if cost.energy_j is not None else _e(cost.energy_note)],
        ["cost against gain", _e(cost.gain_note)],
    ]
    servers = [
        [
            _e(s.label),
            _e(s.role),
            str(s.pid),
            f"{s.cpu_s:.1f}",
            f"{s.peak_rss_gb:.2f}" if s.peak_rss_gb is not None else "–",
            _e(s.note),
        ]
        for s in cost.servers
    ] or [["none recorded", "", "", "", "", ""]]
    return _table([[_e(a), b] for a, b in rows], ["figure", "value"]) + _table(
        servers, ["server", "role", "pid", "CPU s", "peak memory GB", "note"]
    )


def _env_html(env: EnvironmentFingerprint | None) -> str:
    if env is None:
        return "<p class='muted'>No environment.json.</p>"
    rows = [
        ["platform", _e(env.platform)],
        ["machine / CPU", _e(f"{env.machine} · {env.cpu}")],
        ["cores / memory", _e(f"{env.cpu_count} · {env.memory_gb} GB")],
        ["accelerator / BLAS", _e(f"{env.accelerator or 'not recorded'} · {env.blas}")],
        ["python", _e(env.python)],
        ["packages", _e(", ".join(f"{k} {v}" for k, v in sorted(env.packages.items())))],
        [
            "models",
            "<br>".join(f"<code>{_e(k)}</code> {_e(v[:40])}" for k, v in env.models.items()),
        ],
    ]
    return _table(rows, ["", ""])


def render(bundle: Path, verification: Any | None = None) -> str:
    """The report's HTML for a bundle (``verification``: an ``evidence.Verification``)."""
    from mcp_infra.state.audit import load_runs

    summary = read_optional(CycleFiles(bundle).summary, CycleSummary)
    if summary is None:
        raise FileNotFoundError(f"{bundle} has no summary.json")
    verdict = read_optional(CycleFiles(bundle).verdict, Verdict)
    plan = read_optional(CycleFiles(bundle).plan, FrozenPlan)
    cost = read_optional(bundle / "cost.json", CycleCost)
    env = read_optional(CycleFiles(bundle).environment, EnvironmentFingerprint)
    baseline, runs = load_runs(bundle)
    per_prompt, per_cell = ([], [])
    if baseline is not None and plan is not None:
        per_prompt, per_cell = speedup_rows(baseline, runs, plan)
    threshold = plan.thresholds.min_speedup_pct if plan else None
    checks = ""
    if verification is not None:
        rows = [
            [_e(c.name), f"<span class='{c.status}'>{_e(c.status)}</span>", _e(c.detail)]
            for c in verification.checks
        ]
        verdict_word = (
            "every check passed"
            if not verification.failed
            else "FAILED: " + ", ".join(verification.failed)
        )
        checks = f"<h2>Verification: {_e(verdict_word)}</h2>" + _table(
            rows, ["check", "result", "detail"]
        )
    body = [
        f"<h1>Cycle {_e(summary.cycle_id)}</h1>",
        f"<p class='muted'>plan {_e(summary.plan_id)} · {_e(summary.started_at)} → "
        f"{_e(summary.ended_at)} · live recipe now <code>{_e(summary.active_recipe)}</code></p>",
        f"<p class='decision'>{_e(_decision(summary, verdict))}</p>",
        _verified_line(verification),
        "<h2>Speedup per prompt</h2>",
        f"<figure>{chart_svg(per_prompt, 'median decode tok/s, candidate / baseline', threshold)}"
        "</figure>",
        "<h2>Speedup per workload class</h2>",
        f"<figure>{chart_svg(per_cell, 'by request class × concurrency', threshold)}</figure>",
        "<p class='muted'>Points: ratio of median decode tok/s (geometric mean over prompts); "
        "bars: percentile bootstrap interval at the plan's confidence "
        f"({plan.protocol.confidence if plan else '–'}), resampling each prompt's repeats.</p>",
        "<h2>Candidates and gates</h2>",
        _gates_html(verdict),
        "<h2>Cost</h2>",
        _cost_html(cost),
        "<h2>Environment</h2>",
        _env_html(env),
        checks,
        f"<p class='muted'>Bundle: <code>{_e(bundle)}</code>. Re-check it with "
        f"<code>mcp-infra evidence verify {_e(summary.cycle_id)}</code>.</p>",
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>mcp-infra cycle {_e(summary.cycle_id)}</title><style>{CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
