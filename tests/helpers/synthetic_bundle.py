"""SYNTHETIC evidence bundles: a cycle sealed without measuring its speed.

For tests of what happens *after* a cycle (recipe memory, approval, evidence verification),
which must not depend on how fast this machine runs the demo models. What is synthetic, and only
this: the timing samples (`timing`: a fixed decode rate the caller picks, e.g. 13 tok/s for
`demo-tiny:kv8` against the baseline's 10, a "speedup" that KV quantization does NOT give on
this CPU, with one fixed quality answer per task where the plan names a quality suite:
`answers`) and, where the caller asks for them, the greedy token ids (`greedy_ids`). Nothing
measured by these helpers is a figure about any machine; never read them as one.

Everything else is the product's own code: the plan is frozen by `proposal.freeze_plan`, the verdict
comes from `selector.select`, the journal is written by `Journal` in the order a real cycle
writes it (QUEUED, PREFLIGHT, PREPARE, BASELINE, MAINTENANCE, EXPERIMENT per candidate, SELECT,
SEALED), and `conclude` seals the bundle (and records recipe memory). Greedy outputs may also
be real ones read from real servers (`real_greedy`).
"""

from __future__ import annotations

import yaml

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleState,
    CycleSummary,
    FrozenPlan,
    JournalStep,
    Outcome,
    Sample,
)
from mcp_infra.core.preflight import find_candidate
from mcp_infra.core.sanitize import parse_plan
from mcp_infra.core.selector import select
from mcp_infra.core.workload import request_class_of
from mcp_infra.flows import proposal
from mcp_infra.flows.journal import Journal
from mcp_infra.flows.promotion import CycleResult, conclude
from mcp_infra.procs import bench
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_registry, load_suite
from mcp_infra.state.context import HomeContext, active_recipe
from mcp_infra.state.hostfacts import fingerprint_environment
from mcp_infra.state.store import Home, utcnow, write_model
from tests.helpers.paths import REPO


def freeze(home: Home, candidates: list[str]) -> FrozenPlan:
    plan = parse_plan({"hypothesis": "test", "candidates": candidates})
    return proposal.freeze_plan(HomeContext(home), plan, "test")


def prompts(plan: FrozenPlan) -> list[str]:
    """The suite's selection prompts (held-out prompts are measured only after selection)."""
    return [p.id for p in load_suite(plan.protocol.suite).prompts if p.split == "selection"]


def timing(candidate: str, plan: FrozenPlan, tps: float) -> list[Sample]:
    """SYNTHETIC timing samples at a fixed decode rate (small, deterministic spread per repeat
    and per server start, in as many starts as the protocol's minimum): invented numbers, so a
    test's verdict does not depend on this machine's speed."""
    starts = max(plan.protocol.min_starts, 2)
    out = []
    for start in range(starts):
        for i, (r, pid) in enumerate(
            (r, p) for r in range(plan.protocol.repeats) for p in prompts(plan)
        ):
            rate = tps * (1 + 0.002 * r) * (1 + 0.003 * start)
            out.append(
                Sample(
                    candidate=candidate,
                    prompt_id=pid,
                    repeat=r,
                    order=i,
                    start=start,
                    round=start,
                    prompt_tokens=20,
                    completion_tokens=32,
                    ttft_s=0.05,
                    decode_s=31 / rate,
                    decode_tps=rate,
                    e2e_s=0.06 + 31 / rate,
                    finish_reason="length",
                    text="x",
                )
            )
    return out + answers(candidate, plan)


def answers(candidate: str, plan: FrozenPlan) -> list[Sample]:
    """SYNTHETIC quality answers, where the plan names a quality suite: one fixed reply per task,
    the same on every side (it passes no task, so no task is held against a candidate)."""
    if plan.protocol.quality_suite is None:
        return []
    return [
        Sample(candidate=candidate, phase="quality", prompt_id=p.id, repeat=0, text="no answer")
        for p in load_suite(plan.protocol.quality_suite).prompts
    ]


def greedy_ids(candidate: str, plan: FrozenPlan, ids: dict[str, list[int]]) -> list[Sample]:
    return [
        Sample(
            candidate=candidate,
            prompt_id=pid,
            repeat=0,
            completion_tokens=len(ids[pid]),
            finish_reason="length",
            text=" ".join(map(str, ids[pid])),
            token_ids=ids[pid],
        )
        for pid in prompts(plan)
    ]


def seal(
    home: Home,
    plan: FrozenPlan,
    baseline: CandidateRun,
    runs: list[CandidateRun],
    outcome: Outcome = Outcome.KEPT_BASELINE,
) -> CycleSummary:
    """Write the cycle's files as `run_cycle` does, select, and seal with the matching outcome
    (``ROLLED_BACK``: the winner is switched in, fails its online check and is switched back,
    as the journal of a real rollback says; nothing is started)."""
    cycle_id = f"c-{utcnow():%Y%m%d-%H%M%S%f}-{plan.content_hash[:6]}"
    cdir = home.cycle_dir(cycle_id)
    write_model(cdir / "plan.json", plan)
    journal = Journal(home, cycle_id)
    started = utcnow()
    journal(CycleState.QUEUED, "plan taken from the queue", plan_id=plan.plan_id)
    journal(CycleState.PREFLIGHT, "checking candidates and the live service")
    manifests = load_registry(extra=home.user_registry)
    recipes = {}
    for run in runs:
        manifest, variant = find_candidate(manifests, run.candidate)  # type: ignore[misc]
        recipes[run.candidate] = resolve_recipe(manifest, variant, home.models, home.hf_cache)
    journal(
        CycleState.PREPARE,
        "artifacts resolved",
        recipes={c: r.model_dump(mode="json") for c, r in recipes.items()},
    )
    live = active_recipe(home)
    journal(
        CycleState.BASELINE,
        "synthetic: the live service's samples are given, not measured",
        recipe=live.candidate_id,
    )
    write_model(cdir / "runs" / "baseline.json", baseline)
    write_model(cdir / "environment.json", fingerprint_environment([live, *recipes.values()]))
    journal(
        CycleState.MAINTENANCE,
        "experiments run on the scratch port; the live service keeps serving",
        expected_downtime_s=0,
    )
    for index, run in enumerate(runs, start=1):
        journal(
            CycleState.EXPERIMENT,
            f"measuring {run.candidate}",
            candidate=run.candidate,
            index=index,
            total=len(runs),
        )
        journal(
            CycleState.EXPERIMENT,
            f"synthetic: {run.candidate}'s samples are given",
            step="measuring",
            candidate=run.candidate,
        )
        recipe = recipes[run.candidate]
        run = run.model_copy(
            update={
                "candidate_class": recipe.candidate_class,
                "semantics": recipe.semantics,
                "knobs": recipe.knobs,
            }
        )
        write_model(cdir / "runs" / f"{run.candidate.replace(':', '__')}.json", run)
    journal(CycleState.SELECT, "selecting by the frozen thresholds")
    ordered = [
        r.model_copy(
            update={
                "candidate_class": recipes[r.candidate].candidate_class,
                "semantics": recipes[r.candidate].semantics,
                "knobs": recipes[r.candidate].knobs,
            }
        )
        for r in runs
    ]
    verdict = select(baseline, ordered, plan.thresholds, plan.protocol, plan.auto_promote)
    write_model(cdir / "verdict.json", verdict)
    if outcome == Outcome.KEPT_BASELINE:
        assert verdict.selected is None, "a cycle that keeps the baseline selected nothing"
        result = CycleResult(Outcome.KEPT_BASELINE, None, verdict.reason)
    else:
        assert outcome == Outcome.ROLLED_BACK and verdict.selected, "a rollback needs a winner"
        winner = recipes[verdict.selected].model_dump(mode="json")
        journal(
            CycleState.PROMOTE,
            f"synthetic: {verdict.selected} started on its own port (nothing ran)",
            step=JournalStep.ENTER,
            recipe=winner,
            previous=live.candidate_id,
        )
        journal(CycleState.VERIFY, "synthetic: the online check", step=JournalStep.ENTER)
        why = f"synthetic: {verdict.selected} did not reproduce its greedy outputs online"
        journal(CycleState.VERIFY, why, step=JournalStep.FAILED)
        journal(CycleState.ROLLBACK, "verification failed", step=JournalStep.ENTER)
        journal(CycleState.ROLLBACK, f"{live.candidate_id} serves", step=JournalStep.DONE)
        result = CycleResult(Outcome.ROLLED_BACK, None, f"{why}; {live.candidate_id} serves")
    return conclude(home, plan, cycle_id, journal, started, result)


def baseline_run(plan: FrozenPlan, greedy: list[Sample], tps: float = 10.0) -> CandidateRun:
    return CandidateRun(
        candidate=BASELINE_ID,
        samples=timing(BASELINE_ID, plan, tps),
        greedy=[s.model_copy(update={"candidate": BASELINE_ID}) for s in greedy],
        peak_memory_gb=0.2,
    )


def seal_one(
    home: Home, plan: FrozenPlan, candidate: str = "demo-tiny:draft-k2", tps: float = 9.0
) -> CycleSummary:
    """Seal ``plan`` with one lossless candidate at a SYNTHETIC ``tps`` against the baseline's
    10 tok/s (slower by default: the cycle keeps the baseline)."""
    ids = {pid: list(range(1, 17)) for pid in prompts(plan)}
    run = CandidateRun(
        candidate=candidate,
        samples=timing(candidate, plan, tps),
        greedy=greedy_ids(candidate, plan, ids),
        peak_memory_gb=0.3,
    )
    return seal(home, plan, baseline_run(plan, greedy_ids("baseline", plan, ids)), [run])


def cheap_seal(home: Home, plan: FrozenPlan) -> CycleSummary:
    """A sealed cycle of fixed timings : kv8 measured, nothing wins."""
    from tests.helpers.synthetic_bundle import baseline_run, greedy_ids, prompts, seal, timing

    ids = {p: [1, 2, 3] for p in prompts(plan)}
    return seal(
        home,
        plan,
        baseline_run(plan, greedy_ids("baseline", plan, ids)),
        [
            CandidateRun(
                candidate="demo-tiny:kv8",
                samples=timing("demo-tiny:kv8", plan, 9.0),
                greedy=greedy_ids("demo-tiny:kv8", plan, ids),
            )
        ],
    )


def real_greedy(base_url: str, candidate: str, plan: FrozenPlan):
    """Greedy outputs of the prompts a cycle's greedy pass sends: the selection prompts of the
    workload's request classes (``measure.start_plan``)."""
    suite = load_suite(plan.protocol.suite)
    classes = {cell.request_class for cell in plan.protocol.workload}
    chosen = [
        p
        for p in suite.prompts
        if p.split == "selection" and request_class_of(p.prompt_class) in classes
    ]
    return [
        bench.greedy_chat(
            base_url,
            p.chat_messages(),
            max_tokens=p.token_budget(plan.protocol.max_tokens),
            timeout=60,
            candidate=candidate,
            prompt_id=p.id,
        )
        for p in chosen
    ]


def write_manifest(home: Home, description: str = "a copy of demo-tiny") -> None:
    """A user manifest `mytiny`: the shipped demo-tiny manifest under another id."""
    data = yaml.safe_load((REPO / "registry" / "demo-tiny.yaml").read_text())
    data.update(id="mytiny", description=description)
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "mytiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
