"""The proposal path: a plan validated, sanitized against the home and frozen, its cost
projected, queued and audited, and a detached supervisor (or watcher) made sure of; and
``prepare``, which readies a candidate's artifacts and a first service for the home.

``propose`` never touches the service itself: the supervisor runs the plan.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import Field

from mcp_infra.contracts import (
    BASELINE_ID,
    AuditRecord,
    BuildRecord,
    FrozenPlan,
    JSONValue,
    Manifest,
    PlanChange,
    PlanCost,
    Recipe,
    RefusedCandidate,
    ServiceConfig,
    SupervisorRecord,
    Variant,
)
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.core.machine import busy_fraction
from mcp_infra.core.preflight import (
    manifest_hash,
    preflight,
)
from mcp_infra.core.sanitize import PlanContext, PlanRefused, parse_plan, sanitize
from mcp_infra.flows.own import make_builds
from mcp_infra.flows.status import cost_sidecar, queued_ids, window_text
from mcp_infra.flows.views import View
from mcp_infra.procs.identity import is_alive
from mcp_infra.procs.logpipe import CYCLE_ROOM_BYTES, room_problem, spawn_logged
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
from mcp_infra.state.context import HomeContext
from mcp_infra.state.spread import learned_spread
from mcp_infra.state.store import (
    CorruptFile,
    Home,
    read_optional,
    utcnow,
    write_model,
)


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
    """Validate, sanitize, freeze and queue a plan. Refusals are answers, not exceptions.

    Plans to be queued are frozen and queued one at a time (``queue_turn``): a plan's place
    in the queue is the time it was frozen, so two proposals frozen side by side could be
    queued in the other order, and both told the same queue position."""
    home.ensure()
    with contextlib.nullcontext() if dry_run else queue_turn(home):
        view = _freeze_and_queue(home, raw, proposed_by, dry_run)
    if start_supervisor and view.accepted and not dry_run:
        ensure_supervisor(home)
    return view


@contextlib.contextmanager
def queue_turn(home: Home) -> Iterator[None]:
    """One proposal at a time freezes and queues its plan: an flock on ``plans/.propose.lock``
    (it dies with its holder; agents may each run an MCP server of their own), held for the
    fraction of a second that takes."""
    with (home.plans / ".propose.lock").open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _freeze_and_queue(home: Home, raw: Any, proposed_by: str, dry_run: bool) -> ProposalView:
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
        window=window_text(ctx),
        **_mode_preview(ctx, frozen.candidates[1:]),
    )
    view, refusal = with_cost(ctx, frozen, view)
    if refusal is not None:
        _audit_plan(home, proposed_by, frozen, ("dry run: " if dry_run else "") + refusal)
        return view
    if dry_run:
        _audit_plan(home, proposed_by, frozen, "dry run: would be accepted; nothing queued", True)
        return view
    if (full := room_problem(home.root, CYCLE_ROOM_BYTES)) is not None:  # nothing half-written
        view.accepted, view.message = False, f"refused: {full}; nothing was queued"
        with contextlib.suppress(OSError):
            _audit_plan(home, proposed_by, frozen, view.message)
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
    return view


def plan_recipes(ctx: HomeContext, candidates: list[str]) -> dict[str, Recipe]:
    """The recipes of a plan's candidates, as the cycle will resolve them."""
    out = {}
    for cid in candidates:
        if (hit := ctx.find(cid)) is not None:
            out[cid] = resolve_recipe(
                *hit,
                ctx.home.models,
                ctx.home.hf_cache,
                runtimes=ctx.home.runtimes,
                builds=ctx.home.builds,
            )
    return out


def with_cost(
    ctx: HomeContext, frozen: FrozenPlan, view: ProposalView
) -> tuple[ProposalView, str | None]:
    """The proposal with its projected cost, and the policy's unserved limit applied: an
    exclusive plan projected over ``service.max_unserved_s`` is held for the maintenance window
    (said in the answer) or refused (the refusal's words are returned)."""
    from mcp_infra.core.admission import unserved_limit
    from mcp_infra.flows import answers, projection
    from mcp_infra.flows.projection import LiveRecipe

    mode: Literal["concurrent", "exclusive"] = (
        "exclusive" if view.memory_mode == "exclusive" else "concurrent"
    )
    live = LiveRecipe(ctx.live.candidate_id, answers.kept_for(ctx.home, ctx.live, frozen.protocol))
    cost = projection.plan_cost(
        ctx.home,
        frozen,
        ctx.policy,
        live,
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
                manifest,
                variant,
                home.models,
                home.hf_cache,
                runtimes=home.runtimes,
                builds=home.builds,
            )
    p_hash = ctx.policy_hash
    wanted = {c: recipes[c] for c in getattr(plan, "candidates", []) if c in recipes}
    learned = (
        learned_spread(home, policy.protocol, utcnow(), busy_fraction(policy.service))
        if policy.protocol.learn_spread
        else None
    )
    context = PlanContext(
        manifests=manifests,
        policy=policy,
        preflights=checks,
        live_recipe=ctx.live,
        registry_hash=ctx.registry_hash,
        policy_hash=p_hash,
        live_peak_memory_gb=_last_baseline_peak(home),
        candidate_recipes=recipes,
        skip=memory.skips(home, wanted, policy, p_hash),
        learned_spread=learned,
    )
    return sanitize(plan, context, proposed_by=proposed_by, now=utcnow())


def _last_baseline_peak(home: Home) -> float | None:
    for summary in evidence_mod.list_cycles(home):
        path = home.bundle_files(summary.cycle_id).run(BASELINE_ID)
        if path.exists():
            try:
                return json.loads(path.read_text()).get("peak_memory_gb")
            except ValueError:
                return None
    return None


def _start_detached(home: Home, *args: str) -> int:
    """Start ``mcp-infra --home HOME ARGS`` in its own session, so it outlives the caller
    (argv list, no shell; output to the supervisor's log, through a log relay); return its
    pid."""
    proc = spawn_logged(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), *args],
        home.logs / "supervisor.log",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc.pid


def ensure_supervisor(home: Home) -> int | None:
    """Start a detached supervisor unless one holds the lock; return its pid."""
    if home.lock_is_held():
        return None
    return _start_detached(home, "supervise")


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
    pid = _start_detached(home, "supervise", "--watch")
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:  # it exited at once; its log says why
        return pid
    write_model(
        home.watcher_file, SupervisorRecord(pid=pid, create_time=created, started_at=utcnow())
    )
    return pid


def _quiet(text: str, fields: dict[str, JSONValue]) -> None:
    """Progress of a build that `prepare` makes: the result says what was made."""


def prepare_candidate(
    home: Home,
    candidate_id: str,
    *,
    cache: Path | None = None,
    offline: bool | None = None,
    progress: bool = True,
) -> PrepareResult:
    """Preflight a candidate (all but its artifacts), then prepare what it runs from: its own
    runtime environment, its build, its pinned hub artifacts.

    ``home`` is a ``store.Home``; the policy is the configured one (``default`` if none).
    """
    ctx = HomeContext(home)
    found = ctx.find(candidate_id)
    if found is None:
        raise HubError(
            f"{candidate_id}: not a candidate of the registry (see `mcp-infra registry`)"
        )
    manifest, variant = found
    blocking = [
        f"{c.name}: {c.detail}"
        for c in ctx.preflight(manifest, variant).checks
        if not c.passed and c.name not in PREPARE_IGNORES
    ]
    if blocking:
        raise HubError(
            f"{candidate_id}: preflight fails, nothing downloaded: " + "; ".join(blocking)
        )
    built = _prepare_runtime(ctx, found, offline=offline, progress=progress)
    made = _prepare_build(ctx, found)
    if not candidate_artifacts(manifest, variant.knobs.draft):
        if built is None and any(a.demo for a in (manifest.target, *manifest.artifacts)):
            raise HubError(f"{candidate_id}: its models are demo models: run `mcp-infra demo`")
        return PrepareResult(
            candidate=candidate_id,
            cache=str(cache or hub.hub_cache()),
            offline=bool(offline),
            artifacts=[],
            runtime=built,
            build=made,
        )
    result = hub.prepare(
        manifest,
        candidate_id,
        variant.knobs.draft,
        ctx.policy,
        cache=cache,
        offline=offline,
        progress=progress,
    )
    return result.model_copy(update={"runtime": built, "build": made})


def _prepare_runtime(
    ctx: HomeContext, found: tuple[Manifest, Variant], *, offline: bool | None, progress: bool
) -> runtimes.BuildResult | None:
    """The candidate's own runtime environment, built (or reused), then its flags checked
    against the built runtime's ``--help``; None if it names none."""
    manifest, variant = found
    candidate_id = f"{manifest.id}:{variant.id}"
    spec = manifest.environment_of(variant)
    if spec is None:
        return None
    try:
        built = runtimes.build(
            spec, ctx.home.runtimes, ctx.policy, offline=bool(offline) or None, progress=progress
        )
    except runtimes.RuntimeEnvError as exc:
        raise HubError(f"{candidate_id}: {exc}") from exc
    after = HomeContext(ctx.home).preflight(manifest, variant)  # its --help is known now
    flags = [
        f"{c.name}: {c.detail}"
        for c in after.checks
        if c.name.startswith("runtime_") and not c.passed
    ]
    if flags:
        raise HubError(
            f"{candidate_id}: the environment is built, but preflight fails: " + "; ".join(flags)
        )
    return built


def _prepare_build(ctx: HomeContext, found: tuple[Manifest, Variant]) -> BuildRecord | None:
    """The candidate's build, made from its source into the home; None if it serves none."""
    manifest, variant = found
    candidate_id = f"{manifest.id}:{variant.id}"
    if variant.build is None:
        return None
    outcome = make_builds(ctx.home, ctx.policy, [(candidate_id, manifest, variant)], None, _quiet)
    made = outcome[candidate_id]
    if isinstance(made, str):
        raise HubError(f"{candidate_id}: {made}")
    return made


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
