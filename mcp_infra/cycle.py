"""The supervisor: one optimization cycle, read top to bottom.

QUEUED → PREFLIGHT → PREPARE → BASELINE → MAINTENANCE → EXPERIMENT(each) → SELECT → PROMOTE →
VERIFY → COMMIT | ROLLBACK → SEALED. Each state is journaled (fsync) before its side effect, so
``recovery.decide`` can always tell what a killed cycle had done. Decisions are made by the pure
core (policy, selector, recovery); this module only sequences I/O around them.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from mcp_infra import bench, evidence, memory, window
from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleState,
    CycleSummary,
    EnvironmentFingerprint,
    Event,
    FrozenPlan,
    Outcome,
    ProcessRecord,
    Recipe,
    Sample,
    SupervisorRecord,
    Verdict,
)
from mcp_infra.core.admission import admit, expected_downtime_s
from mcp_infra.demo_models import model_fingerprint
from mcp_infra.flows import impact
from mcp_infra.gates import compare_greedy, smoke_failures
from mcp_infra.hub import HubError
from mcp_infra.policy import load_policy
from mcp_infra.recovery import Action, decide
from mcp_infra.registry import (
    find_candidate,
    host_facts,
    installed_version,
    load_registry,
    preflight,
    resolve_recipe,
)
from mcp_infra.runtime import MemorySampler, PortBusy, ServerStartError, is_running, log_tail
from mcp_infra.selector import select
from mcp_infra.service import (
    ServiceError,
    active_recipe,
    adopt,
    backend_url,
    ensure_serving,
    hold_live,
    is_serving,
    load_config,
    service_policy,
    service_record,
    stable_port_held_by_stranger,
    start_backend,
    start_candidate,
    stop_candidate,
    stop_stray_candidates,
)
from mcp_infra.store import (
    Home,
    read_model,
    read_optional,
    sha256_bytes,
    utcnow,
    write_bytes_atomic,
    write_model,
)
from mcp_infra.suites import load_suite

PAUSE_ENV = "MCP_INFRA_PAUSE_AT"


class NeedsOperator(RuntimeError):
    """The service could not be restored; no cycle runs until a person (or `recover`) acts."""


# ---------------------------------------------------------------------------------------------
# Journal
# ---------------------------------------------------------------------------------------------


class Journal:
    def __init__(self, home: Home, cycle_id: str) -> None:
        self.home = home
        self.cycle_id = cycle_id

    def __call__(self, state: CycleState, message: str, **fields: Any) -> None:
        """Append the event (fsynced) first; then, if asked to, pause here for fault injection."""
        self.home.append_event(Event(ts=utcnow(), cycle_id=self.cycle_id, state=state,
                                     message=message, fields=fields))
        write_model(self.home.state / "supervisor.json", _supervisor_record(self.cycle_id))
        current = {"cycle_id": self.cycle_id, "state": state.value, "message": message,
                   **{k: v for k, v in fields.items() if k in {"candidate", "index", "total"}}}
        write_bytes_atomic(self.home.state / "current.json", _json(current).encode())
        step = str(fields.get("step", "enter"))
        pause = os.environ.get(PAUSE_ENV)
        if pause and (pause == f"{state.value}:{step}" or (pause, step) == (state.value, "enter")):
            marker = self.home.state / f"paused-at-{pause.replace(':', '-')}"
            marker.write_text(f"{os.getpid()}\n")
            while True:  # a seam for tests and operators: wait here until killed
                time.sleep(3600)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, default=str)


def _supervisor_record(cycle_id: str | None) -> SupervisorRecord:
    return SupervisorRecord(pid=os.getpid(), create_time=psutil.Process().create_time(),
                            started_at=utcnow(), cycle_id=cycle_id)


# ---------------------------------------------------------------------------------------------
# Measurement (the same for baseline and candidates)
# ---------------------------------------------------------------------------------------------


class ServerDied(RuntimeError):
    """The measured server exited mid-benchmark: stop measuring it, keep what was measured."""


def measure(base_url: str, candidate: str, plan: FrozenPlan,
            server: ProcessRecord | None) -> CandidateRun:
    """Warm-up, shuffled repeats of the speed suite, then one greedy request per prompt.

    If the server dies mid-benchmark the failing request records why and measuring stops, so
    the selector rejects the candidate with that reason and the cycle goes on.
    """
    protocol = plan.protocol
    suite = load_suite(protocol.suite)
    prompts = {p.id: p for p in suite.prompts}
    samples: list[Sample] = []
    greedy: list[Sample] = []
    quality: list[Sample] = []
    timeout = protocol.request_timeout_s

    def keep(into: list[Sample], sample: Sample) -> None:
        if sample.error and server is not None and not is_running(server):
            tail = log_tail(server.log_path, 300)
            sample = sample.model_copy(update={
                "error": f"server process exited during measurement; log tail: {tail}"})
            into.append(sample)
            raise ServerDied(sample.error)
        into.append(sample)

    sampler = MemorySampler(server.pid) if server else None
    if sampler:
        sampler.__enter__()
    try:
        for round_ in range(protocol.warmup):
            for pid_, prompt in prompts.items():
                keep(samples, bench.stream_chat(
                    base_url, _fresh(prompt), max_tokens=_max_tokens(prompt, protocol),
                    timeout=timeout, candidate=candidate, prompt_id=pid_, repeat=round_,
                    phase="warmup"))
        for order, (repeat, pid_) in enumerate(
                bench.measurement_order(list(prompts), protocol.repeats, protocol.seed)):
            prompt = prompts[pid_]
            keep(samples, bench.stream_chat(
                base_url, _fresh(prompt), max_tokens=_max_tokens(prompt, protocol),
                timeout=timeout, candidate=candidate, prompt_id=pid_, repeat=repeat, order=order))
        # Greedy outputs as served: each prompt twice, so the second request reuses the cached
        # prefix of the first, as real traffic does; both must equal the baseline's output.
        for again in range(2):
            for pid_, prompt in prompts.items():
                sample = bench.greedy_chat(
                    base_url, _messages(prompt), max_tokens=_max_tokens(prompt, protocol),
                    timeout=timeout, candidate=candidate, prompt_id=pid_)
                keep(greedy, sample.model_copy(update={"repeat": again}))
        if protocol.quality_suite:
            for task in load_suite(protocol.quality_suite).prompts:
                keep(quality, bench.greedy_chat(  # a task's own budget: a reasoning model
                    base_url, _messages(task), max_tokens=task.max_tokens,  # must reach its answer
                    timeout=timeout, candidate=candidate, prompt_id=task.id, phase="quality"))
    except ServerDied as exc:
        if not any(s.phase == "measure" and s.error for s in samples):
            samples.append(Sample(candidate=candidate, prompt_id=next(iter(prompts)),
                                  repeat=-1, error=str(exc)))
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    return CandidateRun(candidate=candidate, samples=samples + quality, greedy=greedy,
                        peak_memory_gb=sampler.peak_gb if sampler else None,
                        memory_source=sampler.source if sampler else None)


def _fresh(prompt: Any) -> list[dict[str, Any]]:
    return bench.with_nonce(_messages(prompt), uuid.uuid4().hex[:12])


def _messages(prompt: Any) -> list[dict[str, Any]]:
    return [m.model_dump() if hasattr(m, "model_dump") else dict(m) for m in prompt.messages]


def _max_tokens(prompt: Any, protocol: Any) -> int:
    return min(getattr(prompt, "max_tokens", None) or protocol.max_tokens, protocol.max_tokens)


def cache_note(recipe: Recipe) -> str:
    served = ("prompt cache off (--prompt-cache-size 0)" if recipe.knobs.prompt_cache_size == 0
              else "the server's default prompt cache")
    return (f"served with {served}. Timed requests open with a unique tag, so no repeat reuses a "
            "cached prompt beyond the chat template's first tokens (cached_tokens is recorded per "
            "request); greedy outputs are requested twice per prompt, the second reusing the "
            "first's cached prefix as real traffic does, and both must match the baseline.")


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def environment(recipes: list[Recipe]) -> EnvironmentFingerprint:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    packages = {name: v for name in ("mlx", "mlx-lm", "mlx-vlm", "mcp", "pydantic", "mcp-infra",
                                     "huggingface_hub") if (v := installed_version(name))}
    models: dict[str, str] = {}
    for recipe in recipes:  # every model folder a recipe of this cycle ran, by path
        for path in (recipe.model_path, recipe.draft_path):
            if path and path not in models:
                models[path] = _fingerprint(Path(path))
    return EnvironmentFingerprint(
        platform=platform.platform(), machine=platform.machine(), cpu=cpu,
        cpu_count=os.cpu_count() or 0, memory_gb=round(psutil.virtual_memory().total / 2**30, 2),
        python=platform.python_version(), packages=packages,
        blas=os.environ.get("LD_PRELOAD", "") or "bundled (no LD_PRELOAD)", models=models)


FULL_HASH_LIMIT = 2**30


def _fingerprint(path: Path) -> str:
    """sha256 of a model folder's bytes; above 1 GiB (real models) a pinned hub snapshot is
    named by its revision folder and the file sizes, and its files' sha256 inventory is taken
    when it is prepared (`mcp-infra prepare`), not on every cycle."""
    if not path.is_dir():
        return "missing"
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT:
        return "sha256:" + model_fingerprint(path)
    sizes = ",".join(f"{p.relative_to(path)}={p.stat().st_size}" for p in files)
    return f"snapshot:{path.name};sizes-sha256:{sha256_bytes(sizes.encode())}"


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
    write_model(cdir / "plan.json", plan)
    journal = Journal(home, cycle_id)
    started = utcnow()
    journal(CycleState.QUEUED, "plan taken from the queue", plan_id=plan.plan_id)
    try:
        outcome, selected, reason, speedup = _run(home, plan, cycle_id, journal)
    except NeedsOperator as exc:
        outcome, selected, reason, speedup = Outcome.NEEDS_OPERATOR, None, str(exc), None
    except Exception as exc:  # any unexpected failure: restore, then account for it
        reason = f"cycle failed: {type(exc).__name__}: {str(exc)[:300]}"
        journal(CycleState.ROLLBACK, "unexpected error; restoring the live recipe", step="enter",
                error=reason)
        outcome, selected, speedup = _restore(home, journal, reason), None, None
    try:
        return _seal(home, plan, cycle_id, journal, started, outcome, selected, reason, speedup)
    except OSError as exc:
        raise _seal_failed(home, journal, exc) from exc


class SealFailed(RuntimeError):
    """Evidence could not be written (disk full, read-only home); the service stays restored and
    the next supervisor start finishes sealing."""


def _seal_failed(home: Home, journal: Journal, exc: OSError) -> SealFailed:
    message = f"sealing the evidence failed: {type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):
        journal(CycleState.SEALED, message, step="failed")
    try:
        served = ensure_serving(home, active_recipe(home), load_config(home))
        message += f"; the live recipe serves ({served}); `mcp-infra recover` finishes sealing"
    except (ServerStartError, PortBusy, ServiceError, OSError) as restore_error:
        message += f"; restoring the live recipe failed too: {restore_error}"
        with contextlib.suppress(OSError):
            mark_needs_operator(home, journal.cycle_id, message)
    return SealFailed(message)


def _run(home: Home, plan: FrozenPlan, cycle_id: str,
         journal: Journal) -> tuple[Outcome, str | None, str, float | None]:
    config = load_config(home)
    policy = load_policy(config.policy, extra=home.user_policy)
    deadline = time.monotonic() + policy.budgets.cycle_minutes * 60
    journal(CycleState.PREFLIGHT, "checking candidates and the live service")
    if stable_port_held_by_stranger(home, config):
        return (Outcome.REFUSED, None, f"port {config.port} is held by a process mcp-infra did "
                "not start; refusing to touch it", None)
    manifests = load_registry(extra=home.user_registry)
    facts = host_facts(home.root, home.models, home.hf_cache)
    live = active_recipe(home)
    try:
        ensure_serving(home, live, config, timeout=plan.protocol.ready_timeout_s)
    except (ServerStartError, PortBusy) as exc:
        raise NeedsOperator(f"the live recipe could not be started: {exc}") from exc
    impact.begin(home, cycle_id)
    admitted: list[tuple[str, Any, Any]] = []
    runs: dict[str, CandidateRun] = {}
    recipes: dict[str, Recipe] = {}
    for candidate in plan.candidates[1:]:
        found = find_candidate(manifests, candidate)
        if found is None:
            runs[candidate] = CandidateRun(candidate=candidate, started=False,
                                           start_error="no longer in the registry")
            continue
        manifest, variant = found
        admitted.append((candidate, manifest, variant))
        check = preflight(manifest, variant, policy, facts)
        try:
            recipe = resolve_recipe(manifest, variant, home.models, home.hf_cache,
                                    fingerprint=_fingerprint)
        except HubError as exc:  # a tampered artifact refuses this candidate, not the cycle
            recipe = resolve_recipe(manifest, variant, home.models, home.hf_cache)
            runs[candidate] = _not_started(candidate, recipe, f"artifact check failed: {exc}")
        recipes[candidate] = recipe
        if not check.passed and candidate not in runs:
            runs[candidate] = CandidateRun(candidate=candidate, started=False,
                                           candidate_class=recipe.candidate_class,
                                           semantics=recipe.semantics, knobs=recipe.knobs,
                                           start_error="preflight: " + "; ".join(check.failures()))
    journal(CycleState.PREPARE, "artifacts resolved",
            recipes={c: r.model_dump(mode="json") for c, r in recipes.items()})
    for candidate, recipe in recipes.items():
        missing = [p for p in (recipe.model_path, recipe.draft_path) if p and not Path(p).exists()]
        if missing and candidate not in runs:
            runs[candidate] = CandidateRun(candidate=candidate, started=False,
                                           candidate_class=recipe.candidate_class,
                                           semantics=recipe.semantics, knobs=recipe.knobs,
                                           start_error=f"artifact missing: {', '.join(missing)}")

    journal(CycleState.BASELINE, "measuring the live service", recipe=live.candidate_id)
    record = service_record(home)
    base_url = backend_url(record) if record else f"http://{config.host}:{config.port}"
    baseline_started = time.monotonic()
    baseline = measure(base_url, BASELINE_ID, plan, record)
    baseline_s = time.monotonic() - baseline_started
    baseline = baseline.model_copy(update={"knobs": live.knobs, "semantics": live.semantics,
                                           "cache_note": cache_note(live)})
    write_model(home.cycle_dir(cycle_id) / "runs" / "baseline.json", baseline)
    broken = [s.error for s in baseline.samples if s.error]
    if broken:
        raise RuntimeError(f"the live service failed while its baseline was measured: {broken[0]}")
    write_model(home.cycle_dir(cycle_id) / "environment.json",
                environment([live, *recipes.values()]))

    todo = [c for c in plan.candidates[1:] if c not in runs]
    admission = impact.plan_admission(home, policy, record,
                                      [a for a in admitted if a[0] in todo])
    exclusive = admission.mode == "exclusive" and bool(todo)
    expected = expected_downtime_s(
        admission.mode if todo else "concurrent", candidates=len(todo), per_candidate_s=baseline_s,
        load_s=(record.ready_s if record and record.ready_s else plan.protocol.ready_timeout_s))
    impact.decided(home, cycle_id, admission, expected)
    journal(CycleState.MAINTENANCE, impact.downtime_words(
        "exclusive" if exclusive else "concurrent", expected, policy.service.max_hold_s),
        mode=admission.mode, mode_reason=admission.reason, expected_downtime_s=expected)
    if exclusive:
        hold_live(home, config, reason=f"cycle {cycle_id}: candidates run alone (exclusive)")
    for index, candidate in enumerate(todo, start=1):
        recipe = recipes[candidate]
        if time.monotonic() > deadline:
            runs[candidate] = _not_started(candidate, recipe, "the cycle's time budget ran out "
                                           "before this candidate could be measured")
            continue
        journal(CycleState.EXPERIMENT, f"measuring {candidate}", candidate=candidate,
                index=index, total=len(todo))
        runs[candidate] = _experiment(home, config, plan, journal, recipe)
        write_model(home.cycle_dir(cycle_id) / "runs" / f"{_safe(candidate)}.json",
                    runs[candidate])
    if exclusive:  # the live recipe serves again before anything else is measured or promoted
        ensure_serving(home, live, config, timeout=plan.protocol.ready_timeout_s)
        base_url = backend_url(service_record(home) or record)
    for candidate, run in runs.items():  # record candidates that never started, too
        path = home.cycle_dir(cycle_id) / "runs" / f"{_safe(candidate)}.json"
        if not path.exists():
            write_model(path, run)

    if plan.protocol.drift_check:
        journal(CycleState.SELECT, "re-measuring the baseline for drift", step="drift")
        again = measure(base_url, BASELINE_ID, plan.model_copy(update={
            "protocol": plan.protocol.model_copy(update={"warmup": 0, "quality_suite": None})}),
            service_record(home))
        drift = [s.model_copy(update={"phase": "drift"}) for s in again.samples
                 if s.phase == "measure"]
        baseline = baseline.model_copy(update={"samples": [*baseline.samples, *drift]})
        write_model(home.cycle_dir(cycle_id) / "runs" / "baseline.json", baseline)
    journal(CycleState.SELECT, "selecting by the frozen thresholds")
    ordered = [runs[c] for c in plan.candidates[1:] if c in runs]
    verdict = select(baseline, ordered, plan.thresholds, plan.protocol, plan.auto_promote)
    write_model(home.cycle_dir(cycle_id) / "verdict.json", verdict)
    if verdict.selected is None:
        if not is_serving(home, live, config):  # the live server died during the cycle
            reason = f"{verdict.reason}; the live service stopped answering during the cycle"
            journal(CycleState.ROLLBACK, "the live service is down; restoring it", step="enter")
            return _restore(home, journal, reason), None, reason, None
        return Outcome.KEPT_BASELINE, None, verdict.reason, None
    winner = recipes[verdict.selected]
    speedup = _speedup_pct(verdict, verdict.selected)
    return _promote(home, config, plan, journal, live, winner, runs[verdict.selected], speedup,
                    verdict)


def _safe(candidate: str) -> str:
    return candidate.replace(":", "__")


def _not_started(candidate: str, recipe: Recipe, why: str) -> CandidateRun:
    return CandidateRun(candidate=candidate, started=False, start_error=why,
                        candidate_class=recipe.candidate_class, semantics=recipe.semantics,
                        knobs=recipe.knobs)


def _experiment(home: Home, config: Any, plan: FrozenPlan, journal: Journal,
                recipe: Recipe) -> CandidateRun:
    """Start the candidate on a free port, measure it as it will be served, stop it."""
    try:
        record = start_candidate(home, recipe, config, cycle_id=journal.cycle_id,
                                 timeout=plan.protocol.ready_timeout_s)
    except (ServerStartError, PortBusy, ValueError) as exc:
        return _not_started(recipe.candidate_id, recipe, f"server did not start: {exc}")
    try:
        journal(CycleState.EXPERIMENT, f"{recipe.candidate_id} is ready; measuring",
                step="measuring", candidate=recipe.candidate_id)
        run = measure(backend_url(record), recipe.candidate_id, plan, record)
    finally:
        stop_candidate(home, record)
    return run.model_copy(update={"candidate_class": recipe.candidate_class,
                                  "semantics": recipe.semantics, "knobs": recipe.knobs,
                                  "cache_note": cache_note(recipe)})


def _speedup_pct(verdict: Verdict, candidate: str) -> float | None:
    for item in verdict.candidates:
        if item.candidate == candidate and item.speedup_estimate is not None:
            return round((item.speedup_estimate - 1) * 100, 2)
    return None


def _promote(home: Home, config: Any, plan: FrozenPlan, journal: Journal, live: Recipe,
             winner: Recipe, run: CandidateRun, speedup: float | None,
             verdict: Verdict) -> tuple[Outcome, str | None, str, float | None]:
    """Start the winner on its own port, verify it there, then switch the front to it and drain
    the old backend. If the two do not fit in memory together (measured peak of the winner +
    measured footprint of the live backend against the policy's budget), the front holds
    requests while the old backend stops and the winner loads (exclusive)."""
    policy = service_policy(home)
    live_record = service_record(home)
    fit = admit(run.peak_memory_gb, impact.footprint_gb(live_record),
                psutil.virtual_memory().total / 2**30, policy.memory_budget_fraction,
                peak_source="measured in this cycle", live_source="measured RSS")
    exclusive = fit.mode == "exclusive" and live_record is not None
    impact.promotion(home, journal.cycle_id, fit)
    journal(CycleState.PROMOTE, f"starting {winner.candidate_id} on its own port "
            f"({'exclusive: the front holds requests' if exclusive else 'beside the live one'})",
            step="enter", recipe=winner.model_dump(mode="json"), previous=live.candidate_id,
            mode=fit.mode, mode_reason=fit.reason)
    if stable_port_held_by_stranger(home, config):
        reason = (f"port {config.port} is held by a process mcp-infra did not start; "
                  "promotion refused, nothing was touched")
        journal(CycleState.ROLLBACK, reason, step="enter")
        return _restore(home, journal, reason, outcome=Outcome.ROLLED_BACK), None, reason, None
    try:
        if exclusive:
            hold_live(home, config, reason=f"exclusive promotion of {winner.candidate_id}")
        safe = winner.candidate_id.replace(":", "_")
        new = start_backend(home, winner, role="backend", log=home.logs / f"backend-{safe}.log",
                            cycle_id=journal.cycle_id, timeout=plan.protocol.ready_timeout_s)
    except (ServerStartError, PortBusy) as exc:
        reason = f"the winner did not start: {str(exc)[:300]}"
        journal(CycleState.ROLLBACK, reason, step="enter")
        return _restore(home, journal, reason, outcome=Outcome.ROLLED_BACK), None, reason, None
    journal(CycleState.VERIFY, f"checking {winner.candidate_id} on its own port before the "
            "switch", step="enter", port=new.port)
    failure = verify_online(home, config, plan, winner, run, base_url=backend_url(new))
    if failure:
        journal(CycleState.VERIFY, failure, step="failed")
        journal(CycleState.ROLLBACK, "verification failed; the previous recipe keeps serving",
                step="enter")
        return _restore(home, journal, failure, outcome=Outcome.ROLLED_BACK), None, failure, None
    journal(CycleState.VERIFY, "the winner reproduces the measured greedy outputs",
            step="passed")
    journal(CycleState.COMMIT, f"{winner.candidate_id} is the live recipe; switching the front")
    commit(home, live, winner)
    switched = adopt(home, new, config, reason=f"promoted {winner.candidate_id}")
    journal(CycleState.COMMIT, f"front switched to {winner.candidate_id} ({switched})",
            step="switched")
    return Outcome.PROMOTED, winner.candidate_id, verdict.reason, speedup


def commit(home: Home, previous: Recipe, winner: Recipe) -> None:
    write_model(home.state / "previous.json", previous)
    write_model(home.state / "active.json", winner)


def verify_online(home: Home, config: Any, plan: FrozenPlan, winner: Recipe,
                  run: CandidateRun, *, base_url: str | None = None) -> str | None:
    """Gates again on the server about to serve (its own port, before the front switches to
    it): the same greedy outputs as measured, no smoke failure."""
    base_url = base_url or f"http://{config.host}:{config.port}"
    suite = load_suite(plan.protocol.suite)
    online = [bench.greedy_chat(base_url, _messages(p), max_tokens=_max_tokens(p, plan.protocol),
                                timeout=plan.protocol.request_timeout_s,
                                candidate=winner.candidate_id, prompt_id=p.id, phase="verify")
              for p in suite.prompts]
    errors = [s for s in online if s.error]
    if errors:
        return f"verification request failed: {errors[0].error}"
    gate = compare_greedy(run.greedy, online)
    if not gate.passed:
        return f"online greedy output differs from the measured one: {gate.detail}"
    measured = {s.prompt_id: s for s in run.greedy}
    for sample in online:
        new = [f for f in smoke_failures(sample.text)
               if f not in smoke_failures(measured[sample.prompt_id].text)]
        if new:
            return f"smoke check failed online on {sample.prompt_id}: {new[0]}"
    return None


def _restore(home: Home, journal: Journal, reason: str,
             outcome: Outcome = Outcome.RESTORED_AFTER_ERROR) -> Outcome:
    """Stop stray candidates and bring the stable port back to the active recipe."""
    stopped = stop_stray_candidates(home)
    config = load_config(home)
    recipe = active_recipe(home)
    try:
        done = ensure_serving(home, recipe, config)
    except (ServerStartError, PortBusy, ServiceError) as exc:
        message = f"restoring {recipe.candidate_id} failed: {str(exc)[:300]}"
        journal(CycleState.ROLLBACK, message, step="failed", stopped=stopped)
        mark_needs_operator(home, journal.cycle_id, f"{reason}; {message}")
        return Outcome.NEEDS_OPERATOR
    journal(CycleState.ROLLBACK, f"{recipe.candidate_id} serves again ({done})", step="done",
            stopped=stopped)
    return outcome


def mark_needs_operator(home: Home, cycle_id: str, reason: str) -> None:
    (home.state / "needs_operator.json").write_text(_json({"cycle_id": cycle_id, "reason": reason,
                                                           "ts": utcnow().isoformat()}))


def _seal(home: Home, plan: FrozenPlan, cycle_id: str, journal: Journal, started: datetime,
          outcome: Outcome, selected: str | None, reason: str, speedup: float | None,
          *, interrupted: bool = False, recovery: str | None = None) -> CycleSummary:
    journal(CycleState.SEALED, f"outcome: {outcome.value}", step="enter", outcome=outcome.value,
            selected=selected, reason=reason, speedup_pct=speedup)
    try:  # what the stable endpoint's clients saw; never fails a cycle
        impact.finish(home, cycle_id)
    except Exception as exc:
        with contextlib.suppress(OSError):
            journal(CycleState.SEALED, f"service impact not recorded: {type(exc).__name__}",
                    step="note")
    summary = CycleSummary(
        cycle_id=cycle_id, plan_id=plan.plan_id, started_at=started, ended_at=utcnow(),
        outcome=outcome, selected=selected, speedup_pct=speedup, reason=reason,
        active_recipe=active_recipe(home).candidate_id, interrupted=interrupted,
        recovery=recovery)
    evidence.seal(home, cycle_id, summary)
    journal(CycleState.SEALED, "evidence sealed", step="done")
    try:  # recipe memory is derived from the sealed bundle; it never fails a sealed cycle
        memory.record(home, cycle_id)
    except Exception as exc:
        with contextlib.suppress(OSError):
            journal(CycleState.SEALED, f"recipe memory not recorded: {type(exc).__name__}: "
                    f"{str(exc)[:200]} (it is read from the bundle instead)", step="note")
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
        if (home.evidence / cycle_id / "MANIFEST.json").exists():
            continue
        events, problems = home.read_journal(cycle_id)
        decision = decide(events)
        if decision.action == Action.NOTHING and not events:
            continue
        journal = Journal(home, cycle_id)
        plan = read_optional(cdir / "plan.json", FrozenPlan)
        journal(CycleState.RECOVER, decision.reason, action=decision.action.value,
                last_state=decision.last_state.value if decision.last_state else None,
                journal_problems=problems)
        outcome = decision.outcome or Outcome.RESTORED_AFTER_ERROR
        selected = None
        if decision.action == Action.KEEP_PROMOTION and decision.promoted_recipe:
            winner = Recipe.model_validate(decision.promoted_recipe)
            live = active_recipe(home)
            if live.key() != winner.key():
                commit(home, live, winner)
            selected = winner.candidate_id
            outcome = _restore(home, journal, decision.reason, outcome=Outcome.PROMOTED)
        elif decision.action in (Action.RESTORE_PREVIOUS, Action.FINISH_SEALING):
            outcome = _restore(home, journal, decision.reason, outcome=outcome)
        if plan is None:
            notes.append(f"{cycle_id}: no readable plan; journal kept as is")
            continue
        where = decision.last_state.value if decision.last_state else "?"
        _seal(home, plan, cycle_id, journal, events[0].ts if events else utcnow(), outcome,
              selected, f"interrupted in {where}: {decision.reason}", None, interrupted=True,
              recovery=decision.action.value)
        _retire_queue_entries(home, plan.plan_id)  # an interrupted plan is never silently re-run
        notes.append(f"{cycle_id}: {decision.action.value} → {outcome.value}")
    return notes


def _retire_queue_entries(home: Home, plan_id: str) -> None:
    for entry in home.queued():
        if entry.stem.endswith(plan_id):
            home.retire(entry)


def failed_attempts(home: Home, plan_id: str) -> int:
    """Cycles of this plan that ended by an error (not by a decision), from sealed evidence."""
    return sum(1 for s in evidence.list_cycles(home)
               if s.plan_id == plan_id and s.outcome == Outcome.RESTORED_AFTER_ERROR
               and s.reason.startswith("cycle failed"))


def _maybe_retry(home: Home, plan: FrozenPlan, summary: CycleSummary) -> None:
    """Re-queue a plan whose cycle failed by error, a bounded number of times, with backoff."""
    if summary.outcome != Outcome.RESTORED_AFTER_ERROR or not summary.reason.startswith(
            "cycle failed"):
        return
    budgets = load_policy(load_config(home).policy, extra=home.user_policy).budgets
    attempts = failed_attempts(home, plan.plan_id)
    if attempts > budgets.retries:
        return
    time.sleep(budgets.retry_backoff_s * 2 ** (attempts - 1))
    home.enqueue(plan)


@contextmanager
def supervising(home: Home) -> Iterator[None]:
    with home.supervisor_lock():
        write_model(home.state / "supervisor.json", _supervisor_record(None))
        try:
            yield
        finally:
            (home.state / "supervisor.json").unlink(missing_ok=True)
            (home.state / "current.json").unlink(missing_ok=True)


def supervise(home: Home, *, ignore_window: bool = False) -> list[CycleSummary]:
    """Recover, then run every queued plan in order; return when the queue is empty, or when
    the policy's maintenance window does not let the next cycle start and finish in time
    (``window.for_home``; the plan stays queued). ``ignore_window``: an operator's override."""
    home.ensure()
    summaries: list[CycleSummary] = []
    with supervising(home):
        recover(home)
        _revive_front(home)
        while True:
            if (home.state / "needs_operator.json").exists():
                break
            queued = home.queued()
            if not queued:
                break
            if not ignore_window and not window.for_home(home).may_start:
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
        marker = home.state / "needs_operator.json"
        stopped = stop_stray_candidates(home)
        notes += [f"stopped stray candidate {s}" for s in stopped]
        live = active_recipe(home)
        try:
            done = ensure_serving(home, live, load_config(home))
        except (ServerStartError, PortBusy, ServiceError) as exc:
            notes.append(f"still needs an operator: {exc}")
            if not marker.exists():
                mark_needs_operator(home, "recover", str(exc))
            return notes
        notes.append(f"live recipe {live.candidate_id} serves ({done})")
        if marker.exists():
            marker.unlink()
            notes.append("needs-operator cleared")
    return notes
