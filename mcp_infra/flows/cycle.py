"""One optimization cycle, read top to bottom: ``run_cycle`` runs the step table (``STEPS``)
over one ``CycleContext``.

QUEUED → PREFLIGHT → PREPARE → BASELINE → MAINTENANCE → EXPERIMENT(each) → SELECT → PROMOTE →
VERIFY → COMMIT | ROLLBACK → SEALED. Each state is journaled (``flows.journal``, fsynced) before
its side effect, so ``recovery.decide`` can always tell what a killed cycle had done. The cycle
ends in ``flows.promotion`` (promote, verify online, roll back, seal); ``flows.supervisor`` runs
cycles from the queue. Decisions are made by the pure core (policy, selector, recovery); this
module only sequences I/O around them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, NamedTuple

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleState,
    CycleSummary,
    DistributedEvidence,
    EnvironmentFingerprint,
    FrozenPlan,
    JournalStep,
    JSONValue,
    Manifest,
    Outcome,
    PlanCost,
    ProcessRecord,
    Recipe,
    ServiceConfig,
    Variant,
    Verdict,
)
from mcp_infra.core.admission import expected_downtime_s
from mcp_infra.core.machine import busy_fraction, open_verdict_words, quiet_rule
from mcp_infra.core.preflight import Preflight, find_candidate, preflight
from mcp_infra.core.screening import screens
from mcp_infra.core.units import selected_speedup_pct
from mcp_infra.core.workload import cell_regressions, describe_cell
from mcp_infra.errors import McpInfraError, ServerUnavailable
from mcp_infra.flows import answers, impact
from mcp_infra.flows.confirm import heldout_check, measure_drift
from mcp_infra.flows.journal import Journal
from mcp_infra.flows.loadwatch import Machine
from mcp_infra.flows.measure import (
    SERVER_START_ERRORS,
    annotate_cells,
    measure_live,
    server_starter,
)
from mcp_infra.flows.own import build_recipes
from mcp_infra.flows.projection import LiveService, live_cost
from mcp_infra.flows.promotion import (
    CycleResult,
    Promotion,
    conclude,
    promote,
    restore,
    restore_after_error,
)
from mcp_infra.flows.rounds import Bench, LiveTraffic, decide_cycle, run_rounds
from mcp_infra.flows.status import cost_sidecar
from mcp_infra.procs import usage
from mcp_infra.procs.distributed import preflight_hosts
from mcp_infra.procs.front import live_request_count
from mcp_infra.procs.service import (
    ServiceError,
    backend_url,
    ensure_serving,
    hold_live,
    is_serving,
    stable_port_held_by_stranger,
)
from mcp_infra.state import references
from mcp_infra.state.artifacts import HubError, resolve_recipe
from mcp_infra.state.context import (
    HomeContext,
    active_recipe,
    load_config,
    mark_needs_operator,
    service_record,
)
from mcp_infra.state.hostfacts import fingerprint_environment, folder_fingerprint
from mcp_infra.state.runtimes import RuntimeEnvError, keep_runtime_locks
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    file_safe,
    read_optional,
    utcnow,
    write_model,
)


class NeedsOperator(McpInfraError, RuntimeError):
    """The service could not be restored; no cycle runs until a person (or `recover`) acts."""


def new_cycle_id(plan: FrozenPlan) -> str:
    return f"c-{utcnow().strftime('%Y%m%d-%H%M%S')}-{plan.content_hash[:6]}"


@dataclass(frozen=True)
class Begun:
    """A cycle whose first journal line is written: from here recovery accounts for its plan."""

    cycle_id: str
    journal: Journal
    started: datetime


def begin_cycle(home: Home, plan: FrozenPlan) -> Begun:
    """The plan taken from the queue: its cycle's folder, plan, usage mark and first journal
    line (the supervisor runs this with stop signals held, ``journal.stops_held``)."""
    cycle_id = new_cycle_id(plan)
    cdir = home.cycle_dir(cycle_id)
    cdir.mkdir(parents=True, exist_ok=True)
    write_model(CycleFiles(cdir).plan, plan)
    usage.cycle_start(cdir, home)
    journal = Journal(home, cycle_id)
    started = utcnow()
    journal(CycleState.QUEUED, "plan taken from the queue", plan_id=plan.plan_id)
    return Begun(cycle_id, journal, started)


def run_cycle(home: Home, plan: FrozenPlan, begun: Begun) -> CycleSummary:
    """Run one begun cycle to a sealed evidence bundle. Never leaves the service unrestored."""
    cycle_id, journal, started = begun.cycle_id, begun.journal, begun.started
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
    live_run: CandidateRun | None = None
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
            reference=references.load(self.home, self.live),
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
                builds=c.home.builds,
            )
        except (HubError, RuntimeEnvError) as exc:  # a tampered artifact or runtime
            recipe = resolve_recipe(  # environment refuses this candidate, not the cycle
                manifest,
                variant,
                c.home.models,
                c.home.hf_cache,
                runtimes=runtimes,
                builds=c.home.builds,
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
    """Make the builds candidates serve (``flows.own.make_builds``), journal the resolved
    recipes; a candidate whose artifacts are missing is not measured."""
    wanted = [(a.candidate, a.manifest, a.variant) for a in c.admitted if a.candidate not in c.runs]

    def say(text: str, fields: dict[str, JSONValue]) -> None:
        c.journal(CycleState.PREPARE, text, **fields)

    for cid, built in build_recipes(c.home, c.loaded.policy, wanted, c.files.root, say).items():
        if isinstance(built, str):
            c.runs[cid] = not_started(cid, c.recipes[cid], built)
        else:
            c.recipes[cid] = built
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
    live_run = c.live_run = measure_live(base_url, c.live, c.plan, c.record)
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
    first_projection(c, "exclusive" if admission.mode == "exclusive" else "concurrent")
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


def first_projection(c: CycleContext, mode: Literal["concurrent", "exclusive"]) -> None:
    """A plan proposed with no projected cost (a home's first cycle: no sealed cycle had
    measured anything) is priced now on the live service as BASELINE measured it, and kept
    beside the plan for `status`. Nothing is replaced where a cost was projected; a projection
    that fails is left out and never stops the cycle."""
    if c.live_run is None:
        return
    path = cost_sidecar(c.home, c.plan.plan_id)
    held = None
    with contextlib.suppress(CorruptFile):
        kept = read_optional(path, PlanCost)
        if kept is None or kept.minutes is not None:
            return
        held = kept.held
    env = read_optional(c.files.environment, EnvironmentFingerprint)
    ready_s = c.record.ready_s if c.record else None
    live = LiveService(c.live_run, ready_s, env.memory_gb if env else 0.0)
    try:
        cost = live_cost(c.plan, live, c.loaded.policy, mode, c.recipes)
    except (ValueError, KeyError, OSError) as exc:
        print(f"no first projection: {exc}", file=sys.stderr)
        return
    write_model(path, cost.model_copy(update={"held": held}))


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
    answers.keep(c.home, c.plan, c.cycle_id, c.live, c.baseline, "selection")
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
    answers.keep(c.home, c.plan, c.cycle_id, c.live, held.baseline, "heldout")
    winner = c.recipes[selected]  # the next cycle's baseline, once promoted
    answers.keep(c.home, c.plan, c.cycle_id, winner, c.runs[selected], "selection")
    answers.keep(c.home, c.plan, c.cycle_id, winner, held.winner, "heldout")
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
