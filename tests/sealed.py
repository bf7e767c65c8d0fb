"""Seal a cycle's evidence bundle without measuring: for tests of what happens *after* a cycle
(recipe memory, approval). Everything but the timing figures is the product's own code: the plan
is frozen by `app._freeze`, the verdict comes from `selector.select`, the journal from
`cycle.Journal`, and `cycle._seal` seals the bundle (and records recipe memory). Greedy outputs
are given by the caller: synthetic token ids, or real outputs read from real servers.
"""

from __future__ import annotations

from mcp_infra import app, cycle
from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleState,
    CycleSummary,
    FrozenPlan,
    Outcome,
    Sample,
)
from mcp_infra.policy import parse_plan
from mcp_infra.registry import find_candidate, load_registry, resolve_recipe
from mcp_infra.selector import select
from mcp_infra.service import active_recipe
from mcp_infra.store import Home, utcnow, write_model
from mcp_infra.suites import load_suite


def freeze(home: Home, candidates: list[str]) -> FrozenPlan:
    return app._freeze(home, parse_plan({"hypothesis": "test", "candidates": candidates}), "test")


def prompts(plan: FrozenPlan) -> list[str]:
    return [p.id for p in load_suite(plan.protocol.suite).prompts]


def timing(candidate: str, plan: FrozenPlan, tps: float) -> list[Sample]:
    """Measured samples with a fixed decode rate (small, deterministic spread per repeat)."""
    return [Sample(candidate=candidate, prompt_id=pid, repeat=r, order=i, prompt_tokens=20,
                   completion_tokens=32, ttft_s=0.05, decode_s=31 / (tps * (1 + 0.002 * r)),
                   decode_tps=tps * (1 + 0.002 * r),
                   e2e_s=0.06 + 31 / (tps * (1 + 0.002 * r)), finish_reason="length",
                   text="x")
            for i, (r, pid) in enumerate((r, p) for r in range(plan.protocol.repeats)
                                         for p in prompts(plan))]


def greedy_ids(candidate: str, plan: FrozenPlan, ids: dict[str, list[int]]) -> list[Sample]:
    return [Sample(candidate=candidate, prompt_id=pid, repeat=0, completion_tokens=len(ids[pid]),
                   finish_reason="length", text=" ".join(map(str, ids[pid])),
                   token_ids=ids[pid]) for pid in prompts(plan)]


def seal(home: Home, plan: FrozenPlan, baseline: CandidateRun,
         runs: list[CandidateRun]) -> CycleSummary:
    """Write the cycle's files as `run_cycle` does, select, and seal with the matching outcome."""
    cycle_id = f"c-{utcnow():%Y%m%d-%H%M%S%f}-{plan.content_hash[:6]}"
    cdir = home.cycle_dir(cycle_id)
    write_model(cdir / "plan.json", plan)
    journal = cycle.Journal(home, cycle_id)
    started = utcnow()
    journal(CycleState.QUEUED, "plan taken from the queue", plan_id=plan.plan_id)
    manifests = load_registry(extra=home.user_registry)
    recipes = {}
    for run in runs:
        manifest, variant = find_candidate(manifests, run.candidate)  # type: ignore[misc]
        recipes[run.candidate] = resolve_recipe(manifest, variant, home.models, home.hf_cache)
    journal(CycleState.PREPARE, "artifacts resolved",
            recipes={c: r.model_dump(mode="json") for c, r in recipes.items()})
    live = active_recipe(home)
    write_model(cdir / "environment.json", cycle.environment([live, *recipes.values()]))
    write_model(cdir / "runs" / "baseline.json", baseline)
    for run in runs:
        recipe = recipes[run.candidate]
        run = run.model_copy(update={"candidate_class": recipe.candidate_class,
                                     "semantics": recipe.semantics, "knobs": recipe.knobs})
        write_model(cdir / "runs" / f"{run.candidate.replace(':', '__')}.json", run)
    journal(CycleState.SELECT, "selecting by the frozen thresholds")
    ordered = [r.model_copy(update={"candidate_class": recipes[r.candidate].candidate_class,
                                    "semantics": recipes[r.candidate].semantics,
                                    "knobs": recipes[r.candidate].knobs}) for r in runs]
    verdict = select(baseline, ordered, plan.thresholds, plan.protocol, plan.auto_promote)
    write_model(cdir / "verdict.json", verdict)
    assert verdict.selected is None, "these helpers seal cycles that keep the baseline"
    return cycle._seal(home, plan, cycle_id, journal, started, Outcome.KEPT_BASELINE, None,
                       verdict.reason, None)


def baseline_run(plan: FrozenPlan, greedy: list[Sample], tps: float = 10.0) -> CandidateRun:
    return CandidateRun(candidate=BASELINE_ID, samples=timing(BASELINE_ID, plan, tps),
                        greedy=[s.model_copy(update={"candidate": BASELINE_ID}) for s in greedy],
                        peak_memory_gb=0.2)
