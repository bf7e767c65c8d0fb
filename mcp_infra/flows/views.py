"""The read views of the registry and the evidence, as both faces show them.

Each view only reads files (the home's context, recipe memory, sealed bundles) and answers
fast, also during a cycle. One cycle's evidence view is a function of its bundle's files and is
kept while their stamps are unchanged; a bundle that does not verify shows no figures.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import (
    CANDIDATE_ID_PATTERN,
    CandidateRun,
    CatalogNote,
    CheckResult,
    CycleCost,
    CycleSummary,
    FrozenPlan,
    Knobs,
    Manifest,
    PlanCost,
    Recipe,
    ServiceImpact,
    Variant,
    Verdict,
)
from mcp_infra.core.preflight import (
    Check,
    HostFacts,
    env_hash,
    env_label,
    preflight,
)
from mcp_infra.core.sanitize import nearest_text
from mcp_infra.state import evidence as evidence_mod
from mcp_infra.state import memory, runtimes
from mcp_infra.state.artifacts import (
    resolve_recipe,
)
from mcp_infra.state.context import HomeContext
from mcp_infra.state.hostfacts import installed_version
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_journal_file,
    read_model,
    read_optional,
)


class View(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


class LearnedView(View):
    cycle_id: str
    decision: str
    reasons: list[str]
    speedup_estimate: float | None = None
    failed_gates: list[str] = Field(default_factory=list)
    selected: bool = False
    current: bool = Field(
        False,
        description="judged under the manifest, policy and environment "
        "of now (else something changed since)",
    )


class RuntimeView(View):
    """A runtime candidate's environment: what the control plane has installed, what would be
    built (or is), and its size."""

    env_hash: str
    label: str
    site: str
    installed: dict[str, str] = Field(
        description="the control plane's own version of each pinned package ('-': not installed)"
    )
    pinned: dict[str, str] = Field(description="what the environment is built with")
    built: bool
    path: str
    size_bytes: int | None = Field(
        None, description="on disk once built; before, the download the manifest states"
    )
    size_basis: str = Field(description="'on disk' or 'download (stated)' or 'unknown'")
    problems: list[str] = Field(default_factory=list)


def runtime_view(
    home: Home, manifest: Manifest, variant: Variant, facts: HostFacts
) -> RuntimeView | None:
    spec = manifest.environment_of(variant)
    if spec is None:
        return None
    digest = env_hash(spec, facts.python, facts.platform, facts.shared_site)
    built = facts.runtimes.get(digest)
    stated = runtimes.download_bytes(spec)
    size, basis = (
        (built.size_bytes, "on disk")
        if built
        else (stated, "download (stated)")
        if all(p.size_bytes is not None for p in spec.packages)
        else (None, "unknown")
    )
    return RuntimeView(
        env_hash=digest,
        label=env_label(spec),
        site=spec.site,
        installed={p.name: installed_version(p.name) or "-" for p in spec.packages},
        pinned={p.name: p.version for p in spec.packages},
        built=built is not None,
        path=str(runtimes.folder(home.runtimes, digest)),
        size_bytes=size,
        size_basis=basis,
        problems=built.problems[:5] if built else [],
    )


class CandidateView(View):
    id: str
    title: str
    candidate_class: str
    semantics: str
    template: str
    knobs: dict[str, Any]
    preflight_passed: bool
    checks: list[Check]
    auto_promote: bool = Field(
        True,
        description="whether the policy lets a qualified candidate "
        "of this class be promoted without a person",
    )
    learned: list[LearnedView] = Field(default_factory=list)
    runtime: RuntimeView | None = Field(
        None, description="its own runtime environment, if it names one (runtime upgrades)"
    )
    skip: str | None = Field(None, description="why recipe memory would refuse it in a plan now")
    memory_mode: str | None = Field(
        None,
        description="concurrent (beside the live backend) or "
        "exclusive (the live backend stops while it runs)",
    )
    memory_mode_reason: str | None = None
    expected_downtime_s: float | None = Field(
        None, description="seconds the stable endpoint would not serve if a plan measured it alone"
    )
    cost: PlanCost | None = Field(
        None,
        description="a plan of this candidate alone, projected on this machine: minutes, "
        "rounds, unserved seconds (or unknown, with why)",
    )


class RegistryView(View):
    candidates: list[CandidateView]
    live_recipe: str | None = None
    not_offered: list[CatalogNote] = Field(
        default_factory=list,
        description="what the catalog generated for the configured model leaves out, and why",
    )
    problems: list[str] = Field(
        default_factory=list,
        description="manifest files that do not load (the other candidates are still listed)",
    )


class RegistryFilter(View):
    """Which candidates a registry answer shows (None: any)."""

    candidate_class: str | None = Field(None, description="only this class")
    preflight: Literal["passed", "failed"] | None = Field(None, description="only these")
    verdict: Literal["untried", "qualified", "rejected", "inconclusive"] | None = Field(
        None, description="only candidates whose last verdict in this home is this"
    )

    def keeps(self, klass: str, passed: bool, last: str) -> bool:
        return (
            self.candidate_class in (None, klass)
            and self.preflight in (None, "passed" if passed else "failed")
            and self.verdict in (None, last)
        )


def _learned(home: Home, recipes: dict[str, Recipe], p_hash: str) -> dict[str, list[LearnedView]]:
    """What recipe memory holds per candidate, marking outcomes judged under today's
    conditions (same manifest hash, policy hash and environment key)."""
    out: dict[str, list[LearnedView]] = {}
    env = memory.environment()
    keys: dict[str, str] = {}
    identities: dict[str, str] = {}
    for item in memory.outcomes(home):
        recipe = recipes.get(item.candidate)
        if recipe is not None and item.candidate not in keys:
            keys[item.candidate] = memory.environment_key(env, recipe, identities)
        current = (
            recipe is not None
            and item.manifest_hash == recipe.manifest_hash
            and item.policy_hash == p_hash
            and item.environment_key == keys[item.candidate]
        )
        out.setdefault(item.candidate, []).append(
            LearnedView(
                cycle_id=item.cycle_id,
                decision=item.decision.value,
                reasons=item.reasons[:4],
                speedup_estimate=item.speedup_estimate,
                selected=item.selected,
                current=current,
                failed_gates=[f"{g.gate}: {g.detail[:160]}" for g in item.gates if not g.passed],
            )
        )
    return out


def registry_view(
    home: Home,
    candidate_id: str | None = None,
    *,
    wait_costs: bool = True,
    only: RegistryFilter | None = None,
) -> RegistryView:
    """Every candidate with its checks, memory and cost, what may be proposed first (passing
    preflight, then untried, the registry's order kept within each); ``only`` keeps
    those of a class, preflight result or last verdict. ``wait_costs=False`` (the MCP read):
    a cost not yet in the home's projection cache is computed in the background (``pending``)."""
    only = only or RegistryFilter()
    ctx = HomeContext(home)
    manifests, policy, facts = ctx.manifests, ctx.policy, ctx.facts
    recipes = {
        f"{m.id}:{v.id}": resolve_recipe(
            m, v, home.models, home.hf_cache, runtimes=home.runtimes, builds=home.builds
        )
        for m in manifests.values()
        for v in m.variants
        if not candidate_id or f"{m.id}:{v.id}" == candidate_id
    }
    p_hash = ctx.policy_hash
    learned = _learned(home, recipes, p_hash)
    skips = memory.skips(home, recipes, policy, p_hash)
    from mcp_infra.flows.impact import preview

    kept = live_answers_kept(ctx)
    views = []
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            if candidate_id and cid != candidate_id:
                continue
            check = preflight(manifest, variant, policy, facts, require_artifacts=True)
            last = learned[cid][-1].decision if learned.get(cid) else "untried"
            if not only.keeps(manifest.class_of(variant).value, check.passed, last):
                continue
            mode = preview(home, policy, [cid], manifests)
            cost = (
                candidate_cost(
                    ctx, cid, recipes[cid], mode.memory_mode if mode else None, wait_costs, kept
                )
                if check.passed
                else PlanCost(basis="unknown", why="it does not pass preflight on this machine")
            )
            views.append(
                CandidateView(
                    cost=cost,
                    skip=skips.get(cid),
                    memory_mode=mode.memory_mode if mode else None,
                    memory_mode_reason=mode.memory_mode_reason if mode else None,
                    expected_downtime_s=mode.expected_downtime_s if mode else None,
                    id=cid,
                    title=variant.title or manifest.title,
                    candidate_class=manifest.class_of(variant).value,
                    semantics=manifest.semantics_of(variant).value,
                    template=manifest.runtime.template,
                    knobs=variant.knobs.model_dump(exclude_defaults=True),
                    preflight_passed=check.passed,
                    checks=check.checks,
                    auto_promote=bool(policy.auto_promote.get(manifest.class_of(variant), False)),
                    learned=learned.get(cid, [])[-5:],
                    runtime=runtime_view(home, manifest, variant, facts),
                )
            )
    live = ctx.live.candidate_id if ctx.configured else None
    # A page holds what may be proposed: another model's pinned entries fail preflight and last.
    views.sort(key=lambda v: (not v.preflight_passed, bool(v.learned)))
    return RegistryView(
        candidates=views,
        live_recipe=live,
        not_offered=ctx.catalog.notes if ctx.catalog else [],
        problems=ctx.registry_problems,
    )


def unknown_candidate(home: Home, candidate_id: str) -> str:
    """One line: the id is not a candidate, the nearest ids, how to list them (the id is shown
    only if it is well-formed)."""
    ids = [f"{m.id}:{v.id}" for m in HomeContext(home).manifests.values() for v in m.variants]
    shown = candidate_id if re.fullmatch(CANDIDATE_ID_PATTERN, candidate_id) else "that id"
    return (
        f"{shown} is not a candidate of the registry{nearest_text(candidate_id, ids)}; "
        "list them with `registry` (no arguments)"
    )


def live_answers_kept(ctx: HomeContext) -> bool:
    """Whether the live configuration's greedy pass is kept (``flows.answers.kept_for``), asked
    once per registry answer: every candidate's plan has this home's protocol and live service."""
    from mcp_infra.flows import answers

    try:
        return answers.kept_for(ctx.home, ctx.live, ctx.policy.protocol)
    except FileNotFoundError:
        return False


def candidate_cost(
    ctx: HomeContext, candidate: str, recipe: Recipe, mode: str | None, wait: bool, kept: bool
) -> PlanCost:
    """A plan of this candidate alone under the home's policy, projected on this machine
    (``kept``: the live configuration's greedy pass is kept, ``live_answers_kept``)."""
    from mcp_infra.flows import projection
    from mcp_infra.flows.projection import LiveRecipe

    plan = projection.simulated_plan(ctx.policy, [candidate])
    try:
        live = ctx.live.candidate_id
    except FileNotFoundError:
        return PlanCost(basis="unknown", why="no managed service is configured (config.yaml)")
    kind: Literal["concurrent", "exclusive"] = "exclusive" if mode == "exclusive" else "concurrent"
    return projection.plan_cost(
        ctx.home, plan, ctx.policy, LiveRecipe(live, kept), kind, {candidate: recipe}, wait=wait
    )


# ---------------------------------------------------------------------------------------------
# evidence
# ---------------------------------------------------------------------------------------------

Section = Literal["summary", "table", "gates", "verdict", "journal", "plan"]


class EvidenceView(View):
    cycles: list[CycleSummary] | None = Field(
        None,
        description="sealed cycles, newest first; one whose bundle does not verify is listed "
        "with its figures withheld and named in not_verified",
    )
    not_verified: dict[str, str] | None = Field(
        None, description="cycle id → why its bundle does not verify (figures withheld)"
    )
    verify_command: str | None = Field(
        None, description="the command that checks a bundle for good (CYCLE: an id or latest)"
    )
    heldout: str | None = Field(
        None, description="the held-out confirmation of the selected candidate, or why none ran"
    )
    online_check: str | None = Field(
        None, description="the online check of the winner before the switch, or why none ran"
    )
    answers_kept: str | None = Field(
        None,
        description="answers the baseline took from earlier cycles of the same configuration "
        "instead of asking them again (None: every answer was asked in this cycle)",
    )
    cycle_id: str | None = None
    section: str | None = None
    summary: CycleSummary | None = None
    table: list[dict[str, Any]] | None = None
    gates: list[dict[str, Any]] | None = None
    verdict: Verdict | None = None
    plan: FrozenPlan | None = None
    journal: list[dict[str, Any]] | None = None
    page: int = 1
    pages: int = 1
    path: str | None = None
    cost: CycleCost | None = None
    verified: bool | None = Field(None, description="every check of `evidence verify` passed")
    failed_checks: list[str] | None = Field(None, description="names of the failed checks")
    checks: list[CheckResult] | None = None
    report_path: str | None = Field(None, description="the HTML report written for this cycle")
    report_uri: str | None = Field(None, description="MCP resource URI of the HTML report")
    service_impact: ServiceImpact | None = Field(
        None, description="what the stable endpoint's clients saw during the cycle"
    )


PAGE_SIZE = 40


_views: dict[tuple[str, str | None, int], tuple[Any, EvidenceView]] = {}
_views_lock = threading.Lock()


def evidence_view(
    home: Home,
    cycle_id: str | None = None,
    section: Section | None = None,
    page: int = 1,
    limit: int = 20,
) -> EvidenceView:
    """The cycle list, or one cycle's section. One cycle's view is a function of its bundle's
    files (and the home's keys): it is kept while their stamps are unchanged."""
    if not cycle_id:
        return _cycle_list(home, page, limit)
    bundle = evidence_mod.bundle_path(home, cycle_id)
    owner = home if bundle.resolve().parent == home.evidence.resolve() else None
    stamp = evidence_mod.bundle_stamp(bundle, owner)
    key = (str(bundle), section, page)
    with _views_lock:
        hit = _views.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1].model_copy()  # callers copy with updates; none changes a view
    view = _cycle_view(home, bundle, owner, section, page)
    with _views_lock:
        _views[key] = (stamp, view)
    return view.model_copy()


def _cycle_list(home: Home, page: int, limit: int) -> EvidenceView:
    cycles = evidence_mod.list_cycles(home)
    size = max(1, min(limit, 100))
    pages = max(1, -(-len(cycles) // size))
    page = min(max(1, page), pages)
    shown, flagged = [], {}
    for summary in cycles[(page - 1) * size : page * size]:
        checked, problem = checked_summary(home, summary)
        shown.append(checked)
        if problem:
            flagged[summary.cycle_id] = problem
    return EvidenceView(
        cycles=shown,
        not_verified=flagged,
        page=page,
        pages=pages,
        verify_command=evidence_mod.verify_command(home, "CYCLE") if cycles else None,
    )


def _cycle_view(
    home: Home, bundle: Path, owner: Home | None, section: Section | None, page: int
) -> EvidenceView:
    summary = read_model(CycleFiles(bundle).summary, CycleSummary)
    view = EvidenceView(
        cycle_id=summary.cycle_id,
        section=section or "summary",
        summary=summary,
        path=str(bundle),
        verify_command=evidence_mod.verify_command(
            owner, summary.cycle_id if owner else str(bundle), bundle
        ),
    )
    verdict = read_optional(CycleFiles(bundle).verdict, Verdict)
    if section in (None, "summary", "table"):
        view.table = per_prompt_table(verdict)
    if section in (None, "summary", "verdict"):
        view.verdict = verdict
    if section in (None, "summary"):
        view.heldout, view.online_check = confirmations(bundle)
        view.answers_kept = answers_kept(bundle)
        result = evidence_mod.verify_cached(bundle, owner)
        view.verified, view.failed_checks, view.checks = result.ok, result.failed, result.checks
        view.cost = read_optional(bundle / "cost.json", CycleCost)
        try:
            view.service_impact = read_optional(bundle / "service_impact.json", ServiceImpact)
        except CorruptFile:
            view.service_impact = None
    if section == "gates" and verdict:
        view.gates = [
            {"candidate": c.candidate, **g.model_dump(mode="json")}
            for c in verdict.candidates
            for g in c.gates
        ]
    if section == "plan":
        view.plan = read_optional(CycleFiles(bundle).plan, FrozenPlan)
    if section == "journal":
        rows = evidence_mod.journal_of(bundle)
        view.pages = max(1, -(-len(rows) // PAGE_SIZE))
        view.page = min(max(1, page), view.pages)
        view.journal = [
            _clip_row(r) for r in rows[(view.page - 1) * PAGE_SIZE : view.page * PAGE_SIZE]
        ]
    return view


def answers_kept(bundle: Path) -> str | None:
    """What the bundle's runs took from earlier cycles, in words (None: nothing)."""
    said = []
    for path in sorted(CycleFiles(bundle).runs.glob("*.json")):
        with contextlib.suppress(CorruptFile, ValueError):
            ref = read_model(path, CandidateRun).reference
            if ref is not None:
                parts = [f"{ref.greedy} greedy output(s)"] * bool(ref.greedy)
                parts += [f"{ref.quality} quality answer(s)"] * bool(ref.quality)
                said.append(f"{path.stem}: {' and '.join(parts)} from {', '.join(ref.cycles)}")
    if not said:
        return None
    return (
        "the baseline's, kept from earlier cycles of the same configuration (its model files, "
        "runtime, machine and knobs): " + "; ".join(said)
    )


def confirmations(bundle: Path) -> tuple[str, str]:
    """The held-out confirmation and the online check, as the bundle's journal records them,
    or why each did not run: both are part of every summary (read from the journal, not from
    summary.json, which a surface shows only once it verifies)."""
    events = read_journal_file(CycleFiles(bundle).journal)[0]
    held = [e for e in events if e.fields.get("step") in ("heldout-passed", "heldout-failed")]
    online = [
        e
        for e in events
        if e.state.value == "VERIFY" and e.fields.get("step") in ("passed", "failed")
    ]
    if held:
        last = held[-1]
        passed = last.fields.get("step") == "heldout-passed"
        heldout = f"{'passed' if passed else 'FAILED'}: {last.message}"
    else:
        heldout = "not run: no candidate was selected on the selection prompts"
    if online:
        last = online[-1]
        check = f"{'passed' if last.fields.get('step') == 'passed' else 'FAILED'}: {last.message}"
    elif held and held[-1].fields.get("step") == "heldout-failed":
        check = "not run: the held-out confirmation failed, so nothing was promoted"
    elif any(e.state.value == "PROMOTE" for e in events):
        check = "not recorded in this bundle's journal"
    else:
        check = "not run: nothing was promoted"
    return heldout, check


MAX_ROW_FIELDS = 800


def _clip_row(row: dict[str, Any]) -> dict[str, Any]:
    """Keep a journal row small: large fields (resolved recipes) are named, not repeated."""
    fields = row.get("fields")
    if isinstance(fields, dict):
        size = len(json.dumps(fields, default=str))
        if size > MAX_ROW_FIELDS:
            small = {k: v for k, v in fields.items() if len(json.dumps(v, default=str)) <= 120}
            small["omitted"] = (
                f"{sorted(set(fields) - set(small))} ({size} bytes): "
                "see journal.ndjson in the bundle"
            )
            return {**row, "fields": small}
    return row


def per_prompt_table(verdict: Verdict | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if verdict is None:
        return rows
    for item in verdict.candidates:
        for stat in item.per_prompt:
            rows.append(
                {
                    "candidate": item.candidate,
                    "prompt": stat.prompt_id,
                    "baseline_tps": round(stat.baseline_tps, 2),
                    "candidate_tps": round(stat.candidate_tps, 2),
                    "speedup": round(stat.speedup, 3),
                    "decision": item.decision.value,
                }
            )
    return rows


def knobs_text(knobs: Knobs | dict[str, Any]) -> str:
    data = knobs.model_dump(exclude_defaults=True) if isinstance(knobs, Knobs) else knobs
    return ", ".join(f"{k}={v}" for k, v in data.items()) or "defaults"


WITHHELD = "figures withheld: the bundle does not verify"


def checked_summary(home: Home, summary: CycleSummary) -> tuple[CycleSummary, str | None]:
    """A sealed cycle's summary as a surface may show it: unchanged if its bundle verifies
    (``evidence.integrity``), else with its figures withheld, and the first failure."""
    try:
        bundle = evidence_mod.bundle_path(home, summary.cycle_id)
    except FileNotFoundError:
        return _withheld(summary), "the bundle is missing"
    result = evidence_mod.integrity(bundle, home)
    if result.ok:
        return summary, None
    return _withheld(summary), "; ".join(result.problems)[:300] or "does not verify"


def _withheld(summary: CycleSummary) -> CycleSummary:
    return summary.model_copy(update={"selected": None, "speedup_pct": None, "reason": WITHHELD})
