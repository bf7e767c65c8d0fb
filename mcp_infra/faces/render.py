"""Every text mcp-infra writes for a person or a model, in one place.

The MCP tools and the CLI show the same words for the same view: each tool also returns the view
as structured content, and this text is its summary, written to be enough on its own for a model
that only sees text, and bounded in size. The planning prompt and the demo's table live here too.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_infra.contracts import CycleCost, CycleSummary, PlanCost
from mcp_infra.core.gates import TaskCheck, TaskSpec
from mcp_infra.core.progress import duration_text
from mcp_infra.core.units import fmt_pct
from mcp_infra.flows import api as app
from mcp_infra.flows.planning import LocalPlanResult, PlanningContext
from mcp_infra.state.artifacts import PrepareResult
from mcp_infra.state.audit import Verification

MAX_TEXT = 12_000


def _bounded(lines: list[str]) -> str:
    text = "\n".join(lines)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT].rsplit("\n", 1)[0] + "\n… (cut; the structured content is complete)"
    return text


def status_text(view: app.StatusView) -> str:
    if not view.configured:
        return _bounded([f"Not configured (home {view.home}).", *view.problems])
    lines = []
    if view.service:
        s = view.service
        since = f", since {s.since:%Y-%m-%d %H:%M:%S} UTC (pid {s.pid})" if s.since else ""
        checked = (
            " (process and port checked, no request sent during a cycle)"
            if ("no request sent" in s.health_check)
            else ""
        )
        lines.append(
            f"Service {s.endpoint}: {'healthy' if s.healthy else 'NOT answering'}"
            f"{checked}; "
            f"active recipe {s.active_recipe} ({app.knobs_text(s.knobs)}){since}."
        )
        if s.healing:
            lines.append(f"Self-healing: {s.healing}.")
    if view.cycle:
        c = view.cycle
        lines.append(
            f"Cycle in progress {c.cycle_id}, running plan {c.plan_id or '?'}: "
            f"{c.progress or c.state}"
            + (f"; running for {duration_text(c.elapsed_s)}" if c.elapsed_s is not None else "")
            + f". {c.message}."
        )
        if c.downtime_note:
            lines.append(f"Expected downtime: {c.downtime_note}.")
        if c.projection:
            lines.append(f"Cost: {c.projection}.")
    else:
        lines.append(
            "No cycle in progress"
            + (
                f" (a supervisor runs, pid {view.supervisor_pid})."
                if view.supervisor_running
                else "."
            )
        )
    lines.append(f"Queue (waiting): {', '.join(view.queue) if view.queue else 'empty'}.")
    if view.evidence_key:
        lines.append(f"Evidence signing key (Ed25519) fingerprint: {view.evidence_key}.")
    if view.last_cycle:
        lc = view.last_cycle
        lines.append(
            f"Last cycle {lc.cycle_id}: {lc.outcome.value}"
            + (f", selected {lc.selected}" if lc.selected else "")
            + (f" ({lc.speedup_pct:+.1f}%)" if lc.speedup_pct is not None else "")
            + f" — {lc.reason}"
        )
    else:
        lines.append("No sealed cycle yet.")
    window = view.window or {}
    when = (
        f"{window.get('start')}-{window.get('end')} {window.get('timezone')}"
        if window.get("mode") == "window"
        else window.get("mode", "?")
    )
    lines.append(
        f"Policy {view.policy}; maintenance window: {when}"
        + (f"; server mode: {view.server_mode}" if view.server_mode else "")
        + "."
    )
    if view.window_now:
        lines.append(f"A queued plan {view.window_now}.")
    if view.needs_operator:
        lines.append(
            f"NEEDS OPERATOR: {view.needs_operator} (a person must run `mcp-infra recover`)."
        )
    lines += [f"Problem: {p}" for p in view.problems]
    return _bounded(lines)


def registry_text(view: app.RegistryView) -> str:
    lines = [f"{len(view.candidates)} candidate(s); live recipe: {view.live_recipe or 'none'}."]
    for c in view.candidates:
        verdict = "passes preflight" if c.preflight_passed else "FAILS preflight"
        auto = "" if c.auto_promote else "; not auto-promoted by policy"
        lines.append(
            f"- {c.id}: {c.title}. {c.candidate_class}, {c.semantics}, "
            f"knobs {app.knobs_text(c.knobs)}; {verdict}{auto}."
        )
        for check in c.checks:
            if not check.passed:
                lines.append(f"    fails {check.name}: {check.detail}")
        for item in c.learned[-3:]:
            reason = f": {item.reasons[0]}" if item.reasons else ""
            changed = "" if item.current else " (since then something changed)"
            lines.append(
                f"    cycle {item.cycle_id}: {item.decision} "
                f"({fmt_pct(item.speedup_estimate)}){changed}{reason}"
            )
        if c.skip:
            lines.append(f"    skipped in plans: {c.skip}")
        if c.preflight_passed and (said := cost_line(c.cost)):
            lines.append(f"    alone in a plan: {said}")
    return _bounded(lines)


def evidence_text(view: app.EvidenceView) -> str:
    if view.cycles is not None:
        if not view.cycles:
            return "No sealed cycle yet."
        lines = [f"Sealed cycles, newest first (page {view.page} of {view.pages}):"]
        for s in view.cycles:
            lines.append(
                f"- {s.cycle_id} ({s.started_at:%Y-%m-%d %H:%M} UTC): {s.outcome.value}"
                + (f", selected {s.selected}" if s.selected else "")
                + (f" ({s.speedup_pct:+.1f}%)" if s.speedup_pct is not None else "")
                + f" — {s.reason}"
            )
        return _bounded(lines)
    lines = verdict_table(view).splitlines() if (view.summary or view.verdict) else []
    if view.summary and view.summary.interrupted:
        lines.append("The cycle was interrupted, then recovered.")
    if view.verified is not None:
        lines.append(
            "Evidence verifies: every check passed."
            if view.verified
            else "Evidence does NOT verify; failed checks: " + ", ".join(view.failed_checks or [])
        )
    if view.cost is not None:
        lines.append(cost_text(view.cost))
    if view.report_path:
        lines.append(
            f"Report (self-contained HTML): {view.report_path} (resource {view.report_uri})."
        )
    if view.gates is not None:
        for g in view.gates:
            lines.append(
                f"- {g['candidate']} {g['gate']}: {'passed' if g['passed'] else 'FAILED'}"
                f" — {g['detail']}"
            )
    if view.plan is not None:
        p = view.plan
        lines.append(
            f"Frozen plan {p.plan_id} by {p.proposed_by}: {', '.join(p.candidates)}; "
            f"thresholds min speedup {p.thresholds.min_speedup_pct}%, max peak memory "
            f"{p.thresholds.max_peak_memory_gb} GB."
        )
        lines += [f"  change {c.field} {c.action}: {c.reason}" for c in p.changes]
        lines += [f"  refused {r.id}: {r.reason}" for r in p.refused]
    if view.journal is not None:
        lines.append(f"Journal page {view.page} of {view.pages}:")
        for row in view.journal:
            if "problem" in row:
                lines.append(f"  problem: {row['problem']}")
                continue
            fields = json.dumps(row.get("fields") or {}, default=str)
            lines.append(
                f"  {row.get('ts')} {row.get('state')}: {row.get('message')}"
                + (f" {fields[:300]}" if fields != "{}" else "")
            )
    if view.section == "summary" and view.summary:
        lines.append("More: evidence with section=gates | verdict | plan | journal.")
    return _bounded(lines)


def proposal_text(view: app.ProposalView) -> str:
    head = "DRY RUN — " if view.dry_run else ""
    if not view.accepted:  # one line: the message already names every problem
        said = view.message
        extra = [p for p in view.problems if p not in said]
        extra += [f"{r.id}: {r.reason}" for r in view.refused if f"{r.id}: {r.reason}" not in said]
        return (
            f"{head}REFUSED (nothing queued): {'; '.join([said, *extra])}. Fix what is named "
            "(candidate ids: `registry`; the schema: mcp-infra://plan-schema) and call "
            "propose_plan again."
        )[:MAX_TEXT]
    lines = [
        f"{head}ACCEPTED plan {view.plan_id}: {view.message}.",
        f"Candidates, in order: {', '.join(view.candidates)}.",
        "Thresholds: " + ", ".join(f"{k}={v}" for k, v in (view.thresholds or {}).items()) + ".",
    ]
    refused = {(r.id, r.reason) for r in view.refused}
    lines += [
        f"- change {c.field} {c.action}"
        + (f" ({_short(c.value)})" if c.value is not None else "")
        + f": {c.reason}"
        for c in view.changes
        if (c.value, c.reason) not in refused  # a refusal is stated once, below
    ]
    lines += [f"- refused {r.id}: {r.reason}" for r in view.refused]
    if view.window:
        lines.append(f"Runs: {view.window}.")
    if said := cost_line(view.cost):
        lines.append(f"Cost: {said}")
    if view.queue_position:
        lines.append(f"Queue position: {view.queue_position}.")
    if view.follow:
        lines.append(f"Follow: {view.follow}.")
    return _bounded(lines)


def cost_line(cost: PlanCost | None) -> str | None:
    """A plan's projected cost in one sentence (None when there is none)."""
    if cost is None:
        return None
    if cost.basis != "this-home" or cost.minutes is None:
        return f"projected cost {cost.basis}: {cost.why}."
    text = (
        f"projected on this machine {cost.minutes:.1f} min (up to {cost.minutes_high:.1f}, "
        f"{cost.seeds} seeds), {cost.rounds} round(s), {cost.requests} requests, "
        f"{cost.unserved_s:.0f} s unserved ({cost.mode}); from {', '.join(cost.source[:1])}."
    )
    return text + (f" HELD: {cost.held}." if cost.held else "")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def verdict_table(view: app.EvidenceView) -> str:
    """Per candidate: decode tok/s, speedup with interval, gates, decision."""
    verdict = view.verdict
    lines = []
    if view.summary:
        s = view.summary
        lines.append(
            f"cycle {s.cycle_id}: {s.outcome.value}"
            + (f", selected {s.selected}" if s.selected else "")
            + f" — {s.reason}"
        )
    if (impact := getattr(view, "service_impact", None)) is not None:
        lines.append(
            f"service: {impact.mode} mode, expected downtime {impact.expected_downtime_s:.0f} s; "
            f"unserved {impact.unserved_s if impact.unserved_s is not None else '?'} s, "
            f"{impact.live_requests if impact.live_requests is not None else '?'} live requests, "
            f"{impact.requests_held if impact.requests_held is not None else '?'} held (longest "
            f"{impact.longest_hold_s if impact.longest_hold_s is not None else '?'} s), "
            f"{impact.rejected_503 if impact.rejected_503 is not None else '?'} answered 503"
        )
    if verdict is None:
        return "\n".join(lines)
    # The interval's confidence is the plan's, adjusted per look of early stopping: each
    # candidate's first reason states it, so the header does not.
    lines.append(
        f"{'candidate':26} {'decode tok/s':>13} {'speedup':>9} {'interval':>17} "
        f"{'worst prompt':>13}  {'gates':24} decision"
    )
    for c in verdict.candidates:
        tps = f"{c.candidate_tps:.1f}" if c.candidate_tps else "-"
        base = f"{c.baseline_tps:.1f}→" if c.baseline_tps else ""
        speed = fmt_pct(c.speedup_estimate)
        ci = (
            f"[{fmt_pct(c.ci_low)}, {fmt_pct(c.ci_high)}]"
            if c.ci_low is not None and c.ci_high is not None
            else "-"
        )
        worst = fmt_pct(c.worst_speedup)
        gates = ",".join(f"{g.gate}:{'ok' if g.passed else 'FAIL'}" for g in c.gates) or "-"
        lines.append(
            f"{c.candidate:26} {base + tps:>13} {speed:>9} {ci:>17} {worst:>13}  "
            f"{gates:24} {c.decision.value}"
        )
        for reason in c.reasons[:3]:
            lines.append(f"    {reason}")
    if view.table:
        lines.append("per prompt:")
        for row in view.table:
            lines.append(
                f"    {row['candidate']:26} {row['prompt']:16} {row['baseline_tps']:8.1f} "
                f"→ {row['candidate_tps']:8.1f} tok/s  x{row['speedup']:.3f}"
            )
    return "\n".join(lines)


def planning_prompt(
    context: PlanningContext, goal: str | None = None, *, can_propose: bool = True
) -> str:
    """The planner's instructions with the live context, as one user message (kept compact: a
    local model pays for every prompt token)."""
    p = context.policy
    out = [
        "You plan a speed experiment for a local LLM service managed by mcp-infra. You only "
        "propose: code measures each candidate you name against the live baseline on this "
        "machine, gates it (lossless: greedy output identical to the baseline's, token for "
        "token; lossy: a quality budget), selects by fixed thresholds, promotes only a "
        "qualified winner and rolls back on trouble. Keeping the baseline is a valid result.",
        "Goal: "
        + (goal.strip() if goal and goal.strip() else "faster decoding without changing answers")
        + ".",
        f"Live recipe: {context.live_recipe} at {context.endpoint}.",
        "",
        "## Candidates you may propose (they pass preflight here)",
    ]
    if not context.runnable:
        out.append("None: no candidate can run on this machine.")
    for c in context.runnable:
        knobs = ", ".join(f"{k}={v}" for k, v in c.knobs.items()) or "defaults"
        auto = "auto-promote" if c.auto_promote else "NOT auto-promoted: a person decides"
        out.append(f"- {c.id}: {c.title} ({c.candidate_class}, {c.semantics}, {auto}; {knobs})")
        out += [f"  past {h[:200]}" for h in c.history]
    if context.unavailable:
        out += ["", "## Not runnable here (do not propose)"]
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for u in context.unavailable:
            manifest, _, variant = u.id.partition(":")
            groups.setdefault((manifest, tuple(u.reasons[:2])), []).append(variant)
        for (manifest, reasons), variants in groups.items():
            out.append(f"- {manifest}:{{{','.join(variants)}}}: {'; '.join(reasons)}")
    out += ["", "## Baseline"]
    b = context.baseline
    if b is None:
        out.append("Not measured yet (every cycle measures the live recipe first).")
    else:
        which = "live now" if b.is_live_recipe else "no longer live"
        out.append(
            f"Cycle {b.cycle_id} measured {b.recipe} ({which}; suite {b.suite}, "
            f"{b.max_tokens} max tokens): median decode {b.decode_tps_median} tok/s, "
            f"median TTFT {b.ttft_s_median} s, peak memory {b.peak_memory_gb} GB, "
            f"{b.samples} requests, {b.errors} failed."
        )
        if b.per_prompt_decode_tps:
            out.append(
                "Per prompt, decode tok/s: "
                + ", ".join(f"{k} {v}" for k, v in b.per_prompt_decode_tps.items())
                + "."
            )
    out += ["", "## Past cycles (newest first, failures included)"]
    if not context.past_cycles:
        out.append("None yet.")
    for cyc in context.past_cycles:
        decided = ", ".join(line.split(" (", 1)[0] for line in cyc.candidates)
        out.append(
            f"- {cyc.cycle_id}: {cyc.outcome}"
            + (f", selected {cyc.selected}" if cyc.selected else "")
            + (f" ({cyc.speedup_pct:+.1f}%)" if cyc.speedup_pct is not None else "")
            + (" [interrupted, recovered]" if cyc.interrupted else "")
            + f" — {cyc.reason[:160]}"
            + (f" [{decided}]" if decided else "")
        )
    out += [
        "",
        f"## Policy {p.name}",
        f"- min_speedup_pct: default {p.min_speedup_pct.default}; a plan may only raise it, "
        f"within [{p.min_speedup_pct.low}, {p.min_speedup_pct.high}].",
        f"- max_peak_memory_gb: default {p.max_peak_memory_gb.default}; a plan may only lower "
        f"it, within [{p.max_peak_memory_gb.low}, {p.max_peak_memory_gb.high}], never below "
        "the baseline's measured peak.",
        f"- no prompt may slow down by more than {p.worst_prompt_tolerance_pct}%; "
        "auto-promotion: " + ", ".join(k for k, v in p.auto_promote.items() if v) + " only.",
        f"- cycles start: {p.window}; protocol: suite {p.suite}, {p.repeats} repeats, "
        f"{p.max_tokens} max tokens.",
        "",
        "## Your answer",
        "Exactly one JSON object, nothing after it:",
        '{"hypothesis": "<one line, at most 300 characters>", "candidates": ["<1 to 3 ids from '
        'the list you may propose>"], "acceptance": {"min_speedup_pct": <number>, '
        '"max_peak_memory_gb": <number>}, "notes": "<optional>"}',
        "Use only listed ids; never the baseline (always measured first); omit acceptance "
        "unless you want stricter thresholds; prefer untried or inconclusive candidates; do "
        "not repeat one a past cycle rejected on a gate unless something changed.",
        "The JSON goes to this MCP server's `propose_plan` tool (dry_run=true shows how it "
        "would be sanitized)."
        if can_propose
        else "This MCP server is read-only: give the JSON "
        "to a person, who can run `mcp-infra propose PLAN.json`.",
    ]
    return "\n".join(out)


def local_plan_text(result: LocalPlanResult) -> str:
    lines = [("accepted" if result.accepted else "not accepted") + f": {result.message}"]
    if result.proposal:
        p = result.proposal
        if p.get("plan_id"):
            lines.append(
                f"plan {p['plan_id']}: {', '.join(p.get('candidates', []))}"
                + (" (dry run, not queued)" if result.dry_run else "")
            )
        lines += [
            f"  change: {c['field']} {c['action']}: {c['reason']}" for c in p.get("changes", [])
        ]
        lines += [f"  refused: {r['id']}: {r['reason']}" for r in p.get("refused", [])]
        lines += [f"  problem: {x}" for x in p.get("problems", [])]
        if p.get("follow"):
            lines.append(f"follow: {p['follow']}")
    elif result.reply_excerpt and not result.submitted:
        excerpt = result.reply_excerpt.replace("\n", " ")[:300]
        lines.append(f"model reply began: {excerpt!r}")
    return "\n".join(lines)


def cycles_text(view: app.EvidenceView) -> str:
    """One line per sealed cycle (the CLI's `evidence list`)."""
    return (
        "\n".join(
            f"{c.cycle_id}  {c.outcome.value:20} {c.selected or '-':28} {c.reason}"
            for c in view.cycles or []
        )
        or "No sealed cycle yet."
    )


def summary_line(summary: CycleSummary) -> str:
    """A cycle's outcome in one line (supervise, approve)."""
    return (
        f"{summary.cycle_id}: {summary.outcome.value}"
        + (f", live recipe {summary.selected}" if summary.selected else "")
        + (f" ({summary.speedup_pct:+.1f}%)" if summary.speedup_pct is not None else "")
        + f" — {summary.reason}"
    )


def tasks_text(tasks: list[TaskSpec]) -> str:
    return "\n".join(f"{t.id:12} {t.prompt}\n{'':12} checks: {t.checks}" for t in tasks)


def task_check_text(result: TaskCheck) -> str:
    return f"{result.task}: {'PASS' if result.passed else 'FAIL'} — {result.detail}"


def prepared_text(result: PrepareResult) -> str:
    lines = [
        f"{result.candidate}: prepared in {result.cache}"
        + (" (offline: from the cache)" if result.offline else "")
    ]
    for a in result.artifacts:
        lines.append(
            f"  {a.role:6} {a.repo}@{a.revision[:12]}: {a.files} files, "
            f"{a.bytes / 1e9:.2f} GB ({a.downloaded_bytes / 1e9:.2f} GB downloaded); "
            f"sha256 inventory {a.inventory}"
        )
    return "\n".join(lines)


def verification_text(result: Verification) -> str:
    head = "VERIFIED" if result.ok else "FAILED: " + ", ".join(result.failed)
    key = f" (key {result.key_fingerprint[:16]}…)" if result.key_fingerprint else ""
    lines = [f"{result.bundle}: {head}{key}"]
    marks = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}
    lines += [f"  {marks[c.status]} {c.name:22} {c.detail}" for c in result.checks]
    return "\n".join(lines)


def cost_text(cost: CycleCost | None) -> str:
    if cost is None:
        return "cost: not recorded in this bundle"
    lines = [
        f"cost: {cost.wall_s:.1f} s wall; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in cost.phases_s.items())
    ]
    if cost.supervisor_cpu_s is not None:
        lines.append(f"    supervisor CPU {cost.supervisor_cpu_s:.1f} s")
    for s in cost.servers:
        peak = f", peak {s.peak_rss_gb:.2f} GB" if s.peak_rss_gb is not None else ""
        lines.append(f"    {s.label} ({s.role}, pid {s.pid}): CPU {s.cpu_s:.1f} s{peak} — {s.note}")
    down = f"{cost.downtime_s:.2f} s" if cost.downtime_s is not None else "unknown"
    lines.append(f"    downtime of the stable port: {down} ({cost.downtime_source})")
    lines.append(f"    bytes downloaded: {cost.bytes_downloaded} ({cost.bytes_note})")
    lines.append(
        "    energy: "
        + (
            f"{cost.energy_j:.1f} J ({cost.energy_note})"
            if cost.energy_j is not None
            else cost.energy_note
        )
    )
    lines.append(f"    cost against gain: {cost.gain_note}")
    return "\n".join(lines)
