"""The supervisor: one optimization cycle, read top to bottom.

QUEUED → PREFLIGHT → PREPARE → BASELINE → MAINTENANCE → EXPERIMENT(each) → SELECT → PROMOTE →
VERIFY → COMMIT | ROLLBACK → SEALED. Each state is journaled (fsync) before its side effect, so
``recovery.decide`` can always tell what a killed cycle had done. Decisions are made by the pure
core (policy, selector, recovery); this module only sequences I/O around them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    Event,
    FrozenPlan,
    NeedsOperatorRecord,
    Outcome,
    Recipe,
    Sample,
    ServiceConfig,
    SupervisorRecord,
    Verdict,
)
from mcp_infra.core.admission import admit, expected_downtime_s
from mcp_infra.core.gates import compare_greedy, smoke_failures
from mcp_infra.core.preflight import find_candidate, preflight
from mcp_infra.core.recovery import Action, decide
from mcp_infra.core.selector import select
from mcp_infra.core.units import selected_speedup_pct
from mcp_infra.core.workload import cell_regressions, decisive_view, describe_cell
from mcp_infra.errors import McpInfraError, ServerUnavailable
from mcp_infra.flows import impact
from mcp_infra.flows.measure import (
    annotate_cells,
    heldout_check,
    measure_drift,
    measure_live,
    run_rounds,
)
from mcp_infra.procs import bench, usage
from mcp_infra.procs.front import live_request_count
from mcp_infra.procs.runtime import PortBusy, ServerStartError
from mcp_infra.procs.service import (
    ServiceError,
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
from mcp_infra.state import evidence, memory
from mcp_infra.state.artifacts import HubError, resolve_recipe
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.context import (
    HomeContext,
    active_recipe,
    load_config,
    service_record,
    window_state,
)
from mcp_infra.state.hostfacts import fingerprint_environment, folder_fingerprint
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

    def __call__(self, state: CycleState, message: str, **fields: Any) -> None:
        """Append the event (fsynced) first; then, if asked to, pause here for fault injection."""
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
        step = str(fields.get("step", "enter"))
        pause = os.environ.get(PAUSE_ENV)
        if pause and (pause == f"{state.value}:{step}" or (pause, step) == (state.value, "enter")):
            marker = self.home.state / f"paused-at-{pause.replace(':', '-')}"
            marker.write_text(f"{os.getpid()}\n")
            while True:  # a seam for tests and operators: wait here until killed
                time.sleep(3600)


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
# Environment
# ---------------------------------------------------------------------------------------------


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
        result = _run(home, plan, cycle_id, journal)
    except NeedsOperator as exc:
        result = CycleResult(Outcome.NEEDS_OPERATOR, None, str(exc))
    except Exception as exc:  # any unexpected failure: restore, then account for it
        result = restore_after_error(home, journal, exc)
    try:
        return seal(home, plan, cycle_id, journal, started, result)
    except OSError as exc:
        raise _seal_failed(home, journal, exc) from exc


def restore_after_error(home: Home, journal: Journal, exc: Exception) -> CycleResult:
    """An unexpected failure: journal it, bring the live recipe back, and say so."""
    reason = f"cycle failed: {type(exc).__name__}: {str(exc)[:300]}"
    journal(
        CycleState.ROLLBACK,
        "unexpected error; restoring the live recipe",
        step="enter",
        error=reason,
    )
    return CycleResult(restore(home, journal, reason), None, reason)


class SealFailed(McpInfraError, RuntimeError):
    """Evidence could not be written (disk full, read-only home); the service stays restored and
    the next supervisor start finishes sealing."""


def _seal_failed(home: Home, journal: Journal, exc: OSError) -> SealFailed:
    message = f"sealing the evidence failed: {type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):
        journal(CycleState.SEALED, message, step="failed")
    try:
        served = ensure_serving(home, active_recipe(home), load_config(home))
        message += f"; the live recipe serves ({served}); `mcp-infra recover` finishes sealing"
    except (ServerUnavailable, OSError) as restore_error:
        message += f"; restoring the live recipe failed too: {restore_error}"
        with contextlib.suppress(OSError):
            mark_needs_operator(home, journal.cycle_id, message)
    return SealFailed(message)


def _run(home: Home, plan: FrozenPlan, cycle_id: str, journal: Journal) -> CycleResult:
    ctx = HomeContext(home)
    config, policy = ctx.config, ctx.policy
    deadline = time.monotonic() + policy.budgets.cycle_minutes * 60
    journal(CycleState.PREFLIGHT, "checking candidates and the live service")
    if stable_port_held_by_stranger(home, config):
        return CycleResult(
            Outcome.REFUSED,
            None,
            f"port {config.port} is held by a process "
            "mcp-infra did not start; refusing to touch it",
        )
    manifests, facts, live = ctx.manifests, ctx.facts, ctx.live
    try:
        ensure_serving(home, live, config, timeout=plan.protocol.ready_timeout_s)
    except ServerUnavailable as exc:
        raise NeedsOperator(f"the live recipe could not be started: {exc}") from exc
    impact.begin(home, cycle_id)
    admitted: list[tuple[str, Any, Any]] = []
    runs: dict[str, CandidateRun] = {}
    recipes: dict[str, Recipe] = {}
    for candidate in plan.candidates[1:]:
        found = find_candidate(manifests, candidate)
        if found is None:
            runs[candidate] = CandidateRun(
                candidate=candidate, started=False, start_error="no longer in the registry"
            )
            continue
        manifest, variant = found
        admitted.append((candidate, manifest, variant))
        check = preflight(manifest, variant, policy, facts)
        try:
            recipe = resolve_recipe(
                manifest, variant, home.models, home.hf_cache, fingerprint=folder_fingerprint
            )
        except HubError as exc:  # a tampered artifact refuses this candidate, not the cycle
            recipe = resolve_recipe(manifest, variant, home.models, home.hf_cache)
            runs[candidate] = _not_started(candidate, recipe, f"artifact check failed: {exc}")
        recipes[candidate] = recipe
        if not check.passed and candidate not in runs:
            runs[candidate] = CandidateRun(
                candidate=candidate,
                started=False,
                candidate_class=recipe.candidate_class,
                semantics=recipe.semantics,
                knobs=recipe.knobs,
                start_error="preflight: " + "; ".join(check.failures()),
            )
    journal(
        CycleState.PREPARE,
        "artifacts resolved",
        recipes={c: r.model_dump(mode="json") for c, r in recipes.items()},
    )
    for candidate, recipe in recipes.items():
        missing = [p for p in (recipe.model_path, recipe.draft_path) if p and not Path(p).exists()]
        if missing and candidate not in runs:
            runs[candidate] = CandidateRun(
                candidate=candidate,
                started=False,
                candidate_class=recipe.candidate_class,
                semantics=recipe.semantics,
                knobs=recipe.knobs,
                start_error=f"artifact missing: {', '.join(missing)}",
            )

    journal(
        CycleState.BASELINE,
        "measuring the live service once (a sanity check; selection "
        "uses fresh starts of its recipe)",
        recipe=live.candidate_id,
    )
    runs_dir = home.cycle_files(cycle_id).runs
    record = service_record(home)
    base_url = backend_url(record) if record else f"http://{config.host}:{config.port}"
    baseline_started = time.monotonic()
    live_run = measure_live(base_url, live, plan, record)
    baseline_s = time.monotonic() - baseline_started
    write_model(runs_dir / "live--baseline.json", live_run)
    broken = [s.error for s in live_run.samples if s.error]
    if broken:
        raise RuntimeError(f"the live service failed while its baseline was measured: {broken[0]}")
    write_model(
        home.cycle_files(cycle_id).environment, fingerprint_environment([live, *recipes.values()])
    )

    todo = [c for c in plan.candidates[1:] if c not in runs]

    def count_live() -> int:
        """Live requests the front has received so far: each round records its overlap."""
        return live_request_count(home) or 0

    traffic = count_live if live_request_count(home) is not None else None  # no front: unknown

    admission = impact.plan_admission(home, policy, record, [a for a in admitted if a[0] in todo])
    exclusive = admission.mode == "exclusive" and bool(todo)
    expected = expected_downtime_s(
        admission.mode if todo else "concurrent",
        candidates=len(todo),
        per_candidate_s=baseline_s,
        load_s=(record.ready_s if record and record.ready_s else plan.protocol.ready_timeout_s),
    )
    impact.decided(home, cycle_id, admission, expected)
    journal(
        CycleState.MAINTENANCE,
        impact.downtime_words(
            "exclusive" if exclusive else "concurrent", expected, policy.service.max_hold_s
        ),
        mode=admission.mode,
        mode_reason=admission.reason,
        expected_downtime_s=expected,
        configurations=[BASELINE_ID, *todo],
        min_starts=plan.protocol.min_starts,
        max_starts=plan.protocol.max_starts,
    )
    if exclusive:
        hold_live(home, config, reason=f"cycle {cycle_id}: candidates run alone (exclusive)")

    def keep_runs(base: CandidateRun, measured: list[CandidateRun]) -> None:
        write_model(
            home.cycle_files(cycle_id).run(BASELINE_ID),
            base.model_copy(
                update={
                    "knobs": live.knobs,
                    "semantics": live.semantics,
                    "cache_note": cache_note(live),
                }
            ),
        )
        for run in measured:
            write_model(
                home.cycle_files(cycle_id).run(run.candidate),
                run.model_copy(update={"cache_note": cache_note(recipes[run.candidate])}),
            )

    baseline, measured = run_rounds(
        home,
        config,
        plan,
        journal,
        live,
        {c: recipes[c] for c in todo},
        deadline=deadline,
        live_traffic=traffic,
        on_round=keep_runs,
    )
    baseline = baseline.model_copy(
        update={"knobs": live.knobs, "semantics": live.semantics, "cache_note": cache_note(live)}
    )
    for candidate, run in measured.items():
        runs[candidate] = run.model_copy(update={"cache_note": cache_note(recipes[candidate])})
    if exclusive:  # the live recipe serves again before anything else is measured or promoted
        ensure_serving(home, live, config, timeout=plan.protocol.ready_timeout_s)
    if plan.protocol.drift_check:
        journal(
            CycleState.SELECT, "re-measuring the baseline for drift in a fresh start", step="drift"
        )
        rounds = max((r.round for r in baseline.rounds), default=-1) + 1
        baseline = measure_drift(
            home, config, plan, journal, live, baseline, rounds, live_traffic=traffic
        )
    baseline, runs = annotate_cells(baseline, runs, plan.protocol)
    write_model(home.cycle_files(cycle_id).run(BASELINE_ID), baseline)
    for candidate, run in runs.items():  # candidates that never started are recorded too
        write_model(home.cycle_files(cycle_id).run(candidate), run)
    journal(CycleState.SELECT, "selecting by the frozen thresholds")
    ordered = [runs[c] for c in plan.candidates[1:] if c in runs]
    verdict = select(
        decisive_view(baseline, plan.protocol),
        [decisive_view(r, plan.protocol) for r in ordered],
        plan.thresholds,
        plan.protocol,
        plan.auto_promote,
    )
    write_model(home.cycle_files(cycle_id).verdict, verdict)
    if verdict.selected is None:
        reason = verdict.reason + _workload_words(runs, plan)
        if not is_serving(home, live, config):  # the live server died during the cycle
            reason = f"{reason}; the live service stopped answering during the cycle"
            journal(CycleState.ROLLBACK, "the live service is down; restoring it", step="enter")
            return CycleResult(restore(home, journal, reason), None, reason)
        return CycleResult(Outcome.KEPT_BASELINE, None, reason)
    winner = recipes[verdict.selected]
    losses = cell_regressions(runs[verdict.selected].cells, plan.thresholds)
    if losses:
        reason = (
            f"{verdict.selected} was selected on its speed, but the baseline is kept: "
            + "; ".join(describe_cell(f) for f in losses)
            + ", a decisive condition of this policy's workload"
        )
        journal(CycleState.SELECT, reason, step="workload", candidate=verdict.selected)
        return CycleResult(Outcome.KEPT_BASELINE, None, reason)
    journal(
        CycleState.SELECT,
        f"checking {verdict.selected} on held-out prompts",
        step="heldout",
        candidate=verdict.selected,
    )
    held = heldout_check(home, config, plan, journal, live, winner, live_traffic=traffic)
    write_model(runs_dir / "heldout--baseline.json", held.baseline)
    write_model(runs_dir / f"heldout--{file_safe(verdict.selected)}.json", held.winner)
    journal(
        CycleState.SELECT,
        held.reason[:1000],
        step="heldout-passed" if held.passed else "heldout-failed",
        candidate=verdict.selected,
    )
    if not held.passed:
        return CycleResult(Outcome.KEPT_BASELINE, None, held.reason)
    speedup = selected_speedup_pct(verdict, verdict.selected)
    usage.snapshot_service(home.cycle_dir(cycle_id), home)  # before the port restarts
    result = promote(
        home, config, plan, journal, live, winner, runs[verdict.selected], speedup, verdict
    )
    if result.outcome == Outcome.PROMOTED:
        result = result._replace(
            reason=result.reason
            + _workload_words({verdict.selected: runs[verdict.selected]}, plan, reported=True)
        )
    return result


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


def _not_started(candidate: str, recipe: Recipe, why: str) -> CandidateRun:
    return CandidateRun(
        candidate=candidate,
        started=False,
        start_error=why,
        candidate_class=recipe.candidate_class,
        semantics=recipe.semantics,
        knobs=recipe.knobs,
    )


def promote(
    home: Home,
    config: ServiceConfig,
    plan: FrozenPlan,
    journal: Journal,
    live: Recipe,
    winner: Recipe,
    run: CandidateRun,
    speedup: float | None,
    verdict: Verdict,
) -> CycleResult:
    """Start the winner on its own port, verify it there, then switch the front to it and drain
    the old backend; roll back on any failure. If the two do not fit in memory together
    (measured peak of the winner + measured footprint of the live backend against the policy's
    budget), the front holds requests while the old backend stops and the winner loads
    (exclusive). Used by the cycle and by a person's approval."""
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
        step="enter",
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
        journal(CycleState.ROLLBACK, reason, step="enter")
        return rolled_back(home, journal, reason)
    try:
        if exclusive:
            hold_live(home, config, reason=f"exclusive promotion of {winner.candidate_id}")
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
        journal(CycleState.ROLLBACK, reason, step="enter")
        return rolled_back(home, journal, reason)
    journal(
        CycleState.VERIFY,
        f"checking {winner.candidate_id} on its own port before the switch",
        step="enter",
        port=new.port,
    )
    failure = verify_online(home, config, plan, winner, run, base_url=backend_url(new))
    if failure:
        journal(CycleState.VERIFY, failure, step="failed")
        journal(
            CycleState.ROLLBACK,
            "verification failed; the previous recipe keeps serving",
            step="enter",
        )
        return rolled_back(home, journal, failure)
    journal(CycleState.VERIFY, "the winner reproduces the measured greedy outputs", step="passed")
    journal(CycleState.COMMIT, f"{winner.candidate_id} is the live recipe; switching the front")
    commit(home, live, winner)
    switched = adopt(home, new, config, reason=f"promoted {winner.candidate_id}")
    journal(
        CycleState.COMMIT, f"front switched to {winner.candidate_id} ({switched})", step="switched"
    )
    return CycleResult(Outcome.PROMOTED, winner.candidate_id, verdict.reason, speedup)


def commit(home: Home, previous: Recipe, winner: Recipe) -> None:
    write_model(home.previous_file, previous)
    write_model(home.active_file, winner)


def verify_online(
    home: Home,
    config: Any,
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
        journal(CycleState.ROLLBACK, message, step="failed", stopped=stopped)
        mark_needs_operator(home, journal.cycle_id, f"{reason}; {message}")
        return Outcome.NEEDS_OPERATOR
    journal(
        CycleState.ROLLBACK,
        f"{recipe.candidate_id} serves again ({done})",
        step="done",
        stopped=stopped,
    )
    return outcome


def mark_needs_operator(home: Home, cycle_id: str, reason: str) -> None:
    write_model(
        home.needs_operator_file, NeedsOperatorRecord(cycle_id=cycle_id, reason=reason, ts=utcnow())
    )


def seal(
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
        step="enter",
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
                CycleState.SEALED, f"service impact not recorded: {type(exc).__name__}", step="note"
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
    evidence.seal(home, cycle_id, summary, usage.cycle_cost(home, cycle_id, speedup))
    journal(CycleState.SEALED, "evidence sealed", step="done")
    try:  # recipe memory is derived from the sealed bundle; it never fails a sealed cycle
        memory.record(home, cycle_id)
    except Exception as exc:
        with contextlib.suppress(OSError):
            journal(
                CycleState.SEALED,
                f"recipe memory not recorded: {type(exc).__name__}: "
                f"{str(exc)[:200]} (it is read from the bundle instead)",
                step="note",
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
        selected = None
        if decision.action == Action.KEEP_PROMOTION and decision.promoted_recipe:
            winner = Recipe.model_validate(decision.promoted_recipe)
            live = active_recipe(home)
            if live.key() != winner.key():
                commit(home, live, winner)
            selected = winner.candidate_id
            outcome = restore(home, journal, decision.reason, outcome=Outcome.PROMOTED)
        elif decision.action in (Action.RESTORE_PREVIOUS, Action.FINISH_SEALING):
            outcome = restore(home, journal, decision.reason, outcome=outcome)
        if plan is None:
            notes.append(f"{cycle_id}: no readable plan; journal kept as is")
            continue
        where = decision.last_state.value if decision.last_state else "?"
        seal(
            home,
            plan,
            cycle_id,
            journal,
            events[0].ts if events else utcnow(),
            CycleResult(outcome, selected, f"interrupted in {where}: {decision.reason}"),
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
