"""`mcp-infra approve CYCLE [CANDIDATE]`: a person promotes a "qualified, awaiting approval"
candidate, after a fresh online verification.

A candidate of a class the policy does not auto-promote (quantization, KV cache, runtime upgrade,
model change by default) ends its cycle as *qualified, awaiting approval* and the baseline is
kept. Approving it runs a short cycle of its own, journaled and sealed like any other, and only if
what was measured still describes today:

* the cycle's evidence bundle verifies (hashes, and the verdict recomputed from raw samples);
* the candidate is qualified there, and awaiting approval (not already auto-promotable);
* the live recipe is still the one that cycle measured as its baseline;
* the candidate's manifest is unchanged (same hash), it passes preflight now, its hub artifacts
  match their sha256 inventory, and the environment key is the one it was judged under.

Then: PROMOTE on the stable port → VERIFY online (the same greedy outputs as measured, no new
smoke failure) → COMMIT, or ROLLBACK to the previous recipe. The new bundle carries the original
plan, runs and verdict, so ``evidence verify`` re-checks it the same way.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mcp_infra.contracts import (
    CandidateRun,
    CandidateVerdict,
    CycleState,
    CycleSummary,
    Decision,
    FrozenPlan,
    Outcome,
    Recipe,
    ServiceConfig,
    Verdict,
)
from mcp_infra.core.preflight import preflight
from mcp_infra.core.sanitize import policy_hash
from mcp_infra.core.units import speedup_pct
from mcp_infra.errors import McpInfraError
from mcp_infra.flows.journal import Journal
from mcp_infra.flows.promotion import Promotion, conclude, promote, restore_after_error
from mcp_infra.flows.supervisor import recover, supervising
from mcp_infra.state import evidence, memory
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.context import HomeContext
from mcp_infra.state.hostfacts import folder_fingerprint
from mcp_infra.state.runtimes import RuntimeEnvError
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_journal_file,
    read_model,
    utcnow,
    write_model,
)

__all__ = ["ApprovalRefused", "approve", "awaiting_approval"]


class ApprovalRefused(McpInfraError, RuntimeError):
    """The approval cannot go ahead; the message says why and what to do instead."""


def awaiting_approval(verdict: Verdict) -> list[CandidateVerdict]:
    """Candidates that qualified but whose class the policy does not auto-promote."""
    return [
        c for c in verdict.candidates if c.decision == Decision.QUALIFIED and not c.auto_promote
    ]


def _recipes_of(bundle: Path) -> dict[str, Recipe]:
    events, _ = read_journal_file(CycleFiles(bundle).journal)
    found: dict[str, Recipe] = {}
    for event in events:
        if event.state == CycleState.PREPARE and isinstance(event.fields.get("recipes"), dict):
            for cid, data in event.fields["recipes"].items():
                found[cid] = Recipe.model_validate(data)
    return found


def _run_of(bundle: Path, candidate: str) -> CandidateRun:
    for path in sorted((CycleFiles(bundle).runs).glob("*.json")):
        run = read_model(path, CandidateRun)
        if run.candidate == candidate and run.purpose == "selection":
            return run
    raise ApprovalRefused(f"the bundle holds no measured run of {candidate}")


def _choose(verdict: Verdict, cycle_id: str, candidate: str | None) -> CandidateVerdict:
    waiting = awaiting_approval(verdict)
    names = ", ".join(c.candidate for c in waiting) or "none"
    if candidate is None:
        if len(waiting) == 1:
            return waiting[0]
        if not waiting:
            raise ApprovalRefused(f"cycle {cycle_id} has no candidate awaiting approval")
        raise ApprovalRefused(
            f"cycle {cycle_id} has several candidates awaiting approval ({names}): name one"
        )
    chosen = next((c for c in verdict.candidates if c.candidate == candidate), None)
    if chosen is None:
        raise ApprovalRefused(f"{candidate} was not measured in cycle {cycle_id}")
    if chosen not in waiting:
        why = (
            "it did not qualify"
            if chosen.decision != Decision.QUALIFIED
            else "its class may auto-promote, so the cycle already decided"
        )
        raise ApprovalRefused(
            f"{candidate} is not awaiting approval in cycle {cycle_id}: {why} (awaiting: {names})"
        )
    return chosen


def approve(home: Home, cycle_id: str, candidate: str | None = None) -> CycleSummary:
    """Promote one awaiting candidate of a sealed cycle, after the checks in the module notes.

    Holds the supervisor lock for its whole duration (raises ``store.LockHeld`` if a supervisor
    runs); raises ``ApprovalRefused`` before touching the service if any check fails.
    """
    home.ensure()
    try:
        bundle = evidence.bundle_path(home, cycle_id)
    except FileNotFoundError as exc:
        raise ApprovalRefused(str(exc)) from exc
    cycle_id = bundle.name  # `latest` names the newest sealed cycle
    with supervising(home):
        recover(home)  # an interrupted cycle is finished or undone first, as at supervise
        if (home.needs_operator_file).exists():
            raise ApprovalRefused("the service needs an operator first: run `mcp-infra recover`")
        summary, verdict, plan = _sealed(bundle, cycle_id)
        chosen = _choose(verdict, cycle_id, candidate)
        ctx = HomeContext(home)
        recipe = _as_measured(ctx, bundle, cycle_id, summary.active_recipe, chosen.candidate)
        gain = chosen.speedup_estimate
        speedup = speedup_pct(gain) if gain is not None else None
        promotion = Promotion(recipe, _run_of(bundle, chosen.candidate), verdict, speedup)
        return _approval_cycle(
            home, ctx.config, plan, bundle, cycle_id, ctx.live, promotion, chosen
        )


def _sealed(bundle: Path, cycle_id: str) -> tuple[CycleSummary, Verdict, FrozenPlan]:
    """The bundle's summary, verdict and plan, once the bundle verifies."""
    check = evidence.verify(bundle)
    if not check.ok:
        raise ApprovalRefused(
            f"the evidence of {cycle_id} does not verify: " + "; ".join(check.problems[:3])
        )
    try:
        return (
            read_model(CycleFiles(bundle).summary, CycleSummary),
            read_model(CycleFiles(bundle).verdict, Verdict),
            read_model(CycleFiles(bundle).plan, FrozenPlan),
        )
    except (FileNotFoundError, CorruptFile) as exc:
        raise ApprovalRefused(f"the bundle of {cycle_id} is incomplete: {exc}") from exc


def _as_measured(ctx: HomeContext, bundle: Path, cycle_id: str, baseline: str, name: str) -> Recipe:
    """The candidate's recipe now, refused unless what the cycle measured still describes it:
    the same live recipe as its baseline, in the registry and passing preflight, the same
    manifest and recipe (artifacts and runtime re-hashed), environment and policy."""
    home, live = ctx.home, ctx.live
    if baseline != live.candidate_id:
        raise ApprovalRefused(
            f"the live recipe is {live.candidate_id}, not {baseline} that cycle "
            f"{cycle_id} measured as its baseline: propose a new cycle with {name}"
        )
    measured = _recipes_of(bundle).get(name)
    found = ctx.find(name)
    if measured is None or found is None:
        raise ApprovalRefused(
            f"{name} is no longer in the registry or was not resolved in cycle {cycle_id}"
        )
    manifest, variant = found
    pre = preflight(manifest, variant, ctx.policy, ctx.facts, require_artifacts=True)
    if not pre.passed:
        raise ApprovalRefused(f"{name} fails preflight now: " + "; ".join(pre.failures()))
    try:  # hub artifacts and the runtime environment: sha256 checks
        recipe = resolve_recipe(
            manifest,
            variant,
            home.models,
            home.hf_cache,
            fingerprint=folder_fingerprint,
            runtimes=home.runtimes,
            builds=home.builds,
        )
    except RuntimeEnvError as exc:
        raise ApprovalRefused(f"{name}: {exc}") from exc
    if recipe.manifest_hash != measured.manifest_hash:
        raise ApprovalRefused(
            f"the manifest of {name} changed since cycle {cycle_id}: propose a new cycle"
        )
    if recipe.key() != measured.key():
        raise ApprovalRefused(
            f"{name} now resolves to another recipe than cycle {cycle_id} "
            "measured: propose a new cycle"
        )
    remembered = next((o for o in memory.outcomes(home, name) if o.cycle_id == cycle_id), None)
    env_key = memory.environment_key(memory.environment(), recipe)
    if remembered is not None and remembered.environment_key != env_key:
        raise ApprovalRefused(
            f"the environment (runtime packages, model files or machine) "
            f"changed since cycle {cycle_id}: propose a new cycle"
        )
    if remembered is not None and remembered.policy_hash != policy_hash(ctx.policy):
        raise ApprovalRefused(f"the policy changed since cycle {cycle_id}: propose a new cycle")
    return recipe


def _approval_cycle(
    home: Home,
    config: ServiceConfig,
    plan: FrozenPlan,
    bundle: Path,
    source: str,
    live: Recipe,
    promotion: Promotion,
    chosen: CandidateVerdict,
) -> CycleSummary:
    recipe = promotion.recipe
    cycle_id = f"c-{utcnow():%Y%m%d-%H%M%S}-approve-{plan.content_hash[:6]}"
    cdir = home.cycle_dir(cycle_id)
    (CycleFiles(cdir).runs).mkdir(parents=True, exist_ok=True)
    write_model(CycleFiles(cdir).plan, plan)
    for name in (CycleFiles.ENVIRONMENT, CycleFiles.VERDICT):
        if (bundle / name).exists():
            shutil.copy2(bundle / name, cdir / name)
    for path in sorted((CycleFiles(bundle).runs).glob("*.json")):
        shutil.copy2(path, CycleFiles(cdir).runs / path.name)
    journal = Journal(home, cycle_id)
    started = utcnow()
    journal(
        CycleState.QUEUED,
        f"approval of {recipe.candidate_id} from cycle {source}",
        plan_id=plan.plan_id,
        approval_of=source,
        candidate=recipe.candidate_id,
        recipe=recipe.model_dump(mode="json"),
    )
    journal(
        CycleState.PREFLIGHT,
        "approval checks passed: evidence verifies, same baseline, "
        "manifest, policy and environment; artifacts match their inventory",
    )
    journal(
        CycleState.PREPARE,
        "the measured recipe",
        recipes={recipe.candidate_id: recipe.model_dump(mode="json")},
    )
    try:
        result = promote(home, config, plan, journal, live, promotion)
        if result.outcome == Outcome.PROMOTED:
            result = result._replace(
                reason=f"approved by a person from cycle {source}; "
                f"verified online; {chosen.reasons[0]}"
            )
    except Exception as exc:  # as in run_cycle: restore, then account for it
        result = restore_after_error(home, journal, exc)
    return conclude(home, plan, cycle_id, journal, started, result)
