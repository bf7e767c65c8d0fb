"""What the MCP server says about itself, the planning prompt (a fresh home's too), the local
planner's answer, and the words of following a cycle."""

from __future__ import annotations

import json
from typing import Any

from mcp_infra.contracts import CycleSummary
from mcp_infra.core.menu import Menu
from mcp_infra.faces.render.words import CONFIGURE, unconfigured
from mcp_infra.flows import api as app
from mcp_infra.flows.planning import LocalPlanResult, PlanningContext


def server_instructions(mode: str) -> str:
    text = (
        "mcp-infra measures and switches the configuration of a local LLM service (a local "
        "OpenAI-compatible server). Read `status` (what serves now, any cycle in progress), "
        "`registry` (candidate configurations, whether each passes preflight here, what past "
        "cycles learned) and `evidence` (sealed results). The prompt "
        "`propose_acceleration_plan` gives planning instructions with the live context."
    )
    if mode == "read-only":
        return text + " This server is read-only: it cannot queue experiments."
    return text + (
        " `propose_plan` queues an experiment of 1-16 registry candidates; deterministic code then "
        "measures them against the live baseline, gates them, and promotes a winner only if it "
        "qualifies (a plan of 4 or more is screened first: one short start each drops the clear "
        "losers, and a candidate takes its gates once its speed qualifies it). Keeping the "
        "baseline is a valid result. Plans run when the policy's maintenance window allows; "
        "`propose_plan` returns at once."
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
    ]
    for section in (_candidates, _baseline, _past_cycles, _policy):
        out += ["", *section(context)]
    return "\n".join(out + _answer(context, can_propose))


def _candidates(context: PlanningContext) -> list[str]:
    """What may be proposed, and what may not (grouped by manifest and reason)."""
    out = ["## Candidates you may propose (each passes preflight here and would be accepted)"]
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
    return out


def _baseline(context: PlanningContext) -> list[str]:
    """The live recipe's figures, as its last measuring cycle's evidence states them."""
    out = ["## Live recipe's figures"]
    b = context.baseline
    if b is None:
        return [*out, "Not measured yet (every cycle measures the live recipe first)."]
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
    return out


def _past_cycles(context: PlanningContext) -> list[str]:
    out = ["## Past cycles (newest first, failures included)"]
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
    return out


def _policy(context: PlanningContext) -> list[str]:
    p = context.policy
    return [
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
    ]


def _answer(context: PlanningContext, can_propose: bool) -> list[str]:
    """What the answer must be, an example that parses as it is, and where it goes."""
    out = [
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
    return out + [
        "Never the baseline (always measured first); prefer untried or inconclusive "
        "candidates; do not repeat one a past cycle rejected on a gate unless something "
        "changed.",
        "The JSON goes to this MCP server's `propose_plan` tool (dry_run=true shows how it "
        "would be sanitized)."
        if can_propose
        else "This MCP server is read-only: give the JSON "
        "to a person, who can run `mcp-infra propose PLAN.json`.",
    ]


def menu_prompt(menu: Menu, goal: str | None = None) -> str:
    """The planning prompt for a small model: a numbered menu, answered with numbers or ids.
    It shows no example answer: SmolLM2-135M copied the example's numbers whatever the goal."""
    lines = [
        f"{n}. {item.id}: {item.title} ({item.candidate_class}, "
        + ("lossy" if item.lossy else "lossless")
        + (f", last {item.last_verdict})" if item.last_verdict else ", untried)")
        for n, item in enumerate(menu.items, 1)
    ]
    more = [f"({menu.hidden} more not shown)"] if menu.hidden else []
    return "\n".join(
        [
            "Choose speed experiments for a local LLM service. Code measures each against the "
            "live service and keeps one only if it is faster; lossless ones give the same "
            "answers, lossy ones may not.",
            "Goal: " + (goal.strip() if goal and goal.strip() else "faster answers") + ".",
            "Menu:",
            *lines,
            *more,
            f"Which experiments should run? Answer with 1 to {menu.limit} numbers from the menu "
            "and nothing else.",
        ]
    )


def retry_prompt(problems: list[str], menu: Menu | None, example: dict[str, Any] | None) -> str:
    """The second question after an unusable answer: what was wrong, and the answer's form."""
    why = " ".join("; ".join(problems).split())[:600]
    if menu is not None:
        form = (
            f"Answer again with only the numbers of 1 to {menu.limit} candidates from the "
            f"menu (1 to {len(menu.items)})."
        )
    else:
        form = 'Answer again with exactly one JSON object with "hypothesis" and "candidates"' + (
            f", for example: {json.dumps(example)}" if example else ""
        )
    return f"Your answer could not be used: {why}. {form}"


def local_plan_text(result: LocalPlanResult) -> str:
    lines = [("accepted" if result.accepted else "not accepted") + f": {result.message}"]
    if result.planner != "none":
        lines.append(
            f"planner: {result.planner} ({result.form} prompt, {len(result.attempts)} "
            f"question(s) to the model)"
        )
    for n, attempt in enumerate(result.attempts, 1):
        lines += [f"  answer {n}: {p}" for p in attempt.problems[:2]]
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


def follow_progress(status: app.StatusView, plan_id: str | None) -> str:
    """One progress message while following a proposal's cycle."""
    last, cycle = status.last_cycle, status.cycle
    if last is not None and last.plan_id == plan_id and not cycle:
        return f"sealed {last.cycle_id}: {last.outcome.value}"
    if cycle is not None and cycle.plan_id == plan_id:
        return f"{cycle.cycle_id}: {cycle.progress or cycle.state}"
    return "queued: " + (status.window_now or "waiting for the supervisor")


def followed_to_the_end(last: CycleSummary) -> str:
    return (
        f"cycle {last.cycle_id} sealed: {last.outcome.value}"
        + (f", selected {last.selected}" if last.selected else "")
        + f"; call `evidence` with cycle_id {last.cycle_id} for the evidence"
    )


def followed_for(seconds: int) -> str:
    return (
        f"followed for {seconds} s; the cycle goes on: call `status` for progress and "
        "`evidence` once it is sealed"
    )


def unconfigured_prompt(home: Any) -> str:
    """The planning prompt of a fresh home: what is missing and who provides it."""
    return (
        f"mcp-infra cannot plan an experiment yet: {unconfigured(str(home.root))}, so there is "
        "no live service to measure and no candidate to propose. A person must configure one "
        f"first: {CONFIGURE}. Tell the person so; propose_plan refuses every plan until `status` "
        "says the home is configured."
    )
