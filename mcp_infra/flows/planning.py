"""What a planner needs to know, read from the home directory without touching the service:
what can run here, how fast the live recipe is, what past cycles found, the policy's bounds.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleSummary,
    Outcome,
    Plan,
    Policy,
    Verdict,
)
from mcp_infra.core.extraction import Extraction
from mcp_infra.core.menu import Menu, MenuItem, ModelSize, PromptForm, make_menu, model_size
from mcp_infra.core.preflight import preflight
from mcp_infra.core.units import fmt_pct
from mcp_infra.state import evidence as evidence_mod
from mcp_infra.state import memory
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.context import HomeContext
from mcp_infra.state.store import CorruptFile, Home, read_optional

PROMPT_NAME = "propose_acceleration_plan"


CLIENT_NAME = "mcp-infra-plan"


MAX_GOAL = 500


PAST_CYCLES = 8


class Brief(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CandidateBrief(Brief):
    id: str
    title: str
    candidate_class: str
    semantics: str
    knobs: dict[str, Any]
    auto_promote: bool
    history: list[str] = Field(default_factory=list)
    last_verdict: str | None = Field(None, description="the newest cycle's, e.g. 'rejected -4.1%'")


class UnavailableBrief(Brief):
    id: str
    reasons: list[str]


class CellFigures(Brief):
    """The live recipe's figures in one workload cell, as the verdict computed them."""

    request_class: str
    concurrency: int
    role: str
    decode_tps: float | None
    output_tps: float | None = Field(None, description="aggregate output tok/s of the cell")
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class BaselineFigures(Brief):
    """The live recipe's figures from the newest cycle that measured it: the same cells and
    numbers as that cycle's evidence (its verdict), never a pool of other cells' samples."""

    cycle_id: str
    recipe: str
    is_live_recipe: bool
    suite: str
    max_tokens: int
    decode_tps: float | None = Field(None, description="the headline cell's decode tok/s")
    ttft_s_p50: float | None = None
    cells: list[CellFigures] = Field(default_factory=list)
    per_prompt_decode_tps: dict[str, float]
    peak_memory_gb: float | None
    samples: int
    errors: int


class PastCycle(Brief):
    cycle_id: str
    outcome: str
    selected: str | None
    speedup_pct: float | None
    reason: str
    interrupted: bool
    candidates: list[str] = Field(default_factory=list)


class ThresholdBounds(Brief):
    default: float
    low: float
    high: float


class PolicyBounds(Brief):
    name: str
    min_speedup_pct: ThresholdBounds
    max_peak_memory_gb: ThresholdBounds
    worst_prompt_tolerance_pct: float
    auto_promote: dict[str, bool]
    window: str
    suite: str
    repeats: int
    max_tokens: int


class PlanningContext(Brief):
    live_recipe: str
    endpoint: str
    runnable: list[CandidateBrief]
    unavailable: list[UnavailableBrief]
    baseline: BaselineFigures | None
    past_cycles: list[PastCycle]
    policy: PolicyBounds
    plan_schema: dict[str, Any]


def build_context(home: Home) -> PlanningContext:
    """Everything a planner should know, read from the home directory (no service is touched)."""
    ctx = HomeContext(home)
    config, live = ctx.config, ctx.live
    summaries = evidence_mod.list_cycles(home)
    verdicts = {s.cycle_id: _verdict(home, s.cycle_id) for s in summaries[:50]}
    runnable, unavailable = candidate_briefs(ctx, _history(summaries[:50], verdicts))
    return PlanningContext(
        live_recipe=live.candidate_id,
        endpoint=f"http://{config.host}:{config.port}/v1",
        runnable=runnable,
        unavailable=unavailable,
        baseline=_baseline_figures(home, summaries, live.candidate_id),
        past_cycles=[_past_cycle(s, verdicts.get(s.cycle_id)) for s in summaries[:PAST_CYCLES]],
        policy=policy_bounds(ctx.policy),
        plan_schema=plan_schema(),
    )


def _history(
    summaries: list[CycleSummary], verdicts: dict[str, Verdict | None]
) -> dict[str, list[str]]:
    """Per candidate, one line per sealed cycle that judged it, oldest first."""
    history: dict[str, list[str]] = {}
    for summary in reversed(summaries):
        verdict = verdicts.get(summary.cycle_id)
        for item in verdict.candidates if verdict else []:
            reason = whole(item.reasons[0], 240) if item.reasons else ""
            speed = (
                f" {fmt_pct(item.speedup_estimate)}" if item.speedup_estimate is not None else ""
            )
            history.setdefault(item.candidate, []).append(
                f"{summary.cycle_id}: {item.decision.value}{speed} — {reason}"
            )
    return history


def candidate_briefs(
    ctx: HomeContext, history: dict[str, list[str]]
) -> tuple[list[CandidateBrief], list[UnavailableBrief]]:
    """The registry split into what a plan may name (with its history) and what it may not,
    with why: preflight fails, it is the live recipe, or recipe memory refuses it."""
    home, policy, live = ctx.home, ctx.policy, ctx.live
    recipes = {
        f"{m.id}:{v.id}": resolve_recipe(
            m, v, home.models, home.hf_cache, runtimes=home.runtimes, builds=home.builds
        )
        for m in ctx.manifests.values()
        for v in m.variants
    }
    skip = memory.skips(home, recipes, policy, ctx.policy_hash)
    runnable, unavailable = [], []
    for manifest in ctx.manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            check = preflight(manifest, variant, policy, ctx.facts, require_artifacts=True)
            if not check.passed:
                unavailable.append(UnavailableBrief(id=cid, reasons=check.failures()[:3]))
                continue
            if recipes[cid].key() == live.key():
                unavailable.append(UnavailableBrief(id=cid, reasons=["it is the live recipe"]))
                continue
            if cid in skip:
                why = skip[cid] if "recipe memory" in skip[cid] else f"recipe memory: {skip[cid]}"
                unavailable.append(UnavailableBrief(id=cid, reasons=[whole(why, 320)]))
                continue
            cls = manifest.class_of(variant)
            runnable.append(
                CandidateBrief(
                    id=cid,
                    title=variant.title or manifest.title,
                    candidate_class=cls.value,
                    semantics=manifest.semantics_of(variant).value,
                    knobs=variant.knobs.model_dump(exclude_defaults=True),
                    auto_promote=bool(policy.auto_promote.get(cls, False)),
                    history=history.get(cid, [])[-4:],
                    last_verdict=last_verdict(history.get(cid, [])),
                )
            )
    return runnable, unavailable


def last_verdict(history: list[str]) -> str | None:
    """The newest history line's decision and speed ('rejected -4.1%'), without its cycle id
    and reason; None for a candidate no cycle judged."""
    if not history:
        return None
    return history[-1].split(": ", 1)[-1].split(" — ", 1)[0]


def _past_cycle(summary: CycleSummary, verdict: Verdict | None) -> PastCycle:
    return PastCycle(
        cycle_id=summary.cycle_id,
        outcome=summary.outcome.value,
        selected=summary.selected,
        speedup_pct=summary.speedup_pct,
        reason=whole(summary.reason, 300),
        interrupted=summary.interrupted,
        candidates=[
            f"{c.candidate}: {c.decision.value}"
            + (f" ({whole(c.reasons[0], 200)})" if c.reasons else "")
            for c in (verdict.candidates if verdict else [])
        ],
    )


def policy_bounds(policy: Policy) -> PolicyBounds:
    """The policy's ranges and rules a plan is held to, as a planner reads them."""
    window = policy.window
    bounds = policy.thresholds
    return PolicyBounds(
        name=policy.name,
        min_speedup_pct=ThresholdBounds(**bounds.min_speedup_pct.model_dump()),
        max_peak_memory_gb=ThresholdBounds(**bounds.max_peak_memory_gb.model_dump()),
        worst_prompt_tolerance_pct=bounds.worst_prompt_tolerance_pct,
        auto_promote={k.value: v for k, v in policy.auto_promote.items()},
        window=f"{window.start}-{window.end} {window.timezone}"
        if window.mode == "window"
        else window.mode,
        suite=policy.protocol.suite,
        repeats=policy.protocol.repeats,
        max_tokens=policy.protocol.max_tokens,
    )


def whole(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, cut between clauses where one ends late enough,
    else between words, never inside a word, with an ellipsis when cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: max(limit - 2, 0)]  # room for " …"
    for mark in (". ", "; "):
        cut = head.rfind(mark)
        if cut > limit // 2:
            return head[: cut + 1].rstrip(";") + " …"
    cut = len(head)
    while cut > 0 and text[cut - 1].isalnum() and text[cut].isalnum():
        cut -= 1
    return (text[:cut].rstrip(" ,;:") + " …").lstrip()


def plan_schema() -> dict[str, Any]:
    """The JSON schema of a plan, with no $defs (easy to embed and to read)."""
    schema = Plan.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].split("/")[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def _verdict(home: Home, cycle_id: str) -> Verdict | None:
    try:
        return read_optional(home.bundle_files(cycle_id).verdict, Verdict)
    except CorruptFile:
        return None


def _baseline_figures(
    home: Home, summaries: list[CycleSummary], live: str
) -> BaselineFigures | None:
    """Figures of the recipe that serves now, from the newest cycle that measured it, taken
    from that cycle's verdict (its cells and per-prompt table), as its evidence shows them."""
    for summary in summaries:
        promoted = summary.outcome == Outcome.PROMOTED and summary.selected
        measured_as = summary.selected if promoted else BASELINE_ID
        verdict = _verdict(home, summary.cycle_id)
        if verdict is None or not verdict.candidates:
            continue
        side = "candidate" if promoted else "baseline"
        source = (
            next((c for c in verdict.candidates if c.candidate == measured_as), None)
            if promoted
            else verdict.candidates[0]
        )
        if source is None or measured_as is None:
            continue
        try:
            run = read_optional(home.bundle_files(summary.cycle_id).run(measured_as), CandidateRun)
        except CorruptFile:
            run = None
        measured = [s for s in (run.samples if run else []) if s.phase == "measure"]
        good = [s for s in measured if not s.error]
        cells = [
            CellFigures(
                request_class=cell.request_class,
                concurrency=cell.concurrency,
                role=cell.role,
                decode_tps=_round(getattr(cell, f"{side}_decode_tps"), 2),
                output_tps=_round(getattr(cell, f"{side}_output_tps"), 2),
                ttft_p50_s=_round(getattr(cell, f"{side}_ttft_p50_s"), 3),
                ttft_p99_s=_round(getattr(cell, f"{side}_ttft_p99_s"), 3),
            )
            for cell in source.cells
        ]
        headline = next((c for c in source.cells if c.headline), None)
        plan = _frozen_protocol(home, summary.cycle_id)
        return BaselineFigures(
            cycle_id=summary.cycle_id,
            recipe=summary.active_recipe,
            is_live_recipe=summary.active_recipe == live,
            suite=plan[0] if plan else "?",
            max_tokens=plan[1] if plan else 0,
            decode_tps=_round(
                getattr(source, f"{side}_tps")
                or (getattr(headline, f"{side}_decode_tps") if headline else None),
                2,
            ),
            ttft_s_p50=_round(getattr(headline, f"{side}_ttft_p50_s") if headline else None, 3),
            cells=cells,
            per_prompt_decode_tps={
                stat.prompt_id: round(getattr(stat, f"{side}_tps"), 2)
                for stat in sorted(source.per_prompt, key=lambda x: x.prompt_id)
            },
            peak_memory_gb=round(run.peak_memory_gb, 3) if run and run.peak_memory_gb else None,
            samples=len(measured),
            errors=len(measured) - len(good),
        )
    return None


def _round(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


def _frozen_protocol(home: Home, cycle_id: str) -> tuple[str, int] | None:
    from mcp_infra.contracts import FrozenPlan

    try:
        plan = read_optional(home.bundle_files(cycle_id).plan, FrozenPlan)
    except CorruptFile:
        return None
    return (plan.protocol.suite, plan.protocol.max_tokens) if plan else None


def menu_of(context: PlanningContext) -> Menu:
    """The numbered menu of the runnable candidates, in catalog order."""
    return make_menu(
        [
            MenuItem(
                id=c.id,
                title=c.title,
                candidate_class=c.candidate_class,
                lossy=c.semantics == "lossy",
                last_verdict=c.last_verdict,
            )
            for c in context.runnable
        ]
    )


def served_model_size(home: Home) -> ModelSize | None:
    """The live recipe's model size from its ``config.json``; None when it cannot be read."""
    try:
        folder = HomeContext(home).live.model_path
        with open(f"{folder}/config.json", encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError, CorruptFile):
        return None
    return model_size(config) if isinstance(config, dict) else None


class Attempt(BaseModel):
    """One question to the model and what became of its answer."""

    model_config = ConfigDict(extra="forbid")

    reply_excerpt: str = ""
    problems: list[str] = Field(default_factory=list)


class LocalPlanResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: str
    submitted: bool = False
    accepted: bool = False
    dry_run: bool = False
    message: str
    reply_excerpt: str = ""
    extraction: Extraction | None = None
    proposal: dict[str, Any] | None = None
    form: PromptForm = "json"
    planner: Literal["model", "fallback", "none"] = Field(
        "none", description="who chose the submitted plan: the model, or the fallback rule"
    )
    attempts: list[Attempt] = Field(default_factory=list)
