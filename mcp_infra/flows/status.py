"""The status view: the service (asked of the front, never of the backend), the cycle in
progress with how far it is, the queue, the last sealed cycle and the home's problems.

It only reads files and the front's own answer, so it answers fast, also during a cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from mcp_infra.contracts import (
    BackendHealth,
    CurrentCycle,
    CycleSummary,
    FrontRoute,
    FrontStatus,
    NeedsOperatorRecord,
    PlanCost,
    ProcessRecord,
    Recipe,
    ServiceConfig,
    SupervisorRecord,
)
from mcp_infra.core.machine import waiting_text
from mcp_infra.core.progress import Progress, left_text, progress
from mcp_infra.flows.views import View, checked_summary
from mcp_infra.procs.front import (
    ask_front,
    front_holds_port,
    front_record,
    front_status,
    read_route,
    status_age_s,
)
from mcp_infra.procs.runtime import is_running
from mcp_infra.state import evidence as evidence_mod
from mcp_infra.state.context import HomeContext
from mcp_infra.state.signing import home_fingerprint
from mcp_infra.state.store import (
    CorruptFile,
    Home,
    M,
    read_optional,
    utcnow,
)


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
    logging: str | None = Field(
        None, description="logging degraded (the home's disk full), since when, as the front says"
    )
    front_replaced: str | None = Field(
        None, description="how often the front's keeper replaced a stuck proxy, and the last why"
    )


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


def status(home: Home, ask: FrontAsk | None = None) -> StatusView:
    """What the home says now: the service, the cycle in progress, the queue, the last sealed
    cycle (its figures only if its bundle verifies) and every problem met on the way. ``ask``:
    how the front's own answer is had (default: a ``GET /health`` now; the MCP server passes
    its ``FrontWatch``)."""
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
    problems: list[str] = []
    service = service_view(home, config, recipe, problems, ask)
    sup = _read_or_report(home.supervisor_file, SupervisorRecord, problems)
    sup_running = home.lock_is_held()
    cycle = _cycle_now(home, problems) if sup_running else None
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
        window_now=window_text(ctx),
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


def _cycle_now(home: Home, problems: list[str]) -> CycleView | None:
    """The cycle a supervisor runs now, with how far it is (None: none is recorded)."""
    current = _read_or_report(home.current_file, CurrentCycle, problems)
    if current is None:
        return None
    view = CycleView(**current.model_dump(exclude={"schema_version"}, mode="json"))
    return cycle_progress(home, view)


FrontAsk = Callable[[], FrontStatus | None]
"""How `status` has the front's own answer of about this instant (None: it did not answer)."""


@dataclass(frozen=True)
class FrontSeen:
    """What the front on the stable port says now, read without a backend request: the front
    probes its backend every few seconds (no completion) and says what it saw."""

    record: ProcessRecord | None
    alive: bool
    answered: FrontStatus | None = None  # its own GET /health of this instant
    status: FrontStatus | None = None  # that answer, else its last written status file
    route: FrontRoute | None = None

    @classmethod
    def read(
        cls, home: Home, port: int, problems: list[str], ask: FrontAsk | None = None
    ) -> FrontSeen:
        record = None
        try:
            record = front_record(home)
        except CorruptFile as exc:
            problems.append(str(exc))
        alive = front_holds_port(record, port)
        if not alive:
            return cls(record, alive)
        answered = ask() if ask is not None else ask_front(home, timeout=1.0)
        route = None
        with contextlib.suppress(CorruptFile):
            route = read_route(home)
        return cls(record, alive, answered, answered or front_status(home), route)

    @property
    def probe(self) -> BackendHealth | None:
        return self.status.backend if self.status else None

    @property
    def probe_age_s(self) -> float | None:
        probe = self.probe
        if probe is None or probe.checked_at is None:
            return None
        return round((utcnow() - probe.checked_at).total_seconds(), 1)

    @property
    def adopted(self) -> bool:
        """The front serves the route last written for it."""
        return (
            self.status is not None
            and self.route is not None
            and self.status.generation == self.route.generation
        )

    def healthy(self, backend_alive: bool) -> bool:
        """A front whose process lives but does not answer is not a healthy service, whatever
        its last written status file says."""
        probe = self.probe
        return bool(
            self.alive
            and self.answered
            and backend_alive
            and self.status
            and self.adopted
            and self.status.mode == "serve"
            and probe
            and probe.healthy
        )

    def health_words(self, backend_alive: bool) -> str:
        """How ``healthy`` was decided, in words."""
        if not self.alive:
            return "no front on the stable port"
        probe, age = self.probe, self.probe_age_s
        if probe and probe.healthy and age is not None:
            backend = (
                f"healthy ({probe.detail.split(':')[0]}, probed every 2 s; no change for "
                f"{age:.0f} s)"
            )
        else:
            backend = "not seen healthy yet" if backend_alive else "not running"
        how = f"front on the stable port, live backend {backend}"
        if self.answered is None:
            how += "; the front did not answer its own GET /health within 1 s"
        if self.status and self.status.mode == "hold":
            how += "; the front is holding requests while backends swap"
        if self.status and self.route and not self.adopted:
            how += (
                f"; the front has not confirmed route {self.route.generation} (it serves "
                f"{self.status.generation})"
            )
        return how

    def task_problems(self) -> list[str]:
        """The front's own tasks that failed and were restarted."""
        return [
            f"front task {name} failed {task.failures} time(s) and was restarted "
            f"(last: {task.last_error})"
            for name, task in (self.status.tasks if self.status else {}).items()
            if task.failures
        ]


def service_view(
    home: Home,
    config: ServiceConfig,
    recipe: Recipe,
    problems: list[str],
    ask: FrontAsk | None = None,
) -> ServiceView:
    """The managed service as the front sees it; unreadable records are reported in
    ``problems``, never raised."""
    record = _read_or_report(home.service_file, ProcessRecord, problems)
    alive = record is not None and is_running(record)
    front = FrontSeen.read(home, config.port, problems, ask)
    problems.extend(front.task_problems())
    fstat, probe = front.status, front.probe
    healing = fstat.healing if fstat else None
    return ServiceView(
        endpoint=f"http://{config.host}:{config.port}/v1",
        healthy=front.healthy(alive),
        active_recipe=recipe.candidate_id,
        knobs=recipe.knobs.model_dump(exclude_defaults=True),
        runtime=(
            f"{recipe.runtime.label} in runtimes/{recipe.runtime.env_hash[:12]}"
            if recipe.runtime
            else None
        ),
        pid=record.pid if alive and record else None,
        since=record.started_at if alive and record else None,
        health_check=front.health_words(alive),
        front_pid=front.record.pid if front.alive and front.record else None,
        front_status_age_s=status_age_s(fstat),
        backend_url=fstat.backend_url if fstat else None,
        backend_healthy=probe.healthy if probe else None,
        backend_health_age_s=front.probe_age_s,
        route_mode=fstat.mode if fstat else None,
        requests_in_flight=fstat.in_flight if fstat else None,
        requests_held_now=fstat.held_now if fstat else None,
        healing=healing.note if healing and (healing.deaths or healing.state != "ok") else None,
        logging=(
            f"degraded since {fstat.logging.since:%Y-%m-%d %H:%M:%S} UTC: {fstat.logging.detail}"
            if fstat and fstat.logging.state == "degraded" and fstat.logging.since
            else None
        ),
        front_replaced=(
            f"{fstat.watchdog.replaced} time(s); last: {fstat.watchdog.last}"
            if fstat and fstat.watchdog.replaced
            else None
        ),
    )


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
    if cost.basis == "live-service":
        words += " (first projection: the live service as BASELINE measured it, no gain assumed)"
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


def cost_sidecar(home: Home, plan_id: str) -> Path:
    """Where a queued plan's projected cost is kept, beside the frozen plan."""
    return home.plans / f"{plan_id}.cost.json"


def window_text(ctx: HomeContext) -> str:
    """Whether a queued plan may start now under the policy's window, and why (or when)."""
    state = ctx.window()
    return ("may start now: " if state.may_start else "waits: ") + state.reason
