"""The texts of the views both faces show: status, registry, evidence, a proposal, a verdict's
table, the small answers of the CLI."""

from __future__ import annotations

import json
from typing import Any

from mcp_infra.contracts import CycleSummary, FrozenPlan, Verdict
from mcp_infra.core.gates import TaskCheck, TaskSpec
from mcp_infra.core.progress import duration_text
from mcp_infra.core.units import fmt_pct
from mcp_infra.faces.render.words import (
    MAX_TEXT,
    METHOD,
    bounded,
    cost_line,
    cost_text,
    divergences_once,
    excerpt,
    generic,
    person_must,
    plain,
    runtime_line,
    service_text,
    short,
)
from mcp_infra.flows import api as app
from mcp_infra.flows.status import ServiceView
from mcp_infra.state.artifacts import PrepareResult
from mcp_infra.state.verification import Verification


def status_text(view: app.StatusView) -> str:
    if not view.configured:
        return bounded([f"Not configured (home {view.home}).", *view.problems])
    lines = _service_lines(view.service) + _cycle_lines(view)
    lines.append(f"Queue (waiting): {', '.join(view.queue) if view.queue else 'empty'}.")
    if view.evidence_key:
        lines.append(f"Evidence signing key (Ed25519) fingerprint: {view.evidence_key}.")
    lines += _last_cycle_lines(view)
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
    return bounded(lines)


def _service_lines(s: ServiceView | None) -> list[str]:
    if s is None:
        return []
    since = f", since {s.since:%Y-%m-%d %H:%M:%S} UTC (pid {s.pid})" if s.since else ""
    checked = (
        " (process and port checked, no request sent during a cycle)"
        if ("no request sent" in s.health_check)
        else ""
    )
    lines = [
        f"Service {s.endpoint}: {'healthy' if s.healthy else 'NOT answering'}"
        f"{checked}; "
        f"active recipe {s.active_recipe} ({app.knobs_text(s.knobs)})"
        + (f", runtime {s.runtime}" if s.runtime else "")
        + f"{since}."
    ]
    if s.healing:
        lines.append(f"Self-healing: {s.healing}.")
    notes = [("Logging", s.logging), ("The front's stuck proxy replaced", s.front_replaced)]
    lines += [f"{what}: {note}." for what, note in notes if note]
    return lines


def _cycle_lines(view: app.StatusView) -> list[str]:
    c = view.cycle
    if c is None:
        runs = f" (a supervisor runs, pid {view.supervisor_pid})" if view.supervisor_running else ""
        return [f"No cycle in progress{runs}."]
    lines = [
        f"Cycle in progress {c.cycle_id}, running plan {c.plan_id or '?'}: "
        f"{c.progress or c.state}"
        + (f"; running for {duration_text(c.elapsed_s)}" if c.elapsed_s is not None else "")
        + f". {c.message}."
    ]
    if c.downtime_note:
        lines.append(f"Expected downtime: {c.downtime_note}.")
    if c.projection:
        lines.append(f"Cost: {c.projection}.")
    return lines


def _last_cycle_lines(view: app.StatusView) -> list[str]:
    """The last sealed cycle, its outcome withheld where its bundle does not verify."""
    lc = view.last_cycle
    if lc is None:
        return ["No sealed cycle yet."]
    if view.last_cycle_verified is False:
        lines = [
            f"Last cycle {lc.cycle_id}: its bundle DOES NOT VERIFY "
            f"({view.last_cycle_problem}); its outcome and figures are not shown."
        ]
    else:
        lines = [
            f"Last cycle {lc.cycle_id}: {lc.outcome.value}"
            + (f", selected {lc.selected}" if lc.selected else "")
            + (f" ({lc.speedup_pct:+.1f}%)" if lc.speedup_pct is not None else "")
            + f" — {lc.reason} (bundle verified: hashes and signature)"
        ]
    if view.verify_command:
        lines.append(f"Check it for good: {view.verify_command}.")
    return lines


def registry_text(view: app.RegistryView, page: int = 1, pages: int = 1) -> str:
    """One line per candidate (of this page); a preflight failure shared by every variant of a
    manifest is stated once for the manifest, not once per variant, and a cost every candidate
    that passes preflight shares (none measured yet) once for all."""
    where = f" on page {page} of {pages}" if pages > 1 else ""
    lines = [
        f"{len(view.candidates)} candidate(s){where}; live recipe: {view.live_recipe or 'none'}."
    ]
    # what is missing from the list comes first: a long list is cut at its end
    lines += [f"not offered for this model: {n.subject}: {n.reason}" for n in view.not_offered]
    lines += [f"NOT LOADED: {problem}" for problem in view.problems]
    costs = {c.id: cost_line(c.cost) for c in view.candidates if c.preflight_passed}
    said_once = set(costs.values())
    cost_once = said_once.pop() if len(costs) > 1 and len(said_once) == 1 else None
    if cost_once:
        lines.append(f"each candidate that passes preflight, alone in a plan: {cost_once}")
    by_manifest: dict[str, list[app.CandidateView]] = {}
    for c in view.candidates:
        by_manifest.setdefault(c.id.split(":", 1)[0], []).append(c)
    for manifest, group in by_manifest.items():
        failing = [
            {generic(f"{k.name}: {k.detail}", c.id) for k in c.checks if not k.passed}
            for c in group
        ]
        shared = set.intersection(*failing) if len(group) > 1 and failing else set()
        if shared:
            ids = ", ".join(c.id.split(":", 1)[1] for c in group)
            lines.append(f"{manifest} ({len(group)} variants: {ids}) all fail preflight:")
            lines += [
                f"    fails {line.replace('{id}', manifest + ':VARIANT')}"
                for line in sorted(shared)
            ]
        for c, fails in zip(group, failing, strict=True):
            verdict = "passes preflight" if c.preflight_passed else "FAILS preflight"
            auto = "" if c.auto_promote else "; not auto-promoted by policy"
            lines.append(
                f"- {c.id}: {c.title}. {c.candidate_class}, {c.semantics}, "
                f"knobs {app.knobs_text(c.knobs)}; {verdict}"
                + (" (as above)" if shared and fails == shared else "")
                + f"{auto}."
            )
            lines += [f"    fails {line.replace('{id}', c.id)}" for line in sorted(fails - shared)]
            if c.runtime is not None:
                lines.append(f"    runtime: {runtime_line(c.runtime)}")
            for item in c.learned[-3:]:
                reason = f": {plain(item.reasons[0])}" if item.reasons else ""
                changed = "" if item.current else " (since then something changed)"
                lines.append(
                    f"    cycle {item.cycle_id}: {item.decision} "
                    f"({fmt_pct(item.speedup_estimate)}){changed}{reason}"
                )
            if c.skip:
                lines.append(f"    skipped in plans: {c.skip}")
            if (said := costs.get(c.id)) and said != cost_once:
                lines.append(f"    alone in a plan: {said}")
    if page < pages:
        lines.append(f"More: registry with page={page + 1}.")
    return bounded(lines)


def init_text(view: app.InitView) -> str:
    """What `init --model` did, the catalog it made, and what to run next."""
    model = view.model
    where = f"{model.repo}@{model.revision[:12]}" if model.repo and model.revision else model.path
    counts = ", ".join(f"{n} {klass}" for klass, n in sorted(view.candidates.items()))
    lines = [
        f"{view.config} {view.home}/config.yaml: the live service serves {where} "
        f"({model.files} files, {model.bytes / 1e6:.1f} MB, sha256 {model.digest[:12]}…) with "
        f"{view.template} on 127.0.0.1:{view.port} under policy {view.policy}.",
        f"catalog: {sum(view.candidates.values())} candidate(s) ({counts or 'none'}).",
    ]
    lines += [f"    not offered: {n.subject}: {n.reason}" for n in view.notes]
    lines += [f"next: {line}" for line in view.said]
    return "\n".join(lines)


def evidence_text(view: app.EvidenceView) -> str:
    if view.cycles is not None:
        return _listing_text(view)
    if view.verified is False and view.summary:
        lines = [
            f"cycle {view.summary.cycle_id}: its evidence DOES NOT VERIFY; failed checks: "
            + ", ".join(view.failed_checks or [])
            + ". Its figures are not shown; the structured content carries them, unverified."
        ]
    else:
        lines = verdict_table(view).splitlines() if (view.summary or view.verdict) else []
    if view.summary and view.summary.interrupted:
        lines.append("The cycle was interrupted, then recovered.")
    if view.heldout:
        lines.append(f"Held-out confirmation: {plain(view.heldout)}")
    if view.online_check:
        lines.append(f"Online check before the switch: {view.online_check}")
    if view.answers_kept:
        lines.append(f"Answers not asked again: {view.answers_kept}.")
    if view.verified:
        lines.append("Evidence verifies: every check passed.")
    if view.verify_command and view.section == "summary":
        lines.append(f"Check it yourself: {view.verify_command}.")
    if view.cost is not None:
        lines.append(cost_text(view.cost, service_counted=view.service_impact is not None))
    if view.report_path:
        lines.append(
            f"Report (self-contained HTML): {view.report_path} (resource {view.report_uri})."
        )
    if view.gates is not None:
        for g in view.gates:
            lines.append(
                f"- {g['candidate']} {g['gate']}: {'passed' if g['passed'] else 'FAILED'}"
                f" — {divergences_once(g['detail'], cap=None)}"
            )
    if view.plan is not None:
        lines += _plan_lines(view.plan)
    if view.journal is not None:
        lines += _journal_lines(view.journal, view.page, view.pages)
    return bounded(lines + _more(view))


def _more(view: app.EvidenceView) -> list[str]:
    """Where to read on: the other sections after a summary, the next page of a section."""
    if view.section == "summary" and view.summary:
        return ["More: evidence with section=gates | verdict | plan | journal."]
    if view.section in ("verdict", "gates", "table") and view.page < view.pages:
        return [f"Page {view.page} of {view.pages}; more: page={view.page + 1}."]
    return []


def _listing_text(view: app.EvidenceView) -> str:
    """The page of sealed cycles: a bundle that does not verify is named, its figures withheld."""
    cycles = view.cycles or []
    if not cycles:
        return "No sealed cycle yet."
    lines = [f"Sealed cycles, newest first (page {view.page} of {view.pages}):"]
    flagged = view.not_verified or {}
    for s in cycles:
        if s.cycle_id in flagged:
            lines.append(
                f"- {s.cycle_id}: DOES NOT VERIFY ({flagged[s.cycle_id]}); its outcome and "
                "figures are withheld"
            )
            continue
        lines.append(
            f"- {s.cycle_id} ({s.started_at:%Y-%m-%d %H:%M} UTC): {s.outcome.value}"
            + (f", selected {s.selected}" if s.selected else "")
            + (f" ({s.speedup_pct:+.1f}%)" if s.speedup_pct is not None else "")
            + f" — {s.reason}"
        )
    shown = len(cycles) - len(flagged)
    lines.append(
        f"{shown} of {len(cycles)} verified (hashes and signature)"
        + (f"; check one for good: {view.verify_command}" if view.verify_command else "")
        + "."
    )
    return bounded(lines)


def _plan_lines(p: FrozenPlan) -> list[str]:
    """The frozen plan: who proposed what, its thresholds, every change and refusal."""
    lines = [
        f"Frozen plan {p.plan_id} by {p.proposed_by}: {', '.join(p.candidates)}; "
        f"thresholds min speedup {p.thresholds.min_speedup_pct}%, max peak memory "
        f"{p.thresholds.max_peak_memory_gb} GB."
    ]
    lines += [f"  change {c.field} {c.action}: {c.reason}" for c in p.changes]
    lines += [f"  refused {r.id}: {r.reason}" for r in p.refused]
    return lines


def _journal_lines(journal: list[dict[str, Any]], page: int, pages: int) -> list[str]:
    """One page of the journal, a line per event (a line that could not be read says so)."""
    lines = [f"Journal page {page} of {pages}:"]
    for row in journal:
        if "problem" in row:
            lines.append(f"  problem: {row['problem']}")
            continue
        fields = json.dumps(row.get("fields") or {}, default=str)
        lines.append(
            f"  {row.get('ts')} {row.get('state')}: {row.get('message')}"
            + (f" {fields[:300]}" if fields != "{}" else "")
        )
    return lines


def proposal_text(
    view: app.ProposalView, person_fix: str | None = None, *, cli: bool = False
) -> str:
    """The proposal in words (``cli``: a person's at a terminal, else a model's over MCP). A
    refusal is one line that says who can fix it: the caller (the default), or, with
    ``person_fix``, a person (and what they run)."""
    head = "DRY RUN — " if view.dry_run else ""
    if not view.accepted:  # one line: the message already names every problem
        said = view.message
        extra = [p for p in view.problems if p not in said]
        extra += [f"{r.id}: {r.reason}" for r in view.refused if f"{r.id}: {r.reason}" not in said]
        line = f"{head}REFUSED (nothing queued): {'; '.join([said, *extra])}"
        if person_fix:
            return person_must(line, person_fix)[:MAX_TEXT]
        where = (
            "candidate ids: `mcp-infra registry`) and run `mcp-infra propose` again"
            if cli
            else "candidate ids: `registry`; the schema: mcp-infra://plan-schema) and call "
            "propose_plan again"
        )
        return f"{line}. Fix what is named ({where}."[:MAX_TEXT]
    lines = [
        f"{head}ACCEPTED plan {view.plan_id}: {view.message}.",
        f"Candidates, in order: {', '.join(view.candidates)}.",
        "Thresholds: " + ", ".join(f"{k}={v}" for k, v in (view.thresholds or {}).items()) + ".",
    ]
    refused = {(r.id, r.reason) for r in view.refused}
    lines += [
        f"- change {c.field} {c.action}"
        + (f" ({short(c.value)})" if c.value is not None else "")
        + f": {c.reason}"
        for c in view.changes
        if (c.value, c.reason) not in refused  # a refusal is stated once, below
    ]
    lines += [f"- refused {r.id}: {r.reason}" for r in view.refused]
    if view.window:
        lines.append(f"Runs: {view.window}.")
    if cost_said := cost_line(view.cost):
        lines.append(f"Cost: {cost_said}")
    if view.queue_position:
        lines.append(f"Queue position: {view.queue_position}.")
    if view.follow:
        lines.append(f"Follow: {view.follow}.")
    return bounded(lines)


def verdict_table(view: app.EvidenceView) -> str:
    """Per candidate: decode tok/s, speedup with interval, gates, decision."""
    verdict = view.verdict
    lines = []
    if view.summary:
        s = view.summary
        lines.append(
            f"cycle {s.cycle_id}: {s.outcome.value}"
            + (f", selected {s.selected}" if s.selected else "")
            + f" — {plain(s.reason)}"
        )
    if (impact := getattr(view, "service_impact", None)) is not None:
        lines.append(service_text(impact))
    if verdict is None:
        if view.table:
            lines += table_rows(view.table)
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
            lines.append(f"    {plain(reason)}")
    lines += screening_lines(verdict)
    if view.table:
        lines += table_rows(view.table)
    lines.append(f"({METHOD})")
    return "\n".join(lines)


def screening_lines(verdict: Verdict) -> list[str]:
    """What a screened plan's screening round dropped, one line per candidate with why."""
    screening = verdict.screening
    if screening is None:
        return []
    judged = len(screening.judged) + len(screening.held)
    lines = [
        f"screening ({screening.confidence:.0%}, one short start each): "
        f"dropped {len(screening.dropped)} of {judged}"
        + (f"; not judged on a busy machine: {', '.join(screening.held)}" if screening.held else "")
    ]
    lines += [f"    {name}: {plain(why)}" for name, why in screening.dropped.items()]
    return lines


def table_rows(table: list[dict[str, Any]]) -> list[str]:
    """The per-prompt decode table, every row (section=table shows this and nothing else)."""
    lines = ["per prompt (decode tok/s, baseline → candidate):"]
    for row in table:
        lines.append(
            f"    {row['candidate']:26} {row['prompt']:20} {row['baseline_tps']:8.1f} "
            f"→ {row['candidate_tps']:8.1f}  x{row['speedup']:.3f}"
        )
    return lines


def cycles_text(view: app.EvidenceView) -> str:
    """One line per sealed cycle (the CLI's `evidence list`); a bundle that does not verify
    is flagged, its figures withheld."""
    flagged = view.not_verified or {}
    lines = [
        f"{c.cycle_id}  DOES NOT VERIFY ({flagged[c.cycle_id]}); outcome and figures withheld"
        if c.cycle_id in flagged
        else f"{c.cycle_id}  {c.outcome.value:20} {c.selected or '-':28} {c.reason}"
        for c in view.cycles or []
    ]
    if lines and view.verify_command:
        lines.append(f"check one for good: {view.verify_command}")
    return "\n".join(lines) or "No sealed cycle yet."


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
    """A checker's verdict; its detail cut to a short excerpt (a detail may quote the text)."""
    return f"{result.task}: {'PASS' if result.passed else 'FAIL'} — {excerpt(result.detail)}"


def prepared_text(result: PrepareResult) -> str:
    lines = [
        f"{result.candidate}: prepared"
        + (
            f" in {result.cache}"
            if result.artifacts or (result.runtime is None and result.build is None)
            else ""
        )
        + (" (offline: from the cache)" if result.offline else "")
    ]
    for a in result.artifacts:
        lines.append(
            f"  {a.role:6} {a.repo}@{a.revision[:12]}: {a.files} files, "
            f"{a.bytes / 1e9:.2f} GB ({a.downloaded_bytes / 1e9:.2f} GB downloaded); "
            f"sha256 inventory {a.inventory}"
        )
    if (rt := result.runtime) is not None:
        lines.append(
            f"  runtime {rt.label}: {'built already, checked' if rt.reused else 'built'} in "
            f"{rt.path} ({rt.builder}, {rt.packages} packages visible, "
            f"{rt.size_bytes / 1e6:.1f} MB, {rt.seconds:.1f} s); lock {rt.lock_digest[:16]}…"
        )
    if (b := result.build) is not None:
        lines.append(
            f"  build {b.key}: {b.folder} ({b.size_bytes / 1e6:.1f} MB, sha256 {b.digest[:16]}…) "
            f"by `{' '.join(b.argv[1:])}`"
        )
    return "\n".join(lines)


def verification_text(result: Verification) -> str:
    head = "VERIFIED" if result.ok else "FAILED: " + ", ".join(result.failed)
    key = f" (key {result.key_fingerprint[:16]}…)" if result.key_fingerprint else ""
    lines = [f"{result.bundle}: {head}{key}"]
    marks = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}
    lines += [f"  {marks[c.status]} {c.name:22} {c.detail}" for c in result.checks]
    return "\n".join(lines)
