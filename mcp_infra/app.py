"""The functions both faces call: the MCP server (for agents) and the CLI (for people).

Read functions only read files and answer fast, also during a cycle. ``propose`` validates,
sanitizes and freezes a plan, queues it, and makes sure a detached supervisor runs it; it never
touches the service itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra import evidence as evidence_mod
from mcp_infra.contracts import (
    AuditRecord,
    CycleSummary,
    FrozenPlan,
    Knobs,
    PlanChange,
    RefusedCandidate,
    SupervisorRecord,
    Verdict,
)
from mcp_infra.policy import PlanRefused, load_policy, parse_plan, policy_hash, sanitize
from mcp_infra.registry import (
    Check,
    host_facts,
    load_registry,
    preflight,
    registry_hash,
    resolve_recipe,
)
from mcp_infra.runtime import is_running, probe_completion
from mcp_infra.service import active_recipe, load_config, service_record
from mcp_infra.store import CorruptFile, Home, read_optional, sha256_bytes, utcnow


class View(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------


class ServiceView(View):
    endpoint: str
    healthy: bool
    active_recipe: str
    knobs: dict[str, Any]
    pid: int | None = None
    since: datetime | None = None


class CycleView(View):
    cycle_id: str
    state: str
    message: str
    candidate: str | None = None
    index: int | None = None
    total: int | None = None


class StatusView(View):
    configured: bool
    home: str
    service: ServiceView | None = None
    supervisor_pid: int | None = None
    supervisor_running: bool = False
    cycle: CycleView | None = None
    queue: list[str] = Field(default_factory=list)
    last_cycle: CycleSummary | None = None
    policy: str | None = None
    window: dict[str, Any] | None = None
    needs_operator: str | None = None
    problems: list[str] = Field(default_factory=list)


def status(home: Home) -> StatusView:
    problems: list[str] = []
    if not home.config.exists():
        return StatusView(configured=False, home=str(home.root),
                          problems=["no config.yaml: run `mcp-infra demo` or write one"])
    try:
        config = load_config(home)
        recipe = active_recipe(home)
    except CorruptFile as exc:
        return StatusView(configured=False, home=str(home.root), problems=[str(exc)])
    record = None
    try:
        record = service_record(home)
    except CorruptFile as exc:
        problems.append(str(exc))
    alive = record is not None and is_running(record)
    endpoint = f"http://{config.host}:{config.port}/v1"
    healthy = alive and probe_completion(f"http://{config.host}:{config.port}", timeout=5)
    service = ServiceView(endpoint=endpoint, healthy=healthy, active_recipe=recipe.candidate_id,
                          knobs=recipe.knobs.model_dump(exclude_defaults=True),
                          pid=record.pid if alive and record else None,
                          since=record.started_at if alive and record else None)
    sup = None
    try:
        sup = read_optional(home.state / "supervisor.json", SupervisorRecord)
    except CorruptFile as exc:
        problems.append(str(exc))
    sup_running = home.lock_is_held()
    cycle = None
    current = home.state / "current.json"
    if sup_running and current.exists():
        try:
            data = json.loads(current.read_text())
            cycle = CycleView(**{k: data.get(k) for k in CycleView.model_fields if k in data})
        except (ValueError, TypeError):
            problems.append("state/current.json is unreadable")
    needs = home.state / "needs_operator.json"
    cycles = evidence_mod.list_cycles(home)
    policy = load_policy(config.policy, extra=home.user_policy)
    return StatusView(
        configured=True, home=str(home.root), service=service,
        supervisor_pid=sup.pid if sup and sup_running else None, supervisor_running=sup_running,
        cycle=cycle, queue=[p.stem.split("-", 1)[1] for p in home.queued()],
        last_cycle=cycles[0] if cycles else None, policy=policy.name,
        window=policy.window.model_dump(),
        needs_operator=(json.loads(needs.read_text()).get("reason", "see state/needs_operator.json")
                        if needs.exists() else None),
        problems=problems)


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


class LearnedView(View):
    cycle_id: str
    decision: str
    reasons: list[str]
    speedup_estimate: float | None = None


class CandidateView(View):
    id: str
    title: str
    candidate_class: str
    semantics: str
    template: str
    knobs: dict[str, Any]
    preflight_passed: bool
    checks: list[Check]
    learned: list[LearnedView] = Field(default_factory=list)


class RegistryView(View):
    candidates: list[CandidateView]
    live_recipe: str | None = None


def _learned(home: Home) -> dict[str, list[LearnedView]]:
    out: dict[str, list[LearnedView]] = {}
    if not home.evidence.is_dir():
        return out
    for path in sorted(home.evidence.glob("*/verdict.json")):
        try:
            verdict = Verdict.model_validate_json(path.read_text())
        except ValueError:
            continue
        for item in verdict.candidates:
            out.setdefault(item.candidate, []).append(LearnedView(
                cycle_id=path.parent.name, decision=item.decision.value,
                reasons=item.reasons[:4], speedup_estimate=item.speedup_estimate))
    return out


def registry_view(home: Home, candidate_id: str | None = None) -> RegistryView:
    manifests = load_registry(extra=home.user_registry)
    policy = load_policy(load_config(home).policy if home.config.exists() else "default",
                         extra=home.user_policy)
    facts = host_facts(home.root, home.models, home.hf_cache)
    learned = _learned(home)
    views = []
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            if candidate_id and cid != candidate_id:
                continue
            check = preflight(manifest, variant, policy, facts)
            views.append(CandidateView(
                id=cid, title=variant.title or manifest.title,
                candidate_class=manifest.class_of(variant).value,
                semantics=manifest.semantics_of(variant).value,
                template=manifest.runtime.template,
                knobs=variant.knobs.model_dump(exclude_defaults=True),
                preflight_passed=check.passed, checks=check.checks,
                learned=learned.get(cid, [])[-5:]))
    live = active_recipe(home).candidate_id if home.config.exists() else None
    return RegistryView(candidates=views, live_recipe=live)


# ---------------------------------------------------------------------------------------------
# propose
# ---------------------------------------------------------------------------------------------


class ProposalView(View):
    accepted: bool
    dry_run: bool
    plan_id: str | None = None
    message: str
    problems: list[str] = Field(default_factory=list)
    candidates: list[str] = Field(default_factory=list)
    thresholds: dict[str, float] | None = None
    changes: list[PlanChange] = Field(default_factory=list)
    refused: list[RefusedCandidate] = Field(default_factory=list)
    queue_position: int | None = None
    follow: str | None = None


def propose(home: Home, raw: Any, *, proposed_by: str = "unknown", dry_run: bool = False,
            start_supervisor: bool = True) -> ProposalView:
    """Validate, sanitize, freeze and queue a plan. Refusals are answers, not exceptions."""
    home.ensure()
    raw_hash = sha256_bytes(json.dumps(raw, sort_keys=True, default=str).encode()
                            if not isinstance(raw, str) else raw.encode())
    try:
        plan = parse_plan(raw)
        frozen = _freeze(home, plan, proposed_by)
    except PlanRefused as exc:
        view = ProposalView(accepted=False, dry_run=dry_run, message=str(exc),
                            problems=exc.problems)
        home.append_audit(AuditRecord(ts=utcnow(), client=proposed_by[:200], plan_hash=raw_hash,
                                      accepted=False, detail=str(exc)[:300]))
        return view
    view = ProposalView(accepted=True, dry_run=dry_run, plan_id=frozen.plan_id,
                        message="dry run: the plan would be queued as shown" if dry_run else
                        "plan frozen and queued; a supervisor runs it",
                        candidates=frozen.candidates,
                        thresholds=frozen.thresholds.model_dump(), changes=frozen.changes,
                        refused=frozen.refused)
    if dry_run:
        return view
    home.enqueue(frozen)
    home.append_audit(AuditRecord(ts=utcnow(), client=proposed_by[:200],
                                  plan_hash=frozen.content_hash, accepted=True,
                                  plan_id=frozen.plan_id))
    queue = [p.stem.split("-", 1)[1] for p in home.queued()]
    view.queue_position = queue.index(frozen.plan_id) + 1 if frozen.plan_id in queue else None
    view.follow = ("call `status` for progress and `evidence` once the cycle is sealed "
                   "(CLI: mcp-infra status / mcp-infra evidence)")
    if start_supervisor:
        ensure_supervisor(home)
    return view


def _freeze(home: Home, plan: Any, proposed_by: str) -> FrozenPlan:
    if not home.config.exists():
        raise PlanRefused("plan refused: no managed service is configured (config.yaml missing)")
    config = load_config(home)
    policy = load_policy(config.policy, extra=home.user_policy)
    manifests = load_registry(extra=home.user_registry)
    facts = host_facts(home.root, home.models, home.hf_cache)
    checks, recipes = {}, {}
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            checks[cid] = preflight(manifest, variant, policy, facts)
            recipes[cid] = resolve_recipe(manifest, variant, home.models, home.hf_cache)
    live_peak = _last_baseline_peak(home)
    return sanitize(plan, manifests=manifests, policy=policy, preflights=checks,
                    live_recipe=active_recipe(home), live_peak_memory_gb=live_peak,
                    registry_hash=registry_hash(manifests), policy_hash=policy_hash(policy),
                    proposed_by=proposed_by, now=utcnow(), candidate_recipes=recipes)


def _last_baseline_peak(home: Home) -> float | None:
    for summary in evidence_mod.list_cycles(home):
        path = home.evidence / summary.cycle_id / "runs" / "baseline.json"
        if path.exists():
            try:
                return json.loads(path.read_text()).get("peak_memory_gb")
            except ValueError:
                return None
    return None


def ensure_supervisor(home: Home) -> int | None:
    """Start a detached supervisor unless one holds the lock; return its pid."""
    if home.lock_is_held():
        return None
    log = home.logs / "supervisor.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        proc = subprocess.Popen(  # argv list, no shell; its own session outlives the caller
            [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "supervise"],
            stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc.pid


# ---------------------------------------------------------------------------------------------
# evidence
# ---------------------------------------------------------------------------------------------

Section = Literal["summary", "table", "gates", "verdict", "journal", "plan"]


class EvidenceView(View):
    cycles: list[CycleSummary] | None = None
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


PAGE_SIZE = 40


def evidence_view(home: Home, cycle_id: str | None = None, section: Section | None = None,
                  page: int = 1, limit: int = 20) -> EvidenceView:
    if not cycle_id:
        cycles = evidence_mod.list_cycles(home)
        return EvidenceView(cycles=cycles[:max(1, min(limit, 100))])
    bundle = evidence_mod.bundle_path(home, cycle_id)
    summary = evidence_mod.read_model(bundle / "summary.json", CycleSummary)
    view = EvidenceView(cycle_id=summary.cycle_id, section=section or "summary", summary=summary,
                        path=str(bundle))
    verdict = read_optional(bundle / "verdict.json", Verdict)
    if section in (None, "summary", "table"):
        view.table = per_prompt_table(verdict)
    if section in (None, "summary", "verdict"):
        view.verdict = verdict
    if section == "gates" and verdict:
        view.gates = [{"candidate": c.candidate, **g.model_dump(mode="json")}
                      for c in verdict.candidates for g in c.gates]
    if section == "plan":
        view.plan = read_optional(bundle / "plan.json", FrozenPlan)
    if section == "journal":
        rows = evidence_mod.journal_of(bundle)
        view.pages = max(1, -(-len(rows) // PAGE_SIZE))
        view.page = min(max(1, page), view.pages)
        view.journal = rows[(view.page - 1) * PAGE_SIZE: view.page * PAGE_SIZE]
    return view


def per_prompt_table(verdict: Verdict | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if verdict is None:
        return rows
    for item in verdict.candidates:
        for stat in item.per_prompt:
            rows.append({"candidate": item.candidate, "prompt": stat.prompt_id,
                         "baseline_tps": round(stat.baseline_tps, 2),
                         "candidate_tps": round(stat.candidate_tps, 2),
                         "speedup": round(stat.speedup, 3), "decision": item.decision.value})
    return rows


def knobs_text(knobs: Knobs | dict[str, Any]) -> str:
    data = knobs.model_dump(exclude_defaults=True) if isinstance(knobs, Knobs) else knobs
    return ", ".join(f"{k}={v}" for k, v in data.items()) or "defaults"


def bundle_for(home: Home, ref: str) -> Path:
    return evidence_mod.bundle_path(home, ref)
