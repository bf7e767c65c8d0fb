"""Every text mcp-infra writes for a person or a model, in one place.

The MCP tools and the CLI show the same words for the same view: each tool also returns the view
as structured content, and this text is its summary, written to be enough on its own for a model
that only sees text, and bounded in size. The planning prompt and the demo's table live here too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mcp_infra.contracts import CycleCost, CycleSummary, FrozenPlan, PlanCost, Verdict
from mcp_infra.core.gates import TaskCheck, TaskSpec
from mcp_infra.core.progress import duration_text
from mcp_infra.core.units import fmt_pct
from mcp_infra.flows import api as app
from mcp_infra.flows.planning import LocalPlanResult, PlanningContext
from mcp_infra.state.artifacts import PrepareResult
from mcp_infra.state.verification import Verification

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
            f"active recipe {s.active_recipe} ({app.knobs_text(s.knobs)})"
            + (f", runtime {s.runtime}" if s.runtime else "")
            + f"{since}."
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
        if view.last_cycle_verified is False:
            lines.append(
                f"Last cycle {lc.cycle_id}: its bundle DOES NOT VERIFY "
                f"({view.last_cycle_problem}); its outcome and figures are not shown."
            )
        else:
            lines.append(
                f"Last cycle {lc.cycle_id}: {lc.outcome.value}"
                + (f", selected {lc.selected}" if lc.selected else "")
                + (f" ({lc.speedup_pct:+.1f}%)" if lc.speedup_pct is not None else "")
                + f" — {lc.reason} (bundle verified: hashes and signature)"
            )
        if view.verify_command:
            lines.append(f"Check it for good: {view.verify_command}.")
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
    """One line per candidate; a preflight failure shared by every variant of a manifest is
    stated once for the manifest, not once per variant."""
    lines = [f"{len(view.candidates)} candidate(s); live recipe: {view.live_recipe or 'none'}."]
    by_manifest: dict[str, list[app.CandidateView]] = {}
    for c in view.candidates:
        by_manifest.setdefault(c.id.split(":", 1)[0], []).append(c)
    for manifest, group in by_manifest.items():
        failing = [
            {_generic(f"{k.name}: {k.detail}", c.id) for k in c.checks if not k.passed}
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
            if c.preflight_passed and (said := cost_line(c.cost)):
                lines.append(f"    alone in a plan: {said}")
    return _bounded(lines)


def runtime_line(view: app.RuntimeView) -> str:
    """Installed against pinned, where it is built (or would be) and its size."""
    versions = "; ".join(
        f"{name} {view.installed[name]} installed, {version} pinned"
        for name, version in view.pinned.items()
    )
    size = (
        f"{view.size_bytes / 1e6:.1f} MB {view.size_basis}"
        if view.size_bytes is not None
        else "size unknown"
    )
    where = "built in" if view.built else "would be built in"
    broken = f"; DIFFERS FROM ITS LOCK: {'; '.join(view.problems[:2])}" if view.problems else ""
    return f"{versions} ({view.site} site); {where} {view.path} ({size}){broken}"


def _generic(line: str, candidate_id: str) -> str:
    """A check's line with the candidate's own id replaced, so variants' lines compare."""
    return line.replace(candidate_id, "{id}")


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
    if view.section == "summary" and view.summary:
        lines.append("More: evidence with section=gates | verdict | plan | journal.")
    return _bounded(lines)


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
    return _bounded(lines)


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
    if cost_said := cost_line(view.cost):
        lines.append(f"Cost: {cost_said}")
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
        down = (
            "the service is down while candidates run (exclusive), for how long cannot be "
            "projected yet"
            if cost.mode == "exclusive"
            else "0 s unserved (concurrent)"
        )
        return f"projected cost {cost.basis}: {cost.why}; {down}." + (
            f" HELD: {cost.held}." if cost.held else ""
        )
    split = (
        f": screening {cost.screening_minutes:.1f} min, deciding {cost.deciding_minutes:.1f}"
        if cost.screening_minutes is not None and cost.deciding_minutes is not None
        else ""
    )
    dropped = (
        f"; screening drops {', '.join(cost.screened_out)} in at least one seed"
        if cost.screened_out
        else ""
    )
    text = (
        f"projected on this machine {cost.minutes:.1f} min{split} (up to "
        f"{cost.minutes_high:.1f}, {cost.seeds} seeds), {cost.rounds} round(s), {cost.requests} "
        f"requests, {(cost.unserved_s or 0.0) / 60:.1f} min unserved ({cost.mode}){dropped}; from "
        f"{', '.join(cost.source[:1])}."
    )
    return text + (f" HELD: {cost.held}." if cost.held else "")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------
# Plain words for the statistics, and each divergence stated once. The selector's reasons are
# recorded in the verdict as they are (section=verdict shows them, and `evidence verify`
# recomputes them); these texts say the same in words a reader does not have to decode. The
# method: docs/statistics.md.
# ---------------------------------------------------------------------------------------------

METHOD = "how these figures are decided: docs/statistics.md (in the mcp-infra source)"

_SPEED = re.compile(
    r"speedup (?P<e>\d+\.\d+x) \((?P<level>\d+(?:\.\d+)?%) interval"
    r"(?:, (?P<look>\d+(?:\.\d+)?%) at this look of early stopping)? "
    r"(?P<lo>\d+\.\d+x) to (?P<hi>\d+\.\d+x)"
    r"(?:, (?P<b>\d+) baseline and (?P<c>\d+) candidate start\(s\))?\)"
    r"(?: against the required (?P<t>\d+\.\d+x))?"
)
_FLOOR = re.compile(r"A/A noise floor (\d+\.\d+x)")


def _speed_words(m: re.Match[str]) -> str:
    sure = m["look"] or m["level"]
    starts = f" over {m['b']} baseline and {m['c']} candidate server start(s)" if m["b"] else ""
    need = f"; at least {m['t']} was needed" if m["t"] else ""
    return (
        f"{m['e']} the baseline's speed, likely between {m['lo']} and {m['hi']} "
        f"({sure} sure{starts}){need}"
    )


def plain(reason: str) -> str:
    """A selector's reason in plain words: "speedup 1.689x (95% interval, 95.5% at this look
    of early stopping 1.312x to 2.175x, ...)" becomes "1.689x the baseline's speed, likely
    between 1.312x and 2.175x (95.5% sure, ...)"; the A/A noise floor becomes what the
    baseline shows against itself; each divergence is stated once."""
    text = _SPEED.sub(_speed_words, reason)
    text = _FLOOR.sub(r"more than the \1 the baseline shows against itself (its noise)", text)
    return divergences_once(text)


_DIVERGES = re.compile(
    r"(?P<prompt>[\w.-]+)(?P<again> \(asked again, prefix cached\))? diverges at token "
    r"(?P<at>\d+) \(baseline [^\[]*\[(?P<b>\d+)\][^)]*vs candidate [^\[]*\[(?P<c>\d+)\][^)]*\)"
)
MAX_DIVERGENCES = 3


def divergences_once(text: str, cap: int | None = MAX_DIVERGENCES) -> str:
    """A greedy output asked again that diverges where it did the first time is one
    divergence ("…, the same when asked again"); past ``cap``, the rest are counted."""
    parts = text.split("; ")
    out: list[str] = []
    seen: dict[tuple[str, str, str, str], int] = {}
    shown = hidden = 0
    for part in parts:
        m = _DIVERGES.fullmatch(part.rstrip("."))
        if m is None:
            out.append(part)
            continue
        key = (m["prompt"], m["at"], m["b"], m["c"])
        if m["again"] and key in seen:
            if seen[key] >= 0:
                out[seen[key]] += ", the same when asked again"
            continue
        if cap is not None and shown >= cap:
            hidden += 1
            seen[key] = -1
            continue
        seen[key] = len(out)
        out.append(part.rstrip("."))
        shown += 1
    if hidden:
        out.append(f"and {hidden} more divergence(s) (section=gates lists them)")
    joined = "; ".join(out)
    return joined if joined.endswith(".") or not text.endswith(".") else joined + "."


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
        f"screening ({screening.confidence:.0%}, one short start each, every gate first): "
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


def service_text(impact: Any) -> str:
    """What the stable endpoint's clients saw, in one line: the one downtime figure of a cycle
    (the front counts every request, so it is what clients saw; restart windows are not)."""

    def known(value: Any, unit: str = "") -> str:
        return f"{value}{unit}" if value is not None else "not counted"

    return (
        f"service during the cycle ({impact.mode} mode): time the stable port did not serve "
        f"{known(impact.unserved_s, ' s')}; {known(impact.live_requests)} client request(s), "
        f"{known(impact.requests_held)} held (longest {known(impact.longest_hold_s, ' s')}), "
        f"{known(impact.rejected_503)} answered 503"
    )


def plan_example(context: PlanningContext) -> dict[str, Any] | None:
    """A plan that parses as it is (the prompt shows it verbatim), naming the first proposable
    candidate no past cycle tried (else the first proposable one)."""
    if not context.runnable:
        return None
    untried = [c for c in context.runnable if not c.history]
    first = (untried or context.runnable)[0]
    return {
        "hypothesis": f"{first.id} ({first.title}) decodes faster than the live recipe here",
        "candidates": [first.id],
    }


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
        "## Candidates you may propose (each passes preflight here and would be accepted)",
    ]
    if not context.runnable:
        out.append("None: no candidate can be proposed now (see below why).")
    for c in context.runnable:
        knobs = ", ".join(f"{k}={v}" for k, v in c.knobs.items()) or "defaults"
        auto = "auto-promote" if c.auto_promote else "NOT auto-promoted: a person decides"
        out.append(f"- {c.id}: {c.title} ({c.candidate_class}, {c.semantics}, {auto}; {knobs})")
        out += [f"  past {h}" for h in c.history]
    if context.unavailable:
        out += ["", "## Not proposable now (a plan naming one is refused)"]
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for u in context.unavailable:
            manifest, _, variant = u.id.partition(":")
            groups.setdefault((manifest, tuple(u.reasons[:2])), []).append(variant)
        for (manifest, reasons), variants in groups.items():
            ids = (
                f"{manifest}:{variants[0]}"
                if len(variants) == 1
                else (f"{manifest}:{{{','.join(variants)}}}")
            )
            out.append(f"- {ids}: {'; '.join(reasons)}")
    out += ["", "## Live recipe's figures"]
    b = context.baseline
    if b is None:
        out.append("Not measured yet (every cycle measures the live recipe first).")
    else:
        which = "live now" if b.is_live_recipe else "no longer live"
        out.append(
            f"Cycle {b.cycle_id} measured {b.recipe} ({which}; suite {b.suite}, "
            f"{b.max_tokens} max tokens; the figures of its evidence): decode "
            f"{b.decode_tps} tok/s, TTFT p50 {b.ttft_s_p50} s, peak memory "
            f"{b.peak_memory_gb} GB, {b.samples} requests, {b.errors} failed."
        )
        for cell in b.cells:
            out.append(
                f"- {cell.request_class} requests, {cell.concurrency} at a time ({cell.role}): "
                f"decode {cell.decode_tps} tok/s, aggregate output {cell.output_tps} tok/s, "
                f"TTFT p50 {cell.ttft_p50_s} s, p99 {cell.ttft_p99_s} s"
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
            + f" — {cyc.reason}"
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
        "Exactly one JSON object and nothing after it. Fields: hypothesis (one line, at most "
        "300 characters), candidates (1 to 16 ids from the list you may propose), optional "
        "acceptance {min_speedup_pct, max_peak_memory_gb} (numbers; only to be stricter than "
        "the policy), optional notes. No other field. The full JSON schema is the MCP "
        "resource mcp-infra://plan-schema.",
    ]
    example = plan_example(context)
    if example is not None:
        out += ["For example:", json.dumps(example)]
    out += [
        "Never the baseline (always measured first); prefer untried or inconclusive "
        "candidates; do not repeat one a past cycle rejected on a gate unless something "
        "changed.",
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
    return f"{result.task}: {'PASS' if result.passed else 'FAIL'} — {result.detail}"


def prepared_text(result: PrepareResult) -> str:
    lines = [
        f"{result.candidate}: prepared"
        + (f" in {result.cache}" if result.artifacts or result.runtime is None else "")
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
    return "\n".join(lines)


def verification_text(result: Verification) -> str:
    head = "VERIFIED" if result.ok else "FAILED: " + ", ".join(result.failed)
    key = f" (key {result.key_fingerprint[:16]}…)" if result.key_fingerprint else ""
    lines = [f"{result.bundle}: {head}{key}"]
    marks = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}
    lines += [f"  {marks[c.status]} {c.name:22} {c.detail}" for c in result.checks]
    return "\n".join(lines)


def cost_text(cost: CycleCost | None, *, service_counted: bool = False) -> str:
    """What the cycle cost. Servers are grouped by configuration and role (one line each, not
    one per start); with ``service_counted`` the stable port's downtime is left to the service
    line (one downtime figure per summary)."""
    if cost is None:
        return "cost: not recorded in this bundle"
    lines = [
        f"cost: {cost.wall_s:.1f} s wall; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in cost.phases_s.items() if v >= 0.05)
    ]
    if cost.supervisor_cpu_s is not None:
        lines.append(f"    supervisor CPU {cost.supervisor_cpu_s:.1f} s")
    groups: dict[tuple[str, str], list[Any]] = {}
    for server in cost.servers:
        groups.setdefault((server.label, server.role), []).append(server)
    for (label, role), servers in groups.items():
        peaks = [s.peak_rss_gb for s in servers if s.peak_rss_gb is not None]
        peak = f", peak {max(peaks):.2f} GB" if peaks else ""
        starts = f"{len(servers)} start(s), " if len(servers) > 1 else ""
        lines.append(
            f"    {label} ({role}): {starts}CPU {sum(s.cpu_s for s in servers):.1f} s{peak}"
            + (f" — {servers[0].note}" if len(servers) == 1 else "")
        )
    if not service_counted:
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
