"""Readable text for the MCP tools' results: what a model (or a person in an MCP host) reads.

Every tool also returns the same view as structured content; this text is its summary, written to
be enough on its own for a model that only sees text, and bounded in size.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_infra import app

MAX_TEXT = 12_000


def _bounded(lines: list[str]) -> str:
    text = "\n".join(lines)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT].rsplit("\n", 1)[0] + "\n… (cut; the structured content is complete)"
    return text


def _pct(speedup: float | None) -> str:
    return f"{(speedup - 1) * 100:+.1f}%" if speedup is not None else "-"


def status_text(view: app.StatusView) -> str:
    if not view.configured:
        return _bounded([f"Not configured (home {view.home}).", *view.problems])
    lines = []
    if view.service:
        s = view.service
        since = f", since {s.since:%Y-%m-%d %H:%M:%S} UTC (pid {s.pid})" if s.since else ""
        checked = " (process and port checked, no request sent during a cycle)" if (
            "no request sent" in s.health_check) else ""
        lines.append(f"Service {s.endpoint}: {'healthy' if s.healthy else 'NOT answering'}"
                     f"{checked}; "
                     f"active recipe {s.active_recipe} ({app.knobs_text(s.knobs)}){since}.")
    if view.cycle:
        c = view.cycle
        lines.append(f"Cycle in progress {c.cycle_id} (plan {c.plan_id or '?'}): "
                     f"{c.progress or c.state}"
                     + (f"; running for {c.elapsed_s:.0f} s" if c.elapsed_s is not None else "")
                     + f". {c.message}.")
        if c.downtime_note:
            lines.append(f"Expected downtime: {c.downtime_note}.")
    else:
        lines.append("No cycle in progress"
                     + (f" (a supervisor runs, pid {view.supervisor_pid})."
                        if view.supervisor_running else "."))
    lines.append(f"Queue: {', '.join(view.queue) if view.queue else 'empty'}.")
    if view.evidence_key:
        lines.append(f"Evidence signing key (Ed25519) fingerprint: {view.evidence_key}.")
    if view.last_cycle:
        lc = view.last_cycle
        lines.append(f"Last cycle {lc.cycle_id}: {lc.outcome.value}"
                     + (f", selected {lc.selected}" if lc.selected else "")
                     + (f" ({lc.speedup_pct:+.1f}%)" if lc.speedup_pct is not None else "")
                     + f" — {lc.reason}")
    else:
        lines.append("No sealed cycle yet.")
    window = view.window or {}
    when = (f"{window.get('start')}-{window.get('end')} {window.get('timezone')}"
            if window.get("mode") == "window" else window.get("mode", "?"))
    lines.append(f"Policy {view.policy}; maintenance window: {when}"
                 + (f"; server mode: {view.server_mode}" if view.server_mode else "") + ".")
    if view.window_now:
        lines.append(f"A queued plan {view.window_now}.")
    if view.needs_operator:
        lines.append(f"NEEDS OPERATOR: {view.needs_operator} "
                     "(a person must run `mcp-infra recover`).")
    lines += [f"Problem: {p}" for p in view.problems]
    return _bounded(lines)


def registry_text(view: app.RegistryView) -> str:
    lines = [f"{len(view.candidates)} candidate(s); live recipe: {view.live_recipe or 'none'}."]
    for c in view.candidates:
        verdict = "passes preflight" if c.preflight_passed else "FAILS preflight"
        auto = "" if c.auto_promote else "; not auto-promoted by policy"
        lines.append(f"- {c.id}: {c.title}. {c.candidate_class}, {c.semantics}, "
                     f"knobs {app.knobs_text(c.knobs)}; {verdict}{auto}.")
        for check in c.checks:
            if not check.passed:
                lines.append(f"    fails {check.name}: {check.detail}")
        for item in c.learned[-3:]:
            reason = f": {item.reasons[0]}" if item.reasons else ""
            lines.append(f"    cycle {item.cycle_id}: {item.decision} "
                         f"({_pct(item.speedup_estimate)}){reason}")
    return _bounded(lines)


def evidence_text(view: app.EvidenceView) -> str:
    if view.cycles is not None:
        if not view.cycles:
            return "No sealed cycle yet."
        lines = [f"Sealed cycles, newest first (page {view.page} of {view.pages}):"]
        for s in view.cycles:
            lines.append(f"- {s.cycle_id} ({s.started_at:%Y-%m-%d %H:%M} UTC): {s.outcome.value}"
                         + (f", selected {s.selected}" if s.selected else "")
                         + (f" ({s.speedup_pct:+.1f}%)" if s.speedup_pct is not None else "")
                         + f" — {s.reason}")
        return _bounded(lines)
    lines = []
    if view.summary:
        s = view.summary
        lines.append(f"Cycle {s.cycle_id} (plan {s.plan_id}): {s.outcome.value}"
                     + (f", selected {s.selected}" if s.selected else "")
                     + f"; live recipe after it: {s.active_recipe}. {s.reason}"
                     + (" (interrupted, then recovered)" if s.interrupted else ""))
    if view.verdict:
        for c in view.verdict.candidates:
            gates = ", ".join(f"{g.gate} {'ok' if g.passed else 'FAILED'}" for g in c.gates)
            ci = (f" [{_pct(c.ci_low)}, {_pct(c.ci_high)}]" if c.ci_low is not None
                  and c.ci_high is not None else "")
            lines.append(f"- {c.candidate}: {c.decision.value}; speedup {_pct(c.speedup_estimate)}"
                         f"{ci}; gates: {gates or 'none'}. " + "; ".join(c.reasons[:3]))
    if view.verified is not None:
        lines.append("Evidence verifies: every check passed." if view.verified else
                     "Evidence does NOT verify; failed checks: "
                     + ", ".join(view.failed_checks or []))
    if view.cost is not None:
        c = view.cost
        lines.append(f"Cost: {c.wall_s:.0f} s wall, {c.measurement_s:.0f} s measuring; downtime "
                     f"{c.downtime_s if c.downtime_s is not None else 'unknown'} s "
                     f"({c.downtime_source}); {c.gain_note}.")
    if view.report_path:
        lines.append(f"Report (self-contained HTML): {view.report_path} "
                     f"(resource {view.report_uri}).")
    if view.table:
        lines.append("Per prompt (baseline → candidate decode tok/s):")
        lines += [f"  {r['candidate']} {r['prompt']}: {r['baseline_tps']} → {r['candidate_tps']} "
                  f"(x{r['speedup']})" for r in view.table]
    if view.gates is not None:
        for g in view.gates:
            lines.append(f"- {g['candidate']} {g['gate']}: {'passed' if g['passed'] else 'FAILED'}"
                         f" — {g['detail']}")
    if view.plan is not None:
        p = view.plan
        lines.append(f"Frozen plan {p.plan_id} by {p.proposed_by}: {', '.join(p.candidates)}; "
                     f"thresholds min speedup {p.thresholds.min_speedup_pct}%, max peak memory "
                     f"{p.thresholds.max_peak_memory_gb} GB.")
        lines += [f"  change {c.field} {c.action}: {c.reason}" for c in p.changes]
        lines += [f"  refused {r.id}: {r.reason}" for r in p.refused]
    if view.journal is not None:
        lines.append(f"Journal page {view.page} of {view.pages}:")
        for row in view.journal:
            if "problem" in row:
                lines.append(f"  problem: {row['problem']}")
                continue
            fields = json.dumps(row.get("fields") or {}, default=str)
            lines.append(f"  {row.get('ts')} {row.get('state')}: {row.get('message')}"
                         + (f" {fields[:300]}" if fields != "{}" else ""))
    if view.section == "summary" and view.summary:
        lines.append("More: evidence with section=gates | verdict | plan | journal.")
    return _bounded(lines)


def proposal_text(view: app.ProposalView) -> str:
    head = "DRY RUN — " if view.dry_run else ""
    if not view.accepted:
        lines = [f"{head}REFUSED: {view.message}"]
        lines += [f"- {p}" for p in view.problems]
        lines += [f"- refused {r.id}: {r.reason}" for r in view.refused]
        lines.append("Nothing was queued. Fix the plan (see `registry` for candidate ids) and "
                     "call propose_plan again.")
        return _bounded(lines)
    lines = [f"{head}ACCEPTED plan {view.plan_id}: {view.message}.",
             f"Candidates, in order: {', '.join(view.candidates)}.",
             "Thresholds: " + ", ".join(f"{k}={v}" for k, v in (view.thresholds or {}).items())
             + "."]
    lines += [f"- change {c.field} {c.action}"
              + (f" ({_short(c.value)})" if c.value is not None else "") + f": {c.reason}"
              for c in view.changes]
    lines += [f"- refused {r.id}: {r.reason}" for r in view.refused]
    if view.window:
        lines.append(f"Runs: {view.window}.")
    if view.queue_position:
        lines.append(f"Queue position: {view.queue_position}.")
    if view.follow:
        lines.append(f"Follow: {view.follow}.")
    return _bounded(lines)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
