"""How a cycle ends: the winner promoted (started on its own port, verified online, the front
switched to it) or rolled back, the live recipe restored after a failure, and the outcome sealed
into the evidence bundle (``conclude``). Used by the cycle and by a person's approval.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import NamedTuple

import psutil

from mcp_infra.contracts import (
    CandidateRun,
    CurrentCycle,
    CycleState,
    CycleSummary,
    FrozenPlan,
    JournalStep,
    Outcome,
    PlanCost,
    ProcessRecord,
    Recipe,
    Sample,
    ServiceConfig,
    Verdict,
)
from mcp_infra.core.admission import admit
from mcp_infra.core.gates import compare_greedy, smoke_failures
from mcp_infra.errors import ServerUnavailable
from mcp_infra.flows import impact
from mcp_infra.flows.journal import Journal
from mcp_infra.flows.status import cost_sidecar
from mcp_infra.procs import bench, usage
from mcp_infra.procs.service import (
    ServiceError,
    SwitchFailed,
    adopt,
    backend_url,
    ensure_serving,
    hold_live,
    service_policy,
    stable_port_held_by_stranger,
    start_backend,
    stop_stray_candidates,
)
from mcp_infra.state import evidence, memory, signing
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.context import (
    active_recipe,
    load_config,
    mark_needs_operator,
    service_record,
)
from mcp_infra.state.store import (
    CorruptFile,
    Home,
    file_safe,
    read_optional,
    utcnow,
    write_model,
)


class CycleResult(NamedTuple):
    """How a cycle (or an approval) ended, before it is sealed."""

    outcome: Outcome
    selected: str | None
    reason: str
    speedup_pct: float | None = None


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
    cost = usage.cycle_cost(home, cycle_id, speedup)
    if cost is not None:
        with contextlib.suppress(CorruptFile, OSError):
            projected = read_optional(cost_sidecar(home, plan.plan_id), PlanCost)
            cost = cost.model_copy(update={"projected": projected})
    evidence.seal(home, cycle_id, summary, cost)
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
