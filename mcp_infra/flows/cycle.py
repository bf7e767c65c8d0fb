"""The supervisor: one optimization cycle, read top to bottom.

QUEUED → PREFLIGHT → PREPARE → BASELINE → MAINTENANCE → EXPERIMENT(each) → SELECT → PROMOTE →
VERIFY → COMMIT | ROLLBACK → SEALED. Each state is journaled (fsync) before its side effect, so
``recovery.decide`` can always tell what a killed cycle had done. Decisions are made by the pure
core (policy, selector, recovery); this module only sequences I/O around them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CurrentCycle,
    CycleState,
    CycleSummary,
    DistributedEvidence,
    Event,
    FrozenPlan,
    JournalStep,
    Manifest,
    Outcome,
    ProcessRecord,
    Recipe,
    Sample,
    ServiceConfig,
    SupervisorRecord,
    Variant,
    Verdict,
)
from mcp_infra.core.admission import admit, expected_downtime_s
from mcp_infra.core.gates import compare_greedy, smoke_failures
from mcp_infra.core.machine import busy_fraction, open_verdict_words, quiet_rule
from mcp_infra.core.preflight import Preflight, find_candidate, preflight
from mcp_infra.core.recovery import Action, decide
from mcp_infra.core.screening import screens
from mcp_infra.core.units import selected_speedup_pct
from mcp_infra.core.workload import cell_regressions, describe_cell
from mcp_infra.errors import McpInfraError, ServerUnavailable
from mcp_infra.flows import impact
from mcp_infra.flows.confirm import heldout_check, measure_drift
from mcp_infra.flows.machine import Machine
from mcp_infra.flows.measure import (
    SERVER_START_ERRORS,
    annotate_cells,
    measure_live,
    server_starter,
)
from mcp_infra.flows.rounds import Bench, LiveTraffic, decide_cycle, run_rounds
from mcp_infra.procs import bench, usage
from mcp_infra.procs.distributed import preflight_hosts
from mcp_infra.procs.front import live_request_count
from mcp_infra.procs.runtime import PortBusy, ServerStartError
from mcp_infra.procs.service import (
    ServiceError,
    SwitchFailed,
    adopt,
    backend_url,
    ensure_serving,
    hold_live,
    is_serving,
    service_policy,
    stable_port_held_by_stranger,
    start_backend,
    stop_stray_candidates,
)
from mcp_infra.state import evidence, memory, signing
from mcp_infra.state.artifacts import HubError, resolve_recipe
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.context import (
    HomeContext,
    active_recipe,
    load_config,
    mark_needs_operator,
    service_record,
    window_state,
)
from mcp_infra.state.hostfacts import fingerprint_environment, folder_fingerprint
from mcp_infra.state.runtimes import RuntimeEnvError, keep_runtime_locks
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    file_safe,
    read_model,
    read_optional,
    utcnow,
    write_model,
)

PAUSE_ENV = "MCP_INFRA_PAUSE_AT"


class NeedsOperator(McpInfraError, RuntimeError):
    """The service could not be restored; no cycle runs until a person (or `recover`) acts."""


class CycleResult(NamedTuple):
    """How a cycle (or an approval) ended, before it is sealed."""

    outcome: Outcome
    selected: str | None
    reason: str
    speedup_pct: float | None = None


# ---------------------------------------------------------------------------------------------
# Journal
# ---------------------------------------------------------------------------------------------


class Journal:
    def __init__(self, home: Home, cycle_id: str) -> None:
        self.home = home
        self.cycle_id = cycle_id

    def __call__(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: Any
    ) -> None:
        """Append the event (fsynced) first; then, if asked to, pause here for fault injection."""
        if step is not None:
            fields = {"step": JournalStep(step).value, **fields}
        self.home.append_event(
            Event(ts=utcnow(), cycle_id=self.cycle_id, state=state, message=message, fields=fields)
        )
        write_model(self.home.supervisor_file, _supervisor_record(self.cycle_id))
        write_model(
            self.home.current_file,
            CurrentCycle(
                cycle_id=self.cycle_id,
                state=state,
                message=message,
                **{k: v for k, v in fields.items() if k in {"candidate", "index", "total"}},
            ),
        )
        at = JournalStep(step or JournalStep.ENTER).value
        pause = os.environ.get(PAUSE_ENV)
        if pause and (pause == f"{state.value}:{at}" or (pause, at) == (state.value, "enter")):
            marker = self.home.state / f"paused-at-{pause.replace(':', '-')}"
            marker.write_text(f"{os.getpid()}\n")
            while marker.exists():  # a seam for tests: wait until killed, or released (unlinked)
                time.sleep(0.1)
            os.environ.pop(PAUSE_ENV, None)  # released: the seam holds once per process

    def quietly(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: Any
    ) -> None:
        """A line on a failure path: a journal that cannot be written (a full disk) must not stop
        the restore that follows; recovery then decides from the lines that were written."""
        with contextlib.suppress(OSError):
            self(state, message, step, **fields)


def _supervisor_record(cycle_id: str | None) -> SupervisorRecord:
    return SupervisorRecord(
        pid=os.getpid(),
        create_time=psutil.Process().create_time(),
        started_at=utcnow(),
        cycle_id=cycle_id,
    )


# ---------------------------------------------------------------------------------------------
# Measurement (the same for baseline and candidates)
# ---------------------------------------------------------------------------------------------


def cache_note(recipe: Recipe) -> str:
    served = (
        "prompt cache off (--prompt-cache-size 0)"
        if recipe.knobs.prompt_cache_size == 0
        else "the server's default prompt cache"
    )
    return (
        f"served with {served}. Timed requests open with a unique tag, so no repeat reuses a "
        "cached prompt beyond the chat template's first tokens (cached_tokens is recorded per "
        "request); greedy outputs are requested twice per prompt, the second reusing the "
        "first's cached prefix as real traffic does, and both must match the baseline."
    )


# ---------------------------------------------------------------------------------------------
# The cycle
# ---------------------------------------------------------------------------------------------


def new_cycle_id(plan: FrozenPlan) -> str:
    return f"c-{utcnow().strftime('%Y%m%d-%H%M%S')}-{plan.content_hash[:6]}"


def run_cycle(home: Home, plan: FrozenPlan) -> CycleSummary:
    """Run one frozen plan to a sealed evidence bundle. Never leaves the service unrestored."""
    cycle_id = new_cycle_id(plan)
    cdir = home.cycle_dir(cycle_id)
    cdir.mkdir(parents=True, exist_ok=True)
    write_model(CycleFiles(cdir).plan, plan)
    usage.cycle_start(cdir, home)
    journal = Journal(home, cycle_id)
    started = utcnow()
    journal(CycleState.QUEUED, "plan taken from the queue", plan_id=plan.plan_id)
    try:
        try:
            result = run_steps(CycleContext.open(home, plan, journal))
        except NeedsOperator as exc:
            result = CycleResult(Outcome.NEEDS_OPERATOR, None, str(exc))
        except Exception as exc:  # any unexpected failure: restore, then account for it
            result = restore_after_error(home, journal, exc)
        return conclude(home, plan, cycle_id, journal, started, result)
    except OSError as exc:  # a full or read-only disk: the service first, the records later
        raise _seal_failed(home, journal, exc) from exc


def restore_after_error(home: Home, journal: Journal, exc: Exception) -> CycleResult:
    """An unexpected failure: journal it, bring the live recipe back, and say so."""
    reason = f"cycle failed: {type(exc).__name__}: {str(exc)[:300]}"
    journal.quietly(
        CycleState.ROLLBACK,
        "unexpected error; restoring the live recipe",
        step=JournalStep.ENTER,
        error=reason,
    )
    return CycleResult(restore(home, journal, reason), None, reason)


class SealFailed(McpInfraError, RuntimeError):
    """Evidence could not be written (disk full, read-only home); the service stays restored and
    the next supervisor start finishes sealing."""


def _seal_failed(home: Home, journal: Journal, exc: OSError) -> SealFailed:
    message = f"sealing the evidence failed: {type(exc).__name__}: {exc}"
    journal.quietly(CycleState.SEALED, message, step=JournalStep.FAILED)
    try:
        served = ensure_serving(home, active_recipe(home), load_config(home))
        message += f"; the live recipe serves ({served}); `mcp-infra recover` finishes sealing"
    except (ServerUnavailable, OSError) as restore_error:
        message += f"; restoring the live recipe failed too: {restore_error}"
        with contextlib.suppress(OSError):
            mark_needs_operator(home, journal.cycle_id, message)
    return SealFailed(message)


# ---------------------------------------------------------------------------------------------
# The cycle's context and its steps
# ---------------------------------------------------------------------------------------------


class Admitted(NamedTuple):
    """A plan candidate found in the registry, with the manifest and variant it names."""

    candidate: str
    manifest: Manifest
    variant: Variant


@dataclass
class CycleContext:
    """Everything the steps of one cycle share: the home's loaded context, the frozen plan, the
    journal, the clock and budget, and what the steps found and measured so far."""

    home: Home
    loaded: HomeContext
    plan: FrozenPlan
    journal: Journal
    deadline: float
    clock: Callable[[], float] = time.monotonic
    admitted: list[Admitted] = field(default_factory=list)
    recipes: dict[str, Recipe] = field(default_factory=dict)
    runs: dict[str, CandidateRun] = field(default_factory=dict)
    record: ProcessRecord | None = None
    baseline_s: float = 0.0
    traffic: LiveTraffic | None = None
    exclusive: bool = False
    baseline: CandidateRun | None = None
    verdict: Verdict | None = None

    @classmethod
    def open(cls, home: Home, plan: FrozenPlan, journal: Journal) -> CycleContext:
        loaded = HomeContext(home)
        deadline = time.monotonic() + loaded.policy.budgets.cycle_minutes * 60
        return cls(home=home, loaded=loaded, plan=plan, journal=journal, deadline=deadline)

    @property
    def cycle_id(self) -> str:
        return self.journal.cycle_id

    @property
    def config(self) -> ServiceConfig:
        return self.loaded.config

    @property
    def live(self) -> Recipe:
        return self.loaded.live

    @property
    def files(self) -> CycleFiles:
        return self.home.cycle_files(self.cycle_id)

    def todo(self) -> list[str]:
        """The plan's candidates still to be measured (not refused before measurement)."""
        return [c for c in self.plan.candidates[1:] if c not in self.runs]

    def bench(self) -> Bench:
        return Bench(
            plan=self.plan,
            journal=self.journal,
            run_start=server_starter(self.home, self.config, self.cycle_id),
            start_errors=SERVER_START_ERRORS,
            live_traffic=self.traffic,
            machine=Machine(
                usage.machine_reader(self.home),
                quiet_rule(self.loaded.policy.service),
                busy=busy_fraction(self.loaded.policy.service),
            ),
        )


Step = Callable[[CycleContext], CycleResult | None]
"""One state of the cycle: it journals its entry, does its work, and returns the cycle's result
when the cycle ends there (None: go on to the next step)."""


def preflight_step(c: CycleContext) -> CycleResult | None:
    """The live service must be ours and serving; each candidate must pass preflight and its
    artifacts their check (a refused candidate is recorded, never measured)."""
    c.journal(CycleState.PREFLIGHT, "checking candidates and the live service")
    if stable_port_held_by_stranger(c.home, c.config):
        return CycleResult(
            Outcome.REFUSED,
            None,
            f"port {c.config.port} is held by a process "
            "mcp-infra did not start; refusing to touch it",
        )
    try:
        ensure_serving(c.home, c.live, c.config, timeout=c.plan.protocol.ready_timeout_s)
    except ServerUnavailable as exc:
        raise NeedsOperator(f"the live recipe could not be started: {exc}") from exc
    impact.begin(c.home, c.cycle_id)
    for candidate in c.plan.candidates[1:]:
        found = find_candidate(c.loaded.manifests, candidate)
        if found is None:
            c.runs[candidate] = CandidateRun(
                candidate=candidate, started=False, start_error="no longer in the registry"
            )
            continue
        manifest, variant = found
        c.admitted.append(Admitted(candidate, manifest, variant))
        check = preflight(manifest, variant, c.loaded.policy, c.loaded.facts)
        runtimes = c.home.runtimes
        try:
            recipe = resolve_recipe(
                manifest,
                variant,
                c.home.models,
                c.home.hf_cache,
                fingerprint=folder_fingerprint,
                runtimes=runtimes,
            )
        except (HubError, RuntimeEnvError) as exc:  # a tampered artifact or runtime
            recipe = resolve_recipe(  # environment refuses this candidate, not the cycle
                manifest, variant, c.home.models, c.home.hf_cache, runtimes=runtimes
            )
            what = "runtime environment" if isinstance(exc, RuntimeEnvError) else "artifact"
            c.runs[candidate] = not_started(candidate, recipe, f"{what} check failed: {exc}")
        c.recipes[candidate] = recipe
        if variant.knobs.ranks:
            check = _with_hosts(c, candidate, manifest, variant, recipe, check)
        if not check.passed and candidate not in c.runs:
            c.runs[candidate] = not_started(
                candidate, recipe, "preflight: " + "; ".join(check.failures())
            )
    return None


def _with_hosts(
    c: CycleContext,
    candidate: str,
    manifest: Manifest,
    variant: Variant,
    recipe: Recipe,
    check: Preflight,
) -> Preflight:
    """A split candidate's preflight with its per-host checks (the configured hosts its ranks
    are placed on, probed now); what each host said is kept for the evidence."""
    checks, probes = preflight_hosts(
        c.config.distributed,
        manifest,
        variant,
        recipe,
        c.loaded.policy.service.memory_budget_fraction,
        sys.executable,
    )
    kept = read_optional(c.files.distributed, DistributedEvidence) or DistributedEvidence()
    seen = {p.name for p in kept.hosts}
    kept.hosts.extend(p for p in probes if p.name not in seen)
    write_model(c.files.distributed, kept)
    failed = [f"{x.name}: {x.detail}" for x in checks if not x.passed]
    c.journal(
        CycleState.PREFLIGHT,
        f"hosts of {candidate}: " + ("; ".join(failed) if failed else "every check passed"),
        candidate=candidate,
        hosts=[x.model_dump(mode="json") for x in checks],
    )
    merged = [*check.checks, *checks]
    return check.model_copy(update={"checks": merged, "passed": all(x.passed for x in merged)})


def prepare_step(c: CycleContext) -> CycleResult | None:
    """Journal the resolved recipes; a candidate whose artifacts are missing is not measured."""
    c.journal(
        CycleState.PREPARE,
        "artifacts resolved",
        recipes={name: r.model_dump(mode="json") for name, r in c.recipes.items()},
    )
    keep_runtime_locks(c.home, c.files.root, [c.live, *c.recipes.values()])
    for candidate, recipe in c.recipes.items():
        missing = [p for p in (recipe.model_path, recipe.draft_path) if p and not Path(p).exists()]
        if missing and candidate not in c.runs:
            c.runs[candidate] = not_started(
                candidate, recipe, f"artifact missing: {', '.join(missing)}"
            )
    return None


def baseline_step(c: CycleContext) -> CycleResult | None:
    """The live service measured once: a sanity check that it answers, never an input to
    selection; the environment is fingerprinted beside it."""
    c.journal(
        CycleState.BASELINE,
        "measuring the live service once (a sanity check; selection "
        "uses fresh starts of its recipe)",
        recipe=c.live.candidate_id,
    )
    c.record = service_record(c.home)
    base_url = backend_url(c.record) if c.record else f"http://{c.config.host}:{c.config.port}"
    began = c.clock()
    live_run = measure_live(base_url, c.live, c.plan, c.record)
    c.baseline_s = c.clock() - began
    write_model(c.files.runs / "live--baseline.json", live_run)
    broken = [s.error for s in live_run.samples if s.error]
    if broken:
        raise RuntimeError(f"the live service failed while its baseline was measured: {broken[0]}")
    write_model(c.files.environment, fingerprint_environment([c.live, *c.recipes.values()]))
    if live_request_count(c.home) is not None:  # no front: live traffic is unknown

        def count_live() -> int:
            return live_request_count(c.home) or 0

        c.traffic = count_live
    return None


def maintenance_step(c: CycleContext) -> CycleResult | None:
    """Decide whether candidates run beside the live backend or alone (exclusive: the front
    holds requests), say what it costs the service, and hold it if exclusive."""
    todo = c.todo()
    admission = impact.plan_admission(
        c.home, c.loaded.policy, c.record, [a for a in c.admitted if a.candidate in todo]
    )
    c.exclusive = admission.mode == "exclusive" and bool(todo)
    protocol = c.plan.protocol
    expected = expected_downtime_s(
        admission.mode if todo else "concurrent",
        candidates=len(todo),
        per_candidate_s=c.baseline_s,
        load_s=(c.record.ready_s if c.record and c.record.ready_s else protocol.ready_timeout_s),
    )
    impact.decided(c.home, c.cycle_id, admission, expected)
    c.journal(
        CycleState.MAINTENANCE,
        impact.downtime_words(
            "exclusive" if c.exclusive else "concurrent",
            expected,
            c.loaded.policy.service.max_hold_s,
        ),
        mode=admission.mode,
        mode_reason=admission.reason,
        expected_downtime_s=expected,
        configurations=[BASELINE_ID, *todo],
        min_starts=protocol.min_starts,
        max_starts=protocol.max_starts,
    )
    if c.exclusive:
        try:
            hold_live(
                c.home, c.config, reason=f"cycle {c.cycle_id}: candidates run alone (exclusive)"
            )
        except ServiceError as exc:  # the live backend was not stopped: nothing runs alone
            reason = f"no candidate was measured: the front did not hold requests ({exc})"
            c.journal(CycleState.ROLLBACK, reason, step=JournalStep.ENTER)
            return CycleResult(restore(c.home, c.journal, reason), None, reason)
    return None


def experiment_step(c: CycleContext) -> CycleResult | None:
    """Interleaved rounds of fresh starts (``rounds.run_rounds``), written to disk after each
    round so a killed cycle leaves what it measured; the live recipe serves again after an
    exclusive experiment."""
    todo = c.todo()

    def keep_runs(base: CandidateRun, measured: list[CandidateRun]) -> None:
        write_model(c.files.run(BASELINE_ID), _as_served(base, c.live))
        for run in measured:
            write_model(c.files.run(run.candidate), _as_served(run, c.recipes[run.candidate]))

    baseline, measured = run_rounds(
        c.bench(),
        c.live,
        {name: c.recipes[name] for name in todo},
        deadline=c.deadline,
        on_round=keep_runs,
    )
    c.baseline = _as_served(baseline, c.live)
    for name, run in measured.items():
        c.runs[name] = _as_served(run, c.recipes[name])
    if c.exclusive:  # the live recipe serves again before anything else is measured or promoted
        ensure_serving(c.home, c.live, c.config, timeout=c.plan.protocol.ready_timeout_s)
    return None


def drift_step(c: CycleContext) -> CycleResult | None:
    """With the policy's drift check on, the baseline once more after the experiments."""
    if not c.plan.protocol.drift_check or c.baseline is None:
        return None
    c.journal(
        CycleState.SELECT,
        "re-measuring the baseline for drift in a fresh start",
        step=JournalStep.DRIFT,
    )
    rounds = max((r.round for r in c.baseline.rounds), default=-1) + 1
    c.baseline = measure_drift(c.bench(), c.live, c.baseline, rounds)
    return None


def select_step(c: CycleContext) -> CycleResult | None:
    """The selector on every run, by the frozen thresholds; a decisive workload cell the winner
    loses keeps the baseline."""
    assert c.baseline is not None, "experiment_step measures the baseline"
    protocol = c.plan.protocol
    c.baseline, c.runs = annotate_cells(c.baseline, c.runs, protocol)
    write_model(c.files.run(BASELINE_ID), c.baseline)
    for candidate, run in c.runs.items():  # candidates that never started are recorded too
        write_model(c.files.run(candidate), run)
    c.journal(CycleState.SELECT, "selecting by the frozen thresholds")
    c.verdict, losses = decide_cycle(
        c.baseline,
        c.runs,
        c.plan,
        screened=screens(c.plan),
        busy_line=busy_fraction(c.loaded.policy.service),
    )
    write_model(c.files.verdict, c.verdict)
    if c.verdict.selected is None:
        reason = c.verdict.reason + _workload_words(c.runs, c.plan)
        reason += open_verdict_words(
            c.verdict, [c.baseline, *c.runs.values()], c.loaded.policy.service.quiet_cpu_fraction
        )
        if not is_serving(c.home, c.live, c.config):  # the live server died during the cycle
            reason = f"{reason}; the live service stopped answering during the cycle"
            c.journal(
                CycleState.ROLLBACK,
                "the live service is down; restoring it",
                step=JournalStep.ENTER,
            )
            return CycleResult(restore(c.home, c.journal, reason), None, reason)
        return CycleResult(Outcome.KEPT_BASELINE, None, reason)
    if losses:
        reason = (
            f"{c.verdict.selected} was selected on its speed, but the baseline is kept: "
            + "; ".join(describe_cell(f) for f in losses)
            + ", a decisive condition of this policy's workload"
        )
        c.journal(
            CycleState.SELECT, reason, step=JournalStep.WORKLOAD, candidate=c.verdict.selected
        )
        return CycleResult(Outcome.KEPT_BASELINE, None, reason)
    return None


def confirm_step(c: CycleContext) -> CycleResult | None:
    """The winner and the baseline on held-out prompts, each in a fresh start: the gain must be
    confirmed there (``confirm.heldout_check``)."""
    assert c.verdict is not None and c.verdict.selected is not None
    selected = c.verdict.selected
    c.journal(
        CycleState.SELECT,
        f"checking {selected} on held-out prompts",
        step=JournalStep.HELDOUT,
        candidate=selected,
    )
    held = heldout_check(c.bench(), c.live, c.recipes[selected])
    write_model(c.files.runs / "heldout--baseline.json", held.baseline)
    write_model(c.files.runs / f"heldout--{file_safe(selected)}.json", held.winner)
    c.journal(
        CycleState.SELECT,
        held.reason[:1000],
        step=JournalStep.HELDOUT_PASSED if held.passed else JournalStep.HELDOUT_FAILED,
        candidate=selected,
    )
    if held.passed:
        return None
    reason = held.reason
    if held.verdict is not None:  # left open on a busy machine: say how busy it was
        quiet = c.loaded.policy.service.quiet_cpu_fraction
        reason += open_verdict_words(
            held.verdict, [held.baseline, held.winner], quiet, heldout=True
        )
    return CycleResult(Outcome.KEPT_BASELINE, None, reason)


def promote_step(c: CycleContext) -> CycleResult | None:
    """Promote the confirmed winner (``promote``: start, verify, switch, or roll back)."""
    assert c.verdict is not None and c.verdict.selected is not None
    selected = c.verdict.selected
    usage.snapshot_service(c.home.cycle_dir(c.cycle_id), c.home)  # before the port restarts
    winner = Promotion(
        c.recipes[selected],
        c.runs[selected],
        c.verdict,
        selected_speedup_pct(c.verdict, selected),
    )
    result = promote(c.home, c.config, c.plan, c.journal, c.live, winner)
    if result.outcome == Outcome.PROMOTED:
        result = result._replace(
            reason=result.reason
            + _workload_words({selected: c.runs[selected]}, c.plan, reported=True)
        )
    return result


STEPS: tuple[tuple[str, Step], ...] = (
    ("preflight", preflight_step),
    ("prepare", prepare_step),
    ("baseline", baseline_step),
    ("maintenance", maintenance_step),
    ("experiment", experiment_step),
    ("drift", drift_step),
    ("select", select_step),
    ("confirm", confirm_step),
    ("promote", promote_step),
)
"""The cycle, in order. Every step after the experiment checks the time budget first."""

PAST_BUDGET: dict[str, str] = {"drift": "skip", "confirm": "end", "promote": "end"}
"""What a spent time budget does to a step: the drift re-measure is skipped (selection is cheap
and still runs, so a decision the rounds reached is recorded, not thrown away); the held-out
check and the promotion are not started and the baseline is kept."""


def run_steps(c: CycleContext, steps: Sequence[tuple[str, Step]] = STEPS) -> CycleResult:
    """Run the steps in order until one ends the cycle. A step that would start past the
    cycle's time budget is skipped or ends the cycle (``PAST_BUDGET``), saying where the time
    ran out."""
    for name, step in steps:
        if name in PAST_BUDGET and c.clock() > c.deadline:
            spent = (
                f"the cycle's time budget ({c.loaded.policy.budgets.cycle_minutes:g} min) ran "
                f"out before the {name} step"
            )
            if PAST_BUDGET[name] == "skip":
                c.journal(CycleState.SELECT, f"{spent}; it is skipped", step=JournalStep.NOTE)
                continue
            reason = f"{spent}; the baseline is kept"
            c.journal(CycleState.SELECT, reason, step=JournalStep.NOTE)
            return CycleResult(Outcome.KEPT_BASELINE, None, reason)
        result = step(c)
        if result is not None:
            return result
    raise AssertionError("the promote step always ends the cycle")


def _as_served(run: CandidateRun, recipe: Recipe) -> CandidateRun:
    """A measured run with the knobs, semantics and cache note of the recipe it served."""
    return run.model_copy(
        update={
            "knobs": recipe.knobs,
            "semantics": recipe.semantics,
            "cache_note": cache_note(recipe),
        }
    )


def _workload_words(runs: dict[str, CandidateRun], plan: FrozenPlan, reported: bool = False) -> str:
    """What the candidates do in the workload's other conditions, in words: for a winner its
    reported cells (e.g. 4 concurrent requests under a single-user policy), for candidates that
    were not selected the decisive cells where they lost."""
    parts = []
    for name, run in runs.items():
        if reported:
            cells = [f for f in run.cells if f.role == "reported" and f.requests]
            if cells:
                parts.append(
                    f"reported, not decisive under this policy: {name} "
                    + "; ".join(describe_cell(f) for f in cells)
                )
        else:
            cells = cell_regressions(run.cells, plan.thresholds)
            if cells:
                parts.append(
                    f"{name} loses where this policy's workload is decisive: "
                    + "; ".join(describe_cell(f) for f in cells)
                )
    return "".join(f"; {p}" for p in parts)


def not_started(candidate: str, recipe: Recipe, why: str) -> CandidateRun:
    """A candidate refused before measurement, recorded with its recipe's class and knobs."""
    return CandidateRun(
        candidate=candidate,
        started=False,
        start_error=why,
        candidate_class=recipe.candidate_class,
        semantics=recipe.semantics,
        knobs=recipe.knobs,
    )


# ---------------------------------------------------------------------------------------------
# Promotion (the cycle's last step, and a person's approval)
# ---------------------------------------------------------------------------------------------


class Promotion(NamedTuple):
    """What is promoted: the winner's recipe, its measured run, the verdict and its gain."""

    recipe: Recipe
    run: CandidateRun
    verdict: Verdict
    speedup_pct: float | None


def promote(
    home: Home,
    config: ServiceConfig,
    plan: FrozenPlan,
    journal: Journal,
    live: Recipe,
    promotion: Promotion,
) -> CycleResult:
    """Start the winner on its own port, verify it there, then switch the front to it and drain
    the old backend; roll back on any failure. If the two do not fit in memory together
    (measured peak of the winner + measured footprint of the live backend against the policy's
    budget), the front holds requests while the old backend stops and the winner loads
    (exclusive). Used by the cycle and by a person's approval."""
    winner, run = promotion.recipe, promotion.run
    policy = service_policy(home)
    live_record = service_record(home)
    fit = admit(
        run.peak_memory_gb,
        impact.footprint_gb(live_record),
        psutil.virtual_memory().total / 2**30,
        policy.memory_budget_fraction,
        peak_source="measured in this cycle",
        live_source="measured RSS",
    )
    exclusive = fit.mode == "exclusive" and live_record is not None
    impact.promotion(home, journal.cycle_id, fit)
    journal(
        CycleState.PROMOTE,
        f"starting {winner.candidate_id} on its own port "
        f"({'exclusive: the front holds requests' if exclusive else 'beside the live one'})",
        step=JournalStep.ENTER,
        recipe=winner.model_dump(mode="json"),
        previous=live.candidate_id,
        mode=fit.mode,
        mode_reason=fit.reason,
    )
    if stable_port_held_by_stranger(home, config):
        reason = (
            f"port {config.port} is held by a process mcp-infra did not start; "
            "promotion refused, nothing was touched"
        )
        journal(CycleState.ROLLBACK, reason, step=JournalStep.ENTER)
        return rolled_back(home, journal, reason)
    if exclusive:
        try:
            hold_live(home, config, reason=f"exclusive promotion of {winner.candidate_id}")
        except ServiceError as exc:  # the live backend was not stopped, the winner not started
            reason = (
                f"{winner.candidate_id} was not started: the front did not hold requests ({exc})"
            )
            journal(CycleState.ROLLBACK, reason, step=JournalStep.ENTER)
            return rolled_back(home, journal, reason)
    try:
        new = start_backend(
            home,
            winner,
            role="backend",
            log=home.logs / f"backend-{file_safe(winner.candidate_id)}.log",
            cycle_id=journal.cycle_id,
            timeout=plan.protocol.ready_timeout_s,
        )
    except ServerUnavailable as exc:
        reason = f"the winner did not start: {str(exc)[:300]}"
        journal(CycleState.ROLLBACK, reason, step=JournalStep.ENTER)
        return rolled_back(home, journal, reason)
    return _verify_and_switch(home, config, plan, journal, live, promotion, new)


# promote's second half, split off to keep each readable: promote's arguments and the winner.
def _verify_and_switch(
    home: Home,
    config: ServiceConfig,
    plan: FrozenPlan,
    journal: Journal,
    live: Recipe,
    promotion: Promotion,
    new: ProcessRecord,
) -> CycleResult:
    """The started winner checked on its own port, then committed and switched to."""
    winner = promotion.recipe
    journal(
        CycleState.VERIFY,
        f"checking {winner.candidate_id} on its own port before the switch",
        step=JournalStep.ENTER,
        port=new.port,
    )
    failure = verify_online(home, config, plan, winner, promotion.run, base_url=backend_url(new))
    if failure:
        journal(CycleState.VERIFY, failure, step=JournalStep.FAILED)
        journal(
            CycleState.ROLLBACK,
            "verification failed; the previous recipe keeps serving",
            step=JournalStep.ENTER,
        )
        return rolled_back(home, journal, failure)
    journal(
        CycleState.VERIFY,
        "the winner reproduces the measured greedy outputs",
        step=JournalStep.PASSED,
    )
    journal(CycleState.COMMIT, f"{winner.candidate_id} is the live recipe; switching the front")
    try:  # the old backend stops only once the front confirms the new route
        switched = adopt(home, new, config, reason=f"promoted {winner.candidate_id}")
    except SwitchFailed as exc:
        reason = f"the front did not take the new route: {str(exc)[:300]}"
        journal(CycleState.ROLLBACK, reason, step=JournalStep.ENTER, serving=exc.serving)
        if exc.serving == live.candidate_id:
            journal(
                CycleState.ROLLBACK, f"{live.candidate_id} serves as before", step=JournalStep.DONE
            )
            return CycleResult(Outcome.ROLLED_BACK, None, f"{reason}; {live.candidate_id} serves")
        return rolled_back(home, journal, reason)
    commit(home, live, winner)  # after the switch: recovery keeps a journaled COMMIT either way
    journal(
        CycleState.COMMIT,
        f"front switched to {winner.candidate_id} ({switched})",
        step=JournalStep.SWITCHED,
    )
    return CycleResult(
        Outcome.PROMOTED, winner.candidate_id, promotion.verdict.reason, promotion.speedup_pct
    )


def commit(home: Home, previous: Recipe, winner: Recipe) -> None:
    write_model(home.previous_file, previous)
    write_model(home.active_file, winner)


def verify_online(
    home: Home,
    config: ServiceConfig,
    plan: FrozenPlan,
    winner: Recipe,
    run: CandidateRun,
    *,
    base_url: str | None = None,
) -> str | None:
    """Gates again on the server about to serve (its own port, before the front switches to
    it): the same greedy outputs as measured, no smoke failure."""
    base_url = base_url or f"http://{config.host}:{config.port}"
    suite = load_suite(plan.protocol.suite)
    online = [
        bench.greedy_chat(
            base_url,
            p.chat_messages(),
            max_tokens=p.token_budget(plan.protocol.max_tokens),
            timeout=plan.protocol.request_timeout_s,
            candidate=winner.candidate_id,
            prompt_id=p.id,
            phase="verify",
        )
        for p in suite.prompts
        if p.id in {s.prompt_id for s in run.greedy}
    ]
    _keep_online(home, winner, online)
    errors = [s for s in online if s.error]
    if errors:
        return f"verification request failed: {errors[0].error}"
    gate = compare_greedy(run.greedy, online)
    if not gate.passed:
        return f"online greedy output differs from the measured one: {gate.detail}"
    measured = {s.prompt_id: s for s in run.greedy}
    for sample in online:
        new = [
            f
            for f in smoke_failures(sample.text)
            if f not in smoke_failures(measured[sample.prompt_id].text)
        ]
        if new:
            return f"smoke check failed online on {sample.prompt_id}: {new[0]}"
    return None


def rolled_back(home: Home, journal: Journal, reason: str) -> CycleResult:
    """A promotion that did not hold: the previous recipe serves again (or an operator is
    needed), and the reason says why."""
    return CycleResult(restore(home, journal, reason, outcome=Outcome.ROLLED_BACK), None, reason)


def _keep_online(home: Home, winner: Recipe, online: list[Sample]) -> None:
    """Keep the online check's samples in the cycle folder (sealed into the bundle)."""
    with contextlib.suppress(OSError, ValueError, CorruptFile):  # the verdict never waits on it
        current = read_optional(home.current_file, CurrentCycle)  # the journaled cycle
        if current is not None:
            write_model(
                home.cycle_dir(current.cycle_id) / "online.json",
                CandidateRun(
                    candidate=winner.candidate_id,
                    samples=online,
                    knobs=winner.knobs,
                    semantics=winner.semantics,
                ),
            )


def restore(
    home: Home, journal: Journal, reason: str, outcome: Outcome = Outcome.RESTORED_AFTER_ERROR
) -> Outcome:
    """Stop stray candidates and bring the stable port back to the active recipe."""
    stopped = stop_stray_candidates(home)
    config = load_config(home)
    recipe = active_recipe(home)
    try:
        done = ensure_serving(home, recipe, config)
    except ServerUnavailable as exc:
        message = f"restoring {recipe.candidate_id} failed: {str(exc)[:300]}"
        journal.quietly(CycleState.ROLLBACK, message, step=JournalStep.FAILED, stopped=stopped)
        mark_needs_operator(home, journal.cycle_id, f"{reason}; {message}")
        return Outcome.NEEDS_OPERATOR
    journal.quietly(
        CycleState.ROLLBACK,
        f"{recipe.candidate_id} serves again ({done})",
        step=JournalStep.DONE,
        stopped=stopped,
    )
    return outcome


def conclude(
    home: Home,
    plan: FrozenPlan,
    cycle_id: str,
    journal: Journal,
    started: datetime,
    result: CycleResult,
    *,
    interrupted: bool = False,
    recovery: str | None = None,
) -> CycleSummary:
    """Journal the outcome, seal the evidence bundle, then remember the outcomes (recipe memory
    never fails a sealed cycle)."""
    outcome, selected, reason, speedup = result
    journal(
        CycleState.SEALED,
        f"outcome: {outcome.value}",
        step=JournalStep.ENTER,
        outcome=outcome.value,
        selected=selected,
        reason=reason,
        speedup_pct=speedup,
    )
    try:  # what the stable endpoint's clients saw; never fails a cycle
        impact.finish(home, cycle_id)
    except Exception as exc:
        with contextlib.suppress(OSError):
            journal(
                CycleState.SEALED,
                f"service impact not recorded: {type(exc).__name__}",
                step=JournalStep.NOTE,
            )
    summary = CycleSummary(
        cycle_id=cycle_id,
        plan_id=plan.plan_id,
        started_at=started,
        ended_at=utcnow(),
        outcome=outcome,
        selected=selected,
        speedup_pct=speedup,
        reason=reason,
        active_recipe=active_recipe(home).candidate_id,
        interrupted=interrupted,
        recovery=recovery,
    )
    created = signing.create_key_if_missing(home)
    if created is not None:  # the first seal: the fingerprint to publish, journaled in the bundle
        journal(
            CycleState.SEALED,
            f"new evidence signing key {signing.short_fingerprint(created)}; publish the full "
            f"fingerprint and verify with: {signing.verify_command(cycle_id, created)}",
            step=JournalStep.NOTE,
            fingerprint=created,
        )
    evidence.seal(home, cycle_id, summary, usage.cycle_cost(home, cycle_id, speedup))
    journal(CycleState.SEALED, "evidence sealed", step=JournalStep.DONE)
    try:  # recipe memory is derived from the sealed bundle; it never fails a sealed cycle
        memory.record(home, cycle_id)
    except Exception as exc:
        with contextlib.suppress(OSError):
            journal(
                CycleState.SEALED,
                f"recipe memory not recorded: {type(exc).__name__}: "
                f"{str(exc)[:200]} (it is read from the bundle instead)",
                step=JournalStep.NOTE,
            )
    return summary


# ---------------------------------------------------------------------------------------------
# Supervisor
# ---------------------------------------------------------------------------------------------


def recover(home: Home) -> list[str]:
    """Finish or undo every unfinished cycle, by ``recovery.decide`` on its journal."""
    notes: list[str] = []
    if not home.cycles.is_dir():
        return notes
    for cdir in sorted(p for p in home.cycles.iterdir() if p.is_dir()):
        cycle_id = cdir.name
        if (home.bundle_files(cycle_id).manifest).exists():
            continue
        events, problems = home.read_journal(cycle_id)
        decision = decide(events)
        if decision.action == Action.NOTHING and not events:
            continue
        journal = Journal(home, cycle_id)
        plan = read_optional(CycleFiles(cdir).plan, FrozenPlan)
        journal(
            CycleState.RECOVER,
            decision.reason,
            action=decision.action.value,
            last_state=decision.last_state.value if decision.last_state else None,
            journal_problems=problems,
        )
        outcome = decision.outcome or Outcome.RESTORED_AFTER_ERROR
        selected, reason, speedup = None, decision.reason, None
        if decision.action == Action.KEEP_PROMOTION and decision.promoted_recipe:
            winner = Recipe.model_validate(decision.promoted_recipe)
            live = active_recipe(home)
            if live.key() != winner.key():
                commit(home, live, winner)
            selected = winner.candidate_id
            outcome = restore(home, journal, decision.reason, outcome=Outcome.PROMOTED)
        elif decision.action in (Action.RESTORE_PREVIOUS, Action.FINISH_SEALING):
            outcome = restore(home, journal, decision.reason, outcome=outcome)
        finishing = decision.action == Action.FINISH_SEALING and decision.decided
        if finishing and outcome == decision.outcome and decision.decided:
            # what the cycle decided is sealed, with how it came to be sealed
            selected = decision.decided.get("selected")
            speedup = decision.decided.get("speedup_pct")
            decided_reason = decision.decided.get("reason")
            if decided_reason:
                reason = f"{decided_reason} (sealed by recovery: {decision.reason})"
        if plan is None:
            notes.append(f"{cycle_id}: no readable plan; journal kept as is")
            continue
        conclude(
            home,
            plan,
            cycle_id,
            journal,
            events[0].ts if events else utcnow(),
            CycleResult(outcome, selected, reason, speedup),
            interrupted=True,
            recovery=decision.action.value,
        )
        _retire_queue_entries(home, plan.plan_id)  # an interrupted plan is never silently re-run
        notes.append(f"{cycle_id}: {decision.action.value} → {outcome.value}")
    return notes


def _retire_queue_entries(home: Home, plan_id: str) -> None:
    for entry in home.queued():
        if entry.stem.endswith(plan_id):
            home.retire(entry)


def failed_attempts(home: Home, plan_id: str) -> int:
    """Cycles of this plan that ended by an error (not by a decision), from sealed evidence."""
    return sum(
        1
        for s in evidence.list_cycles(home)
        if s.plan_id == plan_id
        and s.outcome == Outcome.RESTORED_AFTER_ERROR
        and s.reason.startswith("cycle failed")
    )


def _maybe_retry(home: Home, plan: FrozenPlan, summary: CycleSummary) -> None:
    """Re-queue a plan whose cycle failed by error, a bounded number of times, with backoff."""
    if summary.outcome != Outcome.RESTORED_AFTER_ERROR or not summary.reason.startswith(
        "cycle failed"
    ):
        return
    budgets = HomeContext(home).policy.budgets
    attempts = failed_attempts(home, plan.plan_id)
    if attempts > budgets.retries:
        return
    time.sleep(budgets.retry_backoff_s * 2 ** (attempts - 1))
    home.enqueue(plan)


@contextmanager
def supervising(home: Home) -> Iterator[None]:
    with home.supervisor_lock():
        write_model(home.supervisor_file, _supervisor_record(None))
        try:
            yield
        finally:
            (home.supervisor_file).unlink(missing_ok=True)
            (home.current_file).unlink(missing_ok=True)


def supervise(home: Home, *, ignore_window: bool = False) -> list[CycleSummary]:
    """Recover, then run every queued plan in order; return when the queue is empty, or when
    the policy's maintenance window does not let the next cycle start and finish in time
    (``window.window_state``; the plan stays queued). ``ignore_window``: an operator's override."""
    home.ensure()
    summaries: list[CycleSummary] = []
    with supervising(home):
        recover(home)
        _revive_front(home)
        while True:
            if (home.needs_operator_file).exists():
                break
            queued = home.queued()
            if not queued:
                break
            if not ignore_window and not window_state(home).may_start:
                break  # the plan waits in the queue for the window
            entry = queued[0]
            plan = read_model(entry, FrozenPlan)
            try:
                summary = run_cycle(home, plan)
            finally:
                home.retire(entry)
            summaries.append(summary)
            _maybe_retry(home, plan, summary)
    return summaries


def _revive_front(home: Home) -> None:
    """A front that was started and died (its record remains) is restarted, and the route put
    back on the live backend; a service stopped on purpose (no record) stays stopped."""
    from mcp_infra.procs.front import front_record, front_running

    if front_record(home) is None or front_running(home):
        return
    with contextlib.suppress(ServerStartError, PortBusy, ServiceError, OSError, RuntimeError):
        ensure_serving(home, active_recipe(home), load_config(home))


def operator_recover(home: Home) -> list[str]:
    """`mcp-infra recover`: recover unfinished cycles, then clear needs-operator if the live
    recipe can be served again."""
    home.ensure()
    notes: list[str] = []
    with supervising(home):
        notes += recover(home)
        marker = home.needs_operator_file
        stopped = stop_stray_candidates(home)
        notes += [f"stopped stray candidate {s}" for s in stopped]
        live = active_recipe(home)
        try:
            done = ensure_serving(home, live, load_config(home))
        except ServerUnavailable as exc:
            notes.append(f"still needs an operator: {exc}")
            if not marker.exists():
                mark_needs_operator(home, "recover", str(exc))
            return notes
        notes.append(f"live recipe {live.candidate_id} serves ({done})")
        if marker.exists():
            marker.unlink()
            notes.append("needs-operator cleared")
    return notes
