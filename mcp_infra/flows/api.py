"""The functions both faces call: the MCP server (for agents) and the CLI (for people).

Read functions only read files and answer fast, also during a cycle. ``propose`` validates,
sanitizes and freezes a plan, queues it, and makes sure a detached supervisor runs it; it never
touches the service itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    AuditRecord,
    CheckResult,
    CurrentCycle,
    CycleCost,
    CycleSummary,
    FrozenPlan,
    Knobs,
    Manifest,
    NeedsOperatorRecord,
    PlanChange,
    PlanCost,
    Recipe,
    RefusedCandidate,
    ServiceConfig,
    ServiceImpact,
    SupervisorRecord,
    Variant,
    Verdict,
)
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.core.machine import busy_fraction, waiting_text
from mcp_infra.core.preflight import (
    Check,
    HostFacts,
    env_hash,
    env_label,
    manifest_hash,
    preflight,
)
from mcp_infra.core.progress import Progress, left_text, progress
from mcp_infra.core.sanitize import PlanRefused, nearest_text, parse_plan, sanitize
from mcp_infra.procs.front import (
    ask_front,
    front_record,
    front_status,
    read_route,
    status_age_s,
)
from mcp_infra.procs.identity import is_alive
from mcp_infra.procs.runtime import is_running, port_owner_is
from mcp_infra.state import artifacts as hub
from mcp_infra.state import evidence as evidence_mod
from mcp_infra.state import memory, runtimes
from mcp_infra.state.artifacts import (
    PREPARE_IGNORES,
    HubError,
    PrepareResult,
    artifact_path,
    candidate_artifacts,
    resolve_recipe,
)
from mcp_infra.state.context import HomeContext, service_record
from mcp_infra.state.hostfacts import installed_version
from mcp_infra.state.signing import home_fingerprint
from mcp_infra.state.spread import learned_spread
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    M,
    open_append,
    read_journal_file,
    read_model,
    read_optional,
    utcnow,
    write_model,
)


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
    runtime: str | None = Field(
        None, description="the live recipe's own runtime environment; None: the control plane's"
    )
    pid: int | None = None
    since: datetime | None = None
    health_check: str = Field("", description="how `healthy` was decided")
    front_pid: int | None = None
    front_status_age_s: float | None = Field(
        None, description="seconds since the front's status last changed"
    )
    backend_url: str | None = None
    backend_healthy: bool | None = None
    backend_health_age_s: float | None = Field(
        None,
        description="seconds since the front's probe of the live backend (GET /health, every "
        "2 s) last saw its health change",
    )
    healing: str | None = Field(
        None, description="what the front did about a live backend that died, if it ever did"
    )
    route_mode: str | None = Field(None, description="serve, or hold while backends swap")
    requests_in_flight: int | None = None
    requests_held_now: int | None = None


class CycleView(View):
    cycle_id: str
    state: str
    message: str
    candidate: str | None = Field(None, description="the candidate being measured now")
    index: int | None = Field(None, description="its place among this round's server starts")
    total: int | None = Field(None, description="how many server starts this round has")
    plan_id: str | None = Field(None, description="the plan this cycle runs (not in `queue`)")
    measuring: Progress | None = Field(
        None,
        description="while servers are measured: phase, round of min..max rounds, start in the "
        "round, and a low and a high bound on the time the measuring has left",
    )
    started_at: datetime | None = None
    elapsed_s: float | None = None
    step: int | None = Field(
        None,
        description="position of the state in the nominal sequence "
        "QUEUED→PREFLIGHT→…→COMMIT→SEALED",
    )
    steps: int | None = None
    progress: str | None = Field(None, description="state, candidate i of n, step k of N")
    expected_downtime_s: float | None = Field(
        None,
        description="seconds the stable endpoint is expected not to serve in this cycle "
        "(0 in concurrent mode; exclusive mode: the experiments and reloads)",
    )
    downtime_note: str | None = None
    projected: PlanCost | None = Field(
        None, description="what the plan was projected to cost when it was proposed"
    )
    projection: str | None = Field(
        None, description="the projection against the elapsed time, in words"
    )


class StatusView(View):
    configured: bool
    home: str
    service: ServiceView | None = None
    supervisor_pid: int | None = None
    supervisor_running: bool = False
    cycle: CycleView | None = None
    queue: list[str] = Field(default_factory=list)
    last_cycle: CycleSummary | None = Field(
        None,
        description="the newest sealed cycle; its figures (selected, speedup, reason) only if "
        "its bundle verifies (last_cycle_verified)",
    )
    last_cycle_verified: bool | None = Field(
        None,
        description="the newest bundle's files match its signed manifest (sha256 and the home "
        "key's signature); false: its figures are withheld",
    )
    last_cycle_problem: str | None = Field(None, description="why it does not verify")
    verify_command: str | None = Field(
        None, description="the command that checks the newest bundle for good, with the key"
    )
    policy: str | None = None
    window: dict[str, Any] | None = None
    window_now: str | None = Field(
        None, description="whether a cycle may start now under the window, and if not, when"
    )
    server_mode: str | None = Field(
        None,
        description="the MCP server's mode (read-only, propose "
        "or autonomous); empty when asked from the command line",
    )
    needs_operator: str | None = None
    evidence_key: str | None = Field(
        None,
        description="sha256 fingerprint of the home's Ed25519 "
        "evidence key (created at the first seal)",
    )
    problems: list[str] = Field(default_factory=list)


def status(home: Home) -> StatusView:
    problems: list[str] = []
    if not home.config.exists():
        return StatusView(
            configured=False,
            home=str(home.root),
            problems=["no config.yaml: run `mcp-infra demo` or write one"],
        )
    ctx = HomeContext(home)
    try:
        config, recipe = ctx.config, ctx.live
    except CorruptFile as exc:
        return StatusView(configured=False, home=str(home.root), problems=[str(exc)])
    record = None
    try:
        record = service_record(home)
    except CorruptFile as exc:
        problems.append(str(exc))
    alive = record is not None and is_running(record)
    endpoint = f"http://{config.host}:{config.port}/v1"
    # Never a backend request on a status call: the front probes its backend every few seconds
    # (no completion) and says what it saw; status asks the front, with the probe's age.
    front = None
    try:
        front = front_record(home)
    except CorruptFile as exc:
        problems.append(str(exc))
    front_alive = front is not None and is_running(front) and port_owner_is(front, config.port)
    # The front's word of this instant (its own GET /health, no backend request): a front
    # whose process lives but does not answer is not a healthy service, whatever its last
    # written status file says.
    answered = ask_front(home, timeout=1.0) if front_alive else None
    fstat = answered or (front_status(home) if front_alive else None)
    probed = fstat.backend if fstat else None
    probe_age = (
        round((utcnow() - probed.checked_at).total_seconds(), 1)
        if probed and probed.checked_at
        else None
    )
    route = None
    with contextlib.suppress(CorruptFile):
        route = read_route(home)
    adopted = fstat is not None and route is not None and fstat.generation == route.generation
    healthy = bool(
        front_alive
        and answered
        and alive
        and fstat
        and adopted
        and fstat.mode == "serve"
        and probed
        and probed.healthy
    )
    how = (
        "front on the stable port, live backend "
        + (
            f"healthy ({probed.detail.split(':')[0]}, probed every 2 s; no change for "
            f"{probe_age:.0f} s)"
            if probed and probed.healthy and probe_age is not None
            else "not seen healthy yet"
            if alive
            else "not running"
        )
        if front_alive
        else "no front on the stable port"
    )
    if front_alive and answered is None:
        how += "; the front did not answer its own GET /health within 1 s"
    if fstat and fstat.mode == "hold":
        how += "; the front is holding requests while backends swap"
    if fstat and route and not adopted:
        how += (
            f"; the front has not confirmed route {route.generation} (it serves {fstat.generation})"
        )
    healing = fstat.healing if fstat else None
    for name, task in (fstat.tasks if fstat else {}).items():
        if task.failures:
            problems.append(
                f"front task {name} failed {task.failures} time(s) and was restarted "
                f"(last: {task.last_error})"
            )
    service = ServiceView(
        endpoint=endpoint,
        healthy=healthy,
        active_recipe=recipe.candidate_id,
        knobs=recipe.knobs.model_dump(exclude_defaults=True),
        runtime=(
            f"{recipe.runtime.label} in runtimes/{recipe.runtime.env_hash[:12]}"
            if recipe.runtime
            else None
        ),
        pid=record.pid if alive and record else None,
        since=record.started_at if alive and record else None,
        health_check=how,
        front_pid=front.pid if front_alive and front else None,
        front_status_age_s=status_age_s(fstat),
        backend_url=fstat.backend_url if fstat else None,
        backend_healthy=probed.healthy if probed else None,
        backend_health_age_s=probe_age,
        route_mode=fstat.mode if fstat else None,
        requests_in_flight=fstat.in_flight if fstat else None,
        requests_held_now=fstat.held_now if fstat else None,
        healing=healing.note if healing and (healing.deaths or healing.state != "ok") else None,
    )
    sup = None
    try:
        sup = read_optional(home.supervisor_file, SupervisorRecord)
    except CorruptFile as exc:
        problems.append(str(exc))
    sup_running = home.lock_is_held()
    cycle = None
    current = _read_or_report(home.current_file, CurrentCycle, problems) if sup_running else None
    if current is not None:
        cycle = cycle_progress(
            home, CycleView(**current.model_dump(exclude={"schema_version"}, mode="json"))
        )
    needs = _read_or_report(home.needs_operator_file, NeedsOperatorRecord, problems)
    cycles = evidence_mod.list_cycles(home)
    last, last_problem = checked_summary(home, cycles[0]) if cycles else (None, None)
    policy = ctx.policy
    return StatusView(
        configured=True,
        home=str(home.root),
        service=service,
        supervisor_pid=sup.pid if sup and sup_running else None,
        supervisor_running=sup_running,
        cycle=cycle,
        queue=queued_ids(home),
        last_cycle=last,
        last_cycle_verified=(last_problem is None) if last else None,
        last_cycle_problem=last_problem,
        verify_command=evidence_mod.verify_command(home, last.cycle_id) if last else None,
        policy=policy.name,
        window=policy.window.model_dump(),
        window_now=_window_text(ctx),
        needs_operator=(
            needs.reason
            if needs
            else "the needs-operator record is unreadable"
            if home.needs_operator_file.exists()
            else None
        ),
        evidence_key=home_fingerprint(home),
        problems=problems,
    )


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


def queued_ids(home: Home) -> list[str]:
    """Plan ids waiting in the queue, in order. The running plan's entry stays in the queue
    folder until its cycle is sealed: it is running, not waiting, so it is left out."""
    ids = [p.stem.split("-", 1)[1] for p in home.queued()]
    running = running_plan_id(home) if ids else None
    return [i for i in ids if i != running]


def running_plan_id(home: Home) -> str | None:
    """The plan of the cycle a supervisor runs now (its journal's first event names it)."""
    try:
        current = read_optional(home.current_file, CurrentCycle)
    except CorruptFile:
        return None
    if current is None or not home.lock_is_held():
        return None
    events, _ = home.read_journal(current.cycle_id)
    plan_id = events[0].fields.get("plan_id") if events else None
    return plan_id if isinstance(plan_id, str) else None


def _read_or_report(path: Path, cls: type[M], problems: list[str]) -> M | None:
    """A state file for a read view: absent is None; corrupt is None plus a reported problem."""
    try:
        return read_optional(path, cls)
    except CorruptFile as exc:
        problems.append(str(exc))
        return None


NOMINAL_STATES = [
    "QUEUED",
    "PREFLIGHT",
    "PREPARE",
    "BASELINE",
    "MAINTENANCE",
    "EXPERIMENT",
    "SELECT",
    "PROMOTE",
    "VERIFY",
    "COMMIT",
    "SEALED",
]
RESTARTING_STATES = {"PROMOTE", "VERIFY", "ROLLBACK", "RECOVER"}


def cycle_progress(home: Home, cycle: CycleView) -> CycleView:
    """Add when the cycle started, how far it is, and what downtime the current step implies."""
    events, _ = home.read_journal(cycle.cycle_id)
    update: dict[str, Any] = {"steps": len(NOMINAL_STATES)}
    if events:
        update["started_at"] = events[0].ts
        update["elapsed_s"] = round((utcnow() - events[0].ts).total_seconds(), 1)
        update["plan_id"] = events[0].fields.get("plan_id")
    if cycle.state in NOMINAL_STATES:
        update["step"] = NOMINAL_STATES.index(cycle.state) + 1
    index, total = cycle.index, cycle.total
    if cycle.candidate and not (index and total):  # a later event of the same candidate
        for event in reversed(events):
            if event.fields.get("candidate") == cycle.candidate and event.fields.get("index"):
                index, total = event.fields.get("index"), event.fields.get("total")
                update.update(index=index, total=total)
                break
    where = progress(events, utcnow())
    parts = [cycle.state]
    if where.round is not None:
        rounds = ""
        if where.phase == "measure" and where.min_rounds and where.max_rounds:
            rounds = (
                f" of {where.max_rounds}"
                if where.min_rounds >= where.max_rounds
                else f" of {where.min_rounds} to {where.max_rounds}"
            )
        what = "held-out check" if where.phase == "heldout" else "round"
        parts.append(f"{what} {where.round}{rounds}" if what == "round" else what)
        update["measuring"] = where
    if cycle.candidate and index and total:
        parts.append(f"measuring {cycle.candidate} (start {index} of {total} in this round)")
    if update.get("step"):
        parts.append(f"step {update['step']} of {update['steps']}")
    if left := left_text(where):
        parts.append(left + (" of measuring" if where.phase == "measure" else ""))
    if waiting := waiting_text(events):
        parts.append(waiting)
    update["progress"] = ", ".join(parts)
    update.update(projection_progress(home, update.get("plan_id"), events, update.get("elapsed_s")))
    modes = [e.fields for e in events if e.fields.get("mode")]
    mode = str(modes[-1]["mode"]) if modes else "concurrent"
    expected = next(
        (
            float(e.fields["expected_downtime_s"])
            for e in reversed(events)
            if e.fields.get("expected_downtime_s") is not None
        ),
        0.0,
    )
    if mode == "exclusive" and cycle.state in ("MAINTENANCE", "EXPERIMENT", *RESTARTING_STATES):
        update["expected_downtime_s"] = expected
        update["downtime_note"] = (
            f"exclusive mode ({modes[-1].get('mode_reason', '')}): the "
            "live backend is stopped while this runs; the front on the "
            "stable port holds requests, then answers 503 with "
            "Retry-After past the policy's hold bound"
        )
    else:
        update["expected_downtime_s"] = 0.0
        update["downtime_note"] = (
            "none: requests go through the front on the stable port; "
            "candidates run on ports of their own beside the live "
            "backend, and a promotion switches the front between two "
            "running backends with no refused request"
        )
    return cycle.model_copy(update=update)


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
    home: Home, candidate_id: str | None = None, *, wait_costs: bool = True
) -> RegistryView:
    """Every candidate with its checks, memory and cost. ``wait_costs=False`` (the MCP read):
    a cost not yet in the home's projection cache is computed in the background (``pending``)."""
    ctx = HomeContext(home)
    manifests, policy, facts = ctx.manifests, ctx.policy, ctx.facts
    recipes = {
        f"{m.id}:{v.id}": resolve_recipe(m, v, home.models, home.hf_cache, runtimes=home.runtimes)
        for m in manifests.values()
        for v in m.variants
        if not candidate_id or f"{m.id}:{v.id}" == candidate_id
    }
    p_hash = ctx.policy_hash
    learned = _learned(home, recipes, p_hash)
    skips = memory.skips(home, recipes, policy, p_hash)
    from mcp_infra.flows.impact import preview

    views = []
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            if candidate_id and cid != candidate_id:
                continue
            check = preflight(manifest, variant, policy, facts, require_artifacts=True)
            mode = preview(home, policy, [cid])
            cost = (
                candidate_cost(
                    ctx, cid, recipes[cid], mode.memory_mode if mode else None, wait_costs
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
    return RegistryView(candidates=views, live_recipe=live)


def unknown_candidate(home: Home, candidate_id: str) -> str:
    """One line: the id is not a candidate, the nearest ids, how to list them (the id is shown
    only if it is well-formed)."""
    ids = [f"{m.id}:{v.id}" for m in HomeContext(home).manifests.values() for v in m.variants]
    shown = candidate_id if re.fullmatch(CANDIDATE_ID_PATTERN, candidate_id) else "that id"
    return (
        f"{shown} is not a candidate of the registry{nearest_text(candidate_id, ids)}; "
        "list them with `registry` (no arguments)"
    )


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
    plan_hash: str | None = Field(
        None, description="sha256 of the frozen plan (also in the audit log)"
    )
    window: str | None = Field(None, description="when the policy lets a queued plan start")
    memory_mode: str | None = Field(None, description="concurrent or exclusive (see README)")
    memory_mode_reason: str | None = None
    expected_downtime_s: float | None = None
    downtime_note: str | None = None
    cost: PlanCost | None = Field(
        None,
        description="the plan projected on this machine before it runs: minutes, rounds, "
        "requests and unserved seconds (or unknown, with why); held: why it waits for the "
        "maintenance window",
    )


def propose(
    home: Home,
    raw: Any,
    *,
    proposed_by: str = "unknown",
    dry_run: bool = False,
    start_supervisor: bool = True,
) -> ProposalView:
    """Validate, sanitize, freeze and queue a plan. Refusals are answers, not exceptions."""
    home.ensure()
    raw_hash = _raw_hash(raw)
    ctx = HomeContext(home)
    try:
        plan = parse_plan(raw)
        frozen = freeze_plan(ctx, plan, proposed_by)
    except PlanRefused as exc:
        view = ProposalView(
            accepted=False,
            dry_run=dry_run,
            message=str(exc),
            problems=exc.problems,
            refused=exc.refused,
        )
        home.append_audit(
            AuditRecord(
                ts=utcnow(),
                client=proposed_by[:200],
                plan_hash=raw_hash,
                accepted=False,
                detail=("dry run: " if dry_run else "") + str(exc)[:300],
            )
        )
        return view
    view = ProposalView(
        accepted=True,
        dry_run=dry_run,
        plan_id=frozen.plan_id,
        message="dry run: the plan would be queued as shown"
        if dry_run
        else "plan frozen and queued; a supervisor runs it",
        candidates=frozen.candidates,
        thresholds=frozen.thresholds.model_dump(exclude={"quality_budget"}),
        changes=frozen.changes,
        refused=frozen.refused,
        plan_hash=frozen.content_hash,
        window=_window_text(ctx),
        **_mode_preview(ctx, frozen.candidates[1:]),
    )
    view, refusal = with_cost(ctx, frozen, view)
    if refusal is not None:
        _audit_plan(home, proposed_by, frozen, ("dry run: " if dry_run else "") + refusal)
        return view
    if dry_run:
        _audit_plan(home, proposed_by, frozen, "dry run: would be accepted; nothing queued", True)
        return view
    home.enqueue(frozen)
    if view.cost is not None:
        write_model(cost_sidecar(home, frozen.plan_id), view.cost)
    _audit_plan(home, proposed_by, frozen, "", True)
    queue = queued_ids(home)
    view.queue_position = queue.index(frozen.plan_id) + 1 if frozen.plan_id in queue else None
    view.follow = (
        "call `status` for progress and `evidence` once the cycle is sealed "
        "(CLI: mcp-infra status / mcp-infra evidence)"
    )
    if start_supervisor:
        ensure_supervisor(home)
    return view


def cost_sidecar(home: Home, plan_id: str) -> Path:
    """Where a queued plan's projected cost is kept, beside the frozen plan."""
    return home.plans / f"{plan_id}.cost.json"


def plan_recipes(ctx: HomeContext, candidates: list[str]) -> dict[str, Recipe]:
    """The recipes of a plan's candidates, as the cycle will resolve them."""
    out = {}
    for cid in candidates:
        if (hit := ctx.find(cid)) is not None:
            out[cid] = resolve_recipe(
                *hit, ctx.home.models, ctx.home.hf_cache, runtimes=ctx.home.runtimes
            )
    return out


def with_cost(
    ctx: HomeContext, frozen: FrozenPlan, view: ProposalView
) -> tuple[ProposalView, str | None]:
    """The proposal with its projected cost, and the policy's unserved limit applied: an
    exclusive plan projected over ``service.max_unserved_s`` is held for the maintenance window
    (said in the answer) or refused (the refusal's words are returned)."""
    from mcp_infra.core.admission import unserved_limit
    from mcp_infra.flows import projection

    mode: Literal["concurrent", "exclusive"] = (
        "exclusive" if view.memory_mode == "exclusive" else "concurrent"
    )
    cost = projection.plan_cost(
        ctx.home,
        frozen,
        ctx.policy,
        ctx.live.candidate_id,
        mode,
        plan_recipes(ctx, frozen.candidates[1:]),
    )
    service = ctx.policy.service
    action, why = unserved_limit(mode, cost.unserved_s, service.max_unserved_s, ctx.policy.window)
    if action == "refuse":
        message = f"plan refused: {why}"
        refused = view.model_copy(
            update={"accepted": False, "message": message, "problems": [why], "cost": cost}
        )
        return refused, message
    if action == "hold":
        cost = cost.model_copy(update={"held": why})
        verb = "would be held" if view.dry_run else "held"
        message = f"{view.message}; {verb} for the maintenance window: {why}"
        return view.model_copy(update={"cost": cost, "message": message}), None
    return view.model_copy(update={"cost": cost}), None


def candidate_cost(
    ctx: HomeContext, candidate: str, recipe: Recipe, mode: str | None, wait: bool
) -> PlanCost:
    """A plan of this candidate alone under the home's policy, projected on this machine."""
    from mcp_infra.flows import projection

    plan = projection.simulated_plan(ctx.policy, [candidate])
    try:
        live = ctx.live.candidate_id
    except FileNotFoundError:
        return PlanCost(basis="unknown", why="no managed service is configured (config.yaml)")
    kind: Literal["concurrent", "exclusive"] = "exclusive" if mode == "exclusive" else "concurrent"
    return projection.plan_cost(
        ctx.home, plan, ctx.policy, live, kind, {candidate: recipe}, wait=wait
    )


def projection_progress(
    home: Home, plan_id: object, events: list[Any], elapsed_s: float | None
) -> dict[str, Any]:
    """The running plan's projected cost (kept beside it when it was proposed) against the
    elapsed time, and whether the cycle measures what was projected (its MAINTENANCE line
    names the configurations)."""
    if not isinstance(plan_id, str):
        return {}
    try:
        cost = read_optional(cost_sidecar(home, plan_id), PlanCost)
    except CorruptFile:
        return {}
    if cost is None:
        return {"projection": "no projection was made when this plan was proposed"}
    if cost.minutes is None:
        return {"projected": cost, "projection": f"projected cost {cost.basis}: {cost.why}"}
    words = f"projected {cost.minutes:.1f} min (up to {cost.minutes_high:.1f}"
    words += f" over {cost.seeds} seeds), {cost.rounds} round(s)"
    if cost.mode == "exclusive":
        words += f", {cost.unserved_s:.0f} s unserved"
    if elapsed_s is not None:
        share = 60 * cost.minutes
        words += f"; {elapsed_s / 60:.1f} min elapsed ({elapsed_s / share:.0%} of the projection)"
    measured = next(
        (e.fields["configurations"] for e in reversed(events) if e.fields.get("configurations")),
        None,
    )
    if isinstance(measured, list) and measured != cost.configurations:
        words += (
            f"; projected for {', '.join(cost.configurations)}, the cycle measures "
            f"{', '.join(str(m) for m in measured)}"
        )
    return {"projected": cost, "projection": words}


def _audit_plan(
    home: Home, proposed_by: str, frozen: FrozenPlan, detail: str, accepted: bool = False
) -> None:
    home.append_audit(
        AuditRecord(
            ts=utcnow(),
            client=proposed_by[:200],
            plan_hash=frozen.content_hash,
            accepted=accepted,
            plan_id=frozen.plan_id,
            detail=detail[:300],
        )
    )


def _raw_hash(raw: Any) -> str:
    """The audit's hash of what was sent, whatever it is (a value too deep to walk is hashed
    by its kind: it is refused before anything parses it)."""
    if isinstance(raw, str | bytes):
        return sha256_bytes(raw.encode() if isinstance(raw, str) else raw)
    try:
        return sha256_bytes(json.dumps(raw, sort_keys=True, default=str).encode())
    except (RecursionError, ValueError, TypeError):
        return sha256_bytes(f"unhashable {type(raw).__name__}".encode())


def _mode_preview(ctx: HomeContext, candidates: list[str]) -> dict[str, Any]:
    from mcp_infra.flows.impact import preview

    try:
        found = preview(ctx.home, ctx.policy, candidates)
    except Exception:  # a preview never refuses a plan
        return {}
    return found.model_dump() if found else {}


def _window_text(ctx: HomeContext) -> str:
    """Whether a queued plan may start now under the policy's window, and why (or when)."""
    state = ctx.window()
    return ("may start now: " if state.may_start else "waits: ") + state.reason


def freeze_plan(ctx: HomeContext, plan: Any, proposed_by: str) -> FrozenPlan:
    """Sanitize a parsed plan against this home (policy, registry, preflight, memory) into the
    frozen plan a cycle runs; raises PlanRefused with our own words."""
    home = ctx.home
    if not ctx.configured:
        raise PlanRefused("plan refused: no managed service is configured (config.yaml missing)")
    policy, manifests, facts = ctx.policy, ctx.manifests, ctx.facts
    checks, recipes = {}, {}
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            checks[cid] = preflight(manifest, variant, policy, facts, require_artifacts=True)
            recipes[cid] = resolve_recipe(
                manifest, variant, home.models, home.hf_cache, runtimes=home.runtimes
            )
    live_peak = _last_baseline_peak(home)
    p_hash = ctx.policy_hash
    wanted = {c: recipes[c] for c in getattr(plan, "candidates", []) if c in recipes}
    learned = (
        learned_spread(home, policy.protocol, utcnow(), busy_fraction(policy.service))
        if policy.protocol.learn_spread
        else None
    )
    return sanitize(
        plan,
        manifests=manifests,
        policy=policy,
        preflights=checks,
        live_recipe=ctx.live,
        live_peak_memory_gb=live_peak,
        registry_hash=ctx.registry_hash,
        policy_hash=p_hash,
        proposed_by=proposed_by,
        now=utcnow(),
        candidate_recipes=recipes,
        skip=memory.skips(home, wanted, policy, p_hash),
        learned_spread=learned,
    )


def _last_baseline_peak(home: Home) -> float | None:
    for summary in evidence_mod.list_cycles(home):
        path = home.bundle_files(summary.cycle_id).run(BASELINE_ID)
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
    with open_append(log) as handle:
        proc = subprocess.Popen(  # argv list, no shell; its own session outlives the caller
            [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "supervise"],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return proc.pid


def watcher_pid(home: Home) -> int | None:
    """The pid of the `supervise --watch` that ``ensure_watcher`` started, if it still runs (the
    record holds its start time, so a recycled pid is not mistaken for it)."""

    try:
        record = read_optional(home.watcher_file, SupervisorRecord)
    except CorruptFile:
        return None
    if record is None:
        return None
    return record.pid if is_alive(record.pid, record.create_time) else None


def ensure_watcher(home: Home) -> int | None:
    """Start a detached `supervise --watch` (runs queued plans when the window allows, keeps
    watching) unless the one started before still runs; return the new pid, or None. The
    watcher holds the supervisor lock only while it supervises, so it is recognised by its
    record in state/watcher.json, not by the lock. Used by `serve --mode autonomous`."""

    if watcher_pid(home) is not None:
        return None
    home.ensure()
    log = home.logs / "supervisor.log"
    with open_append(log) as handle:
        proc = subprocess.Popen(  # argv list, no shell; its own session outlives the caller
            [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "supervise", "--watch"],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:  # it exited at once; its log says why
        return proc.pid
    write_model(
        home.watcher_file, SupervisorRecord(pid=proc.pid, create_time=created, started_at=utcnow())
    )
    return proc.pid


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


def prepare_candidate(
    home: Home,
    candidate_id: str,
    *,
    cache: Path | None = None,
    offline: bool | None = None,
    progress: bool = True,
) -> PrepareResult:
    """Preflight a candidate (all but its artifacts), then prepare its pinned hub artifacts.

    ``home`` is a ``store.Home``; the policy is the configured one (``default`` if none).
    """
    ctx = HomeContext(home)
    found = ctx.find(candidate_id)
    if found is None:
        raise HubError(
            f"{candidate_id}: not a candidate of the registry (see `mcp-infra registry`)"
        )
    manifest, variant = found
    policy = ctx.policy
    checks = ctx.preflight(manifest, variant)
    blocking = [
        f"{c.name}: {c.detail}"
        for c in checks.checks
        if not c.passed and c.name not in PREPARE_IGNORES
    ]
    if blocking:
        raise HubError(
            f"{candidate_id}: preflight fails, nothing downloaded: " + "; ".join(blocking)
        )
    spec = manifest.environment_of(variant)
    built = None
    if spec is not None:
        try:
            built = runtimes.build(
                spec,
                home.runtimes,
                policy,
                offline=bool(offline) or None,
                progress=progress,
            )
        except runtimes.RuntimeEnvError as exc:
            raise HubError(f"{candidate_id}: {exc}") from exc
        after = HomeContext(home).preflight(manifest, variant)  # its --help is known now
        flags = [
            f"{c.name}: {c.detail}"
            for c in after.checks
            if c.name.startswith("runtime_") and not c.passed
        ]
        if flags:
            raise HubError(
                f"{candidate_id}: the environment is built, but preflight fails: "
                + "; ".join(flags)
            )
    if not candidate_artifacts(manifest, variant.knobs.draft):
        if built is None and any(a.demo for a in (manifest.target, *manifest.artifacts)):
            raise HubError(f"{candidate_id}: its models are demo models: run `mcp-infra demo`")
        return PrepareResult(
            candidate=candidate_id,
            cache=str(cache or hub.hub_cache()),
            offline=bool(offline),
            artifacts=[],
            runtime=built,
        )
    result = hub.prepare(
        manifest,
        candidate_id,
        variant.knobs.draft,
        policy,
        cache=cache,
        offline=offline,
        progress=progress,
    )
    return result.model_copy(update={"runtime": built})


def init_service(home: Home, candidate: str, port: int) -> str:
    """`prepare --init-service`: a first config.yaml whose baseline serves the candidate's target
    without a drafter (left alone if one exists)."""

    if home.config.exists():
        return f"config.yaml exists in {home.root}: left as it is"
    found = HomeContext(home).find(candidate)
    assert found is not None
    manifest, _ = found
    baseline = Recipe(
        candidate_id=f"{manifest.id}:target",
        template=manifest.runtime.template,
        model_path=artifact_path(manifest.target, home.models, home.hf_cache),
        manifest_hash=manifest_hash(manifest),
    )
    home.ensure()
    write_model(home.config, ServiceConfig(port=port, scratch_port=port + 10, baseline=baseline))
    return (
        f"wrote {home.config}: the baseline serves {manifest.target.repo} with "
        f"{manifest.runtime.template} on 127.0.0.1:{port} (scratch port {port + 10}); "
        "start it with `mcp-infra service start`"
    )
