"""What a plan costs before it runs, priced on this machine: the product's own round loop
(``flows.simulation.project``) over the timings this home's sealed bundles measured.

The ``this-home`` profile (``profile_from_bundle``) is this machine as a sealed bundle measured
it; ``plan_cost`` prices a plan on this home's newest bundles, cached by what it was priced from,
for ``propose_plan``, ``registry`` and ``status`` (docs/cost.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    ConfigTruth,
    CycleState,
    CycleSummary,
    EffectiveThresholds,
    EnvironmentFingerprint,
    Event,
    FrozenPlan,
    MeasureProtocol,
    Plan,
    PlanCost,
    Policy,
    Recipe,
    Sample,
    TargetProfile,
    Verdict,
)
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.core.screening import screens
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.flows.measure import (
    timed_tokens,
)
from mcp_infra.flows.projection_jobs import (
    BACKGROUND,
    NICE,
    ProjectionJob,
    ProjectionJobs,
    failed_projection,
)
from mcp_infra.flows.simulation import Projection, Setting, project, prompt_tokens, sim_recipe
from mcp_infra.state.catalog import load_policy, load_suite
from mcp_infra.state.evidence import list_cycles
from mcp_infra.state.filecache import load_yaml
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    private_dir,
    read_journal_file,
    read_model,
    read_optional,
    sha256_file,
    write_model,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def simulated_plan(policy: Policy, candidates: Sequence[str]) -> FrozenPlan:
    """A plan of ``candidates`` frozen under ``policy``'s defaults, as the sanitizer would
    freeze it with no tightening (the projection's input when no real plan is given)."""
    t = policy.thresholds
    thresholds = EffectiveThresholds(
        min_speedup_pct=t.min_speedup_pct.default,
        max_peak_memory_gb=t.max_peak_memory_gb.default,
        max_error_rate=t.max_error_rate,
        worst_prompt_tolerance_pct=t.worst_prompt_tolerance_pct,
        quality_budget=t.quality_budget,
    )
    return FrozenPlan(
        plan_id="projected",
        created_at=EPOCH,
        proposed_by="projection",
        proposed=Plan(hypothesis="projection", candidates=list(candidates)),
        candidates=[BASELINE_ID, *candidates],
        thresholds=thresholds,
        protocol=policy.protocol,
        auto_promote=policy.auto_promote,
        changes=[],
        refused=[],
        registry_hash="",
        policy_hash="",
    )


# ---------------------------------------------------------------------------------------------
# The this-home profile: a sealed bundle's own measured timings
# ---------------------------------------------------------------------------------------------

SERIAL_SHARE = 0.7
"""At n requests in flight, a configuration whose requests each still decode at more than this
share of their one-at-a-time speed is serving them one after another (no batching)."""

ASSUMED_SPREAD = 0.05


class MeasuredCost(NamedTuple):
    """What a sealed cycle cost: its wall time (summary started_at..ended_at) and the requests
    its servers answered (every sample of every run, the live check and the online check)."""

    wall_s: float
    requests: int


class BundleProfile(NamedTuple):
    """A sealed bundle read as a projection's inputs: the profile of this machine, the truths of
    its plan's candidates, the frozen plan, the recipes (their knobs decide greedy passes and
    the quality suite), the policy it ran under (None if the bundle lacks it) and what it cost."""

    profile: TargetProfile
    truths: dict[str, ConfigTruth]
    plan: FrozenPlan
    recipes: dict[str, Recipe]
    policy: Policy | None
    measured: MeasuredCost
    exclusive: bool | None = None
    answers_kept: bool = False  # its baseline took its greedy pass from an earlier cycle


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _start_request_s(samples: Sequence[Sample]) -> float:
    """Seconds one start spent answering requests: timed requests as the union of their send
    intervals (a concurrency-n batch overlaps), greedy and quality requests (sent one after
    another, untimed sends) as the sum of their durations."""
    spans = sorted(
        (s.t_mono, s.t_mono + s.e2e_s)
        for s in samples
        if s.t_mono is not None and s.e2e_s is not None
    )
    total, end = 0.0, -math.inf
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    untimed = sum(s.e2e_s or 0.0 for s in samples if s.t_mono is None)
    return total + untimed


def _all_samples(run: CandidateRun) -> list[Sample]:
    return [*run.samples, *run.greedy]


def _load_s(runs: Sequence[CandidateRun]) -> float | None:
    """Median over a configuration's starts of the start's span minus its request time, plus
    the time it first waited for a quiet machine: the wait, the load, the readiness probe, the
    gaps between requests and the stop, all that a start costs besides answering."""
    out = []
    for run in runs:
        by_start: dict[int, list[Sample]] = {}
        for sample in _all_samples(run):
            by_start.setdefault(sample.start, []).append(sample)
        for record in run.rounds:
            if record.error:
                continue
            span = (record.ended_at - record.started_at).total_seconds()
            waited = (record.machine.waited_s if record.machine else None) or 0.0
            out.append(max(0.0, span - _start_request_s(by_start.get(record.start, []))) + waited)
    return _median(out)


def _chars(prompt: SuitePrompt) -> int:
    return sum(len(m.content) for m in prompt.messages)


def _chars_per_token(samples: Sequence[Sample], prompts: dict[str, SuitePrompt]) -> float:
    """Median characters per prompt token over the samples' prompts (4.0 where none says)."""
    ratios = [
        _chars(prompts[s.prompt_id]) / s.prompt_tokens
        for s in samples
        if s.prompt_id in prompts and s.prompt_tokens
    ]
    return round(_median(ratios) or 4.0, 3)


def _batches(samples: Sequence[Sample]) -> list[list[Sample]]:
    """Timed samples sent together: same start and send order (a batch shares its ``order``)."""
    groups: dict[tuple[int, int, str], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.start, s.order, s.phase), []).append(s)
    return list(groups.values())


def _config_truth(
    runs: Sequence[CandidateRun],
    prompts: dict[str, SuitePrompt],
    protocol: MeasureProtocol,
    chars_per_token: float,
    diverges: bool,
) -> ConfigTruth | None:
    """One configuration's truth from its measured starts (selection and held-out runs)."""
    timed = [
        s
        for run in runs
        for s in run.samples
        if s.phase in ("measure", "heldout") and not s.error and s.e2e_s and s.ttft_s is not None
    ]
    solo = [s for s in timed if s.concurrency == 1 and s.prompt_id in prompts]
    if not solo:
        return None

    def sim_tokens(s: Sample) -> int:
        return timed_tokens(prompts[s.prompt_id], protocol)

    def sim_prompt(s: Sample) -> int:
        return prompt_tokens(prompts[s.prompt_id], chars_per_token)

    def e2e(s: Sample) -> float:
        return s.e2e_s or 0.0  # timed samples have both times

    def ttft(s: Sample) -> float:
        return s.ttft_s or 0.0

    def sent(s: Sample) -> float:
        return s.t_mono or 0.0  # the batches kept below all have one

    # Rates that give each measured request its measured time when the simulation sends the
    # tokens it sends (a prompt's budget): answers that stop early are priced as they ran.
    decode = _median([sim_tokens(s) / (e2e(s) - ttft(s)) for s in solo if e2e(s) > ttft(s)])
    prefill = _median([sim_prompt(s) / ttft(s) for s in solo if ttft(s) > 0])
    if decode is None or prefill is None:
        return None
    batch: dict[int, float] = {}
    for n in sorted({s.concurrency for s in timed if s.concurrency > 1}):
        group = [b for b in _batches([s for s in timed if s.concurrency == n]) if len(b) == n]
        group = [b for b in group if all(s.prompt_id in prompts and s.t_mono for s in b)]
        share = _median([s.decode_tps for b in group for s in b if s.decode_tps])
        alone = _median([s.decode_tps for s in solo if s.decode_tps])
        if not group or share is None or alone is None or share > SERIAL_SHARE * alone:
            continue  # served one after another: the simulation's serial model
        rates = []
        for b in group:
            wall = max(sent(s) + e2e(s) for s in b) - min(sent(s) for s in b)
            tokens = statistics.mean(sim_tokens(s) for s in b)
            fill = n * statistics.mean(sim_prompt(s) for s in b) / prefill
            rates.append(n * tokens / max(wall - fill, 0.1 * wall))
        batch[n] = round(statistics.median(rates), 3)
    peaks = [r.peak_memory_gb for r in runs if r.peak_memory_gb]
    return ConfigTruth(
        decode_tps=round(decode, 3),
        batch_tps=batch,
        prefill_tps=round(prefill, 3),
        load_s=round(_load_s(runs) or 0.0, 3),
        peak_gb=round(max(peaks), 4) if peaks else None,
        diverges=diverges,
    )


def _spreads(runs: Sequence[CandidateRun]) -> tuple[float | None, float | None]:
    """Start-to-start and request-to-request spread (sd of log decode tok/s) of the selection
    runs' one-at-a-time requests, prompt effects removed, pooled over configurations: within a
    start the residual spread; between starts the spread of the start means less the part the
    requests' own spread explains."""
    within_ss = within_df = 0.0
    between_ss = between_df = 0.0
    per_start_k: list[int] = []
    for run in runs:
        rows = [
            (s.start, s.prompt_id, math.log(s.decode_tps))
            for s in run.samples
            if s.phase == "measure" and s.concurrency == 1 and s.decode_tps and not s.error
        ]
        if len(rows) < 3:
            continue
        grand = statistics.mean(x for _, _, x in rows)
        by_prompt: dict[str, list[float]] = {}
        for _, p, x in rows:
            by_prompt.setdefault(p, []).append(x)
        effect = {p: statistics.mean(xs) - grand for p, xs in by_prompt.items()}
        by_start: dict[int, list[float]] = {}
        for s, p, x in rows:
            by_start.setdefault(s, []).append(x - effect[p])
        means = {s: statistics.mean(ys) for s, ys in by_start.items()}
        within_ss += sum((y - means[s]) ** 2 for s, ys in by_start.items() for y in ys)
        within_df += len(rows) - len(by_start) - len(by_prompt) + 1
        if len(means) > 1:
            between_ss += statistics.variance(means.values()) * (len(means) - 1)
            between_df += len(means) - 1
            per_start_k += [len(ys) for ys in by_start.values()]
    request = math.sqrt(within_ss / within_df) if within_df > 0 else None
    if between_df <= 0:
        return None, request
    k = statistics.mean(per_start_k)
    start = math.sqrt(max(0.0, between_ss / between_df - (request or 0.0) ** 2 / k))
    return start, request


def _exclusive(journal: Sequence[Event]) -> bool | None:
    """The memory mode the cycle ran in (its MAINTENANCE line), None if it never said."""
    for event in journal:
        if event.state == CycleState.MAINTENANCE and event.fields.get("mode") in (
            "concurrent",
            "exclusive",
        ):
            return event.fields["mode"] == "exclusive"
    return None


def _live_recipe_id(journal: Sequence[Event]) -> str | None:
    for event in journal:
        if event.state == CycleState.BASELINE and isinstance(event.fields.get("recipe"), str):
            return str(event.fields["recipe"])
    return None


def profile_from_runs(
    plan: FrozenPlan,
    runs: Sequence[CandidateRun],
    verdict: Verdict | None,
    memory_gb: float,
    *,
    name: str = "this-home",
    live_recipe: str | None = None,
    source: str | None = None,
) -> tuple[TargetProfile, dict[str, ConfigTruth]]:
    """The profile of the machine a cycle ran on, from its measured runs: per configuration the
    one-request decode and prefill rates, the aggregate rate at each concurrency it batched
    (none where it served requests one after another), the load (a start's span less its
    requests), the peak memory and whether its lossless gate failed; the spreads between starts
    and between requests. ``profile.candidates`` holds every measured configuration by id (the
    live recipe's id for the baseline, when known), so a later plan can refer to them."""
    suite = load_suite(plan.protocol.suite)
    prompts = {p.id: p for p in suite.prompts}
    cpt = _chars_per_token([s for run in runs for s in run.samples], prompts)
    failed = {
        v.candidate
        for v in (verdict.candidates if verdict else [])
        if any(g.gate == "lossless" and not g.passed for g in v.gates)
    }
    measured = [r for r in runs if r.purpose in ("selection", "heldout")]
    truths: dict[str, ConfigTruth] = {}
    for config in plan.candidates:
        mine = [r for r in measured if r.candidate == config]
        truth = _config_truth(mine, prompts, plan.protocol, cpt, config in failed)
        if truth is not None:
            truths[config] = truth
    if BASELINE_ID not in truths:
        raise ValueError("the bundle has no measured baseline run to derive a profile from")
    start, request = _spreads([r for r in runs if r.purpose == "selection"])
    base = truths.pop(BASELINE_ID)
    named = dict(truths)
    if live_recipe:
        named[live_recipe] = base
    source = source or f"plan {plan.plan_id}"
    assumptions = [
        f"derived from the runs measured on this machine in {source}",
        "every request is priced at its prompt's full budget; rates are scaled so each "
        "measured request takes the time it took",
        "a configuration whose requests at n in flight each kept over "
        f"{SERIAL_SHARE:.0%} of their one-at-a-time speed is served one after another",
        "load_s: a start's span less the time its requests took, plus its wait for a quiet "
        "machine (service.quiet_cpu_fraction) as this cycle waited (load, readiness probe, "
        "gaps between requests and the stop)",
    ]
    if start is None or request is None:
        assumptions.append(
            f"spread not measurable from this bundle: {ASSUMED_SPREAD:.0%} assumed where missing"
        )
    profile = TargetProfile(
        name=name,
        description=f"this machine, as measured in {source}",
        assumptions=assumptions,
        memory_gb=memory_gb,
        baseline=base,
        candidates=named,
        start_spread=round(start if start is not None else ASSUMED_SPREAD, 4),
        request_spread=round(request if request is not None else ASSUMED_SPREAD, 4),
        chars_per_token=cpt,
    )
    return profile, truths


def recipes_of(plan: FrozenPlan, runs: Sequence[CandidateRun]) -> dict[str, Recipe]:
    """Each candidate of the plan as the projection needs its recipe: knobs and semantics (a
    prompt cache means two greedy passes, a lossy candidate the quality suite)."""
    out: dict[str, Recipe] = {}
    for run in runs:
        if run.candidate in plan.candidates[1:] and run.purpose == "selection":
            out[run.candidate] = sim_recipe(run.candidate, run.semantics.value).model_copy(
                update={"knobs": run.knobs, "candidate_class": run.candidate_class}
            )
    return out


def replay(found: BundleProfile, seed: int, policy: Policy | None = None) -> Projection:
    """The bundle's own plan projected on its own profile, in the memory mode it ran in."""
    policy = policy or found.policy or load_policy("default")
    return project(
        found.plan,
        found.profile,
        found.truths,
        Setting.of(policy, seed, exclusive=found.exclusive, reference=found.answers_kept),
        found.recipes,
    )


def measured_cost(bundle: Path) -> MeasuredCost:
    """A sealed cycle's wall time and the requests its servers answered."""
    files = CycleFiles(bundle)
    summary = read_model(files.summary, CycleSummary)
    requests = 0
    for path in sorted(files.runs.glob("*.json")):
        run = read_model(path, CandidateRun)
        requests += len(run.samples) + len(run.greedy)
    online = bundle / "online.json"
    if online.exists():
        requests += len(read_model(online, CandidateRun).samples)
    return MeasuredCost((summary.ended_at - summary.started_at).total_seconds(), requests)


def profile_from_bundle(bundle: Path) -> BundleProfile:
    """The this-home profile of a sealed bundle (``profile_from_runs`` over its files), with its
    plan, recipes, policy and measured cost: what ``project`` needs to replay its plan."""
    files = CycleFiles(bundle)
    plan = read_model(files.plan, FrozenPlan)
    runs = [read_model(p, CandidateRun) for p in sorted(files.runs.glob("*.json"))]
    verdict = read_optional(files.verdict, Verdict)
    env = read_optional(files.environment, EnvironmentFingerprint)
    events, _ = read_journal_file(files.journal)
    memory_gb = env.memory_gb if env else 0.0
    if memory_gb <= 0:
        raise ValueError(f"{bundle} has no environment.json with the machine's memory")
    profile, truths = profile_from_runs(
        plan, runs, verdict, memory_gb, live_recipe=_live_recipe_id(events), source=bundle.name
    )
    policy_file = bundle / "inputs" / "policy.yaml"
    policy = Policy.model_validate(load_yaml(policy_file)) if policy_file.exists() else None
    return BundleProfile(
        profile,
        truths,
        plan,
        recipes_of(plan, runs),
        policy,
        measured_cost(bundle),
        _exclusive(events),
        any(r.reference is not None and r.reference.greedy > 0 for r in runs),
    )


# ---------------------------------------------------------------------------------------------
# The cost said before it is spent: a plan projected on this home's measured timings
# ---------------------------------------------------------------------------------------------

COST_SEEDS = 3
COST_RESAMPLES = 200
"""Bootstrap resamples of the projected selector calls: the cost of a plan is its rounds and
requests, which do not move with the last digits of an interval's bound (a plan's own cycle
keeps its protocol's resamples)."""
COST_BUNDLES = 3
COST_METHOD = 3
"""Part of every cached projection's key: raise it when what a projection prices changes."""
CACHE_KEEP = 64
NO_FIGURES = (
    "no sealed cycle in this home to take measured timings from, and the registry's "
    "manifests state no speed or load figures (only memory and disk); a first cycle prices "
    "its plan once it has measured the live service, and `status` shows it"
)


def sealed_bundles(home: Home, limit: int = COST_BUNDLES) -> list[Path]:
    """This home's newest sealed bundles that measured something, newest first: a cycle
    refused before any start (a stranger on the port, a failed preflight) has no timings."""
    out: list[Path] = []
    for summary in list_cycles(home):
        files = home.bundle_files(summary.cycle_id)
        if files.is_sealed() and files.environment.exists() and any(files.runs.glob("*.json")):
            out.append(files.root)
        if len(out) >= limit:
            break
    return out


def home_profile(bundles: Sequence[Path]) -> BundleProfile:
    """The newest bundle's profile (its machine, spreads and plan), with the configurations
    that only older bundles measured added to ``profile.candidates``."""
    newest = profile_from_bundle(bundles[0])
    named = dict(newest.profile.candidates)
    for older in bundles[1:]:
        try:
            other = profile_from_bundle(older)
        except (ValueError, CorruptFile, OSError, ValidationError):
            continue
        for cid, truth in other.profile.candidates.items():
            named.setdefault(cid, truth)
    profile = newest.profile.model_copy(update={"candidates": named})
    return newest._replace(profile=profile)


def priced(
    profile: TargetProfile, candidates: Sequence[str], live_recipe: str
) -> tuple[TargetProfile, dict[str, ConfigTruth], list[str]] | str:
    """The profile with the live recipe as its baseline and each candidate's measured truth (one
    never measured here is priced as the live recipe: no gain), the assumptions that took; or
    why the plan cannot be priced from this profile."""
    base = profile.candidates.get(live_recipe)
    if base is None:
        return f"the live recipe {live_recipe} was not measured in this home's sealed cycles"
    truths: dict[str, ConfigTruth] = {}
    notes: list[str] = []
    for cid in candidates:
        truth = profile.candidates.get(cid)
        if truth is None:
            notes.append(f"{cid} was never measured here: priced as the live recipe (no gain)")
            truth = base.model_copy(update={"diverges": False})
        truths[cid] = truth
    return profile.model_copy(update={"baseline": base}), truths, notes


def _cost_key(
    bundles: Sequence[Path],
    plan: FrozenPlan,
    policy: Policy,
    live_recipe: str,
    mode: str,
    recipes: Mapping[str, Recipe],
    seeds: int,
    answers_kept: bool,
) -> str:
    parts = {
        "answers_kept": answers_kept,
        "method": COST_METHOD,
        "bundles": [sha256_file(CycleFiles(b).manifest) for b in bundles],
        "candidates": plan.candidates,
        "thresholds": plan.thresholds.model_dump(mode="json"),
        "protocol": plan.protocol.model_dump(mode="json"),
        "auto_promote": {str(k): v for k, v in plan.auto_promote.items()},
        "recipes": {
            c: r.model_dump(mode="json", include={"knobs", "semantics"})
            for c, r in sorted(recipes.items())
        },
        "live": live_recipe,
        "mode": mode,
        "cycle_minutes": policy.budgets.cycle_minutes,
        "seeds": seeds,
        "resamples": COST_RESAMPLES,
    }
    return sha256_bytes(json.dumps(parts, sort_keys=True, default=str).encode())[:40]


def project_cost(
    bundles: Sequence[Path],
    plan: FrozenPlan,
    policy: Policy,
    live_recipe: str,
    mode: Literal["concurrent", "exclusive"],
    recipes: Mapping[str, Recipe],
    seeds: int = COST_SEEDS,
    answers_kept: bool = False,
) -> PlanCost:
    """``plan`` projected over ``seeds`` seeds on the profile of ``bundles`` (newest first),
    in the memory mode the cycle's admission would choose now; ``answers_kept``: the live
    configuration's greedy passes are kept from an earlier cycle (``core.reference``)."""
    cost = partial(PlanCost, configurations=plan.candidates, mode=mode)
    if not bundles:
        return cost(basis="unknown", why=NO_FIGURES)
    cycles = [b.name for b in bundles]
    try:
        found = home_profile(bundles)
    except (ValueError, CorruptFile, OSError, ValidationError) as exc:
        why = f"this home's newest sealed cycle {cycles[0]} could not be read: {exc}"
        return cost(basis="unknown", why=why[:1000], source=cycles)
    got = priced(found.profile, plan.candidates[1:], live_recipe)
    if isinstance(got, str):
        return cost(basis="unknown", why=got, source=cycles)
    profile, truths, notes = got
    return cost(
        basis="this-home",
        why=f"the product's own round loop over the timings measured in {cycles[0]}",
        source=cycles,
        assumptions=[*notes, *[KEPT] * answers_kept, *profile.assumptions][:20],
        answers_kept=answers_kept,
        **_projected(plan, profile, truths, policy, mode, recipes, seeds, answers_kept),
    )


def _projected(
    plan: FrozenPlan,
    profile: TargetProfile,
    truths: dict[str, ConfigTruth],
    policy: Policy,
    mode: Literal["concurrent", "exclusive"],
    recipes: Mapping[str, Recipe],
    seeds: int,
    kept: bool = False,
) -> dict[str, Any]:
    """A PlanCost's figures: ``plan`` projected on ``profile`` over ``seeds`` seeds in the
    memory mode ``mode`` (``kept``: the baseline's answers kept), bootstrap resamples capped at
    ``COST_RESAMPLES``."""
    protocol = plan.protocol.model_copy(
        update={"bootstrap_resamples": min(plan.protocol.bootstrap_resamples, COST_RESAMPLES)}
    )
    quick = plan.model_copy(update={"protocol": protocol})
    exclusive = mode == "exclusive"
    runs = [
        project(
            quick,
            profile,
            truths,
            Setting.of(policy, seed, exclusive=exclusive, reference=kept),
            recipes,
        )
        for seed in range(seeds)
    ]
    outcomes: dict[str, int] = {}
    screened_out: dict[str, int] = {}
    for run in runs:
        outcomes[run.outcome] = outcomes.get(run.outcome, 0) + 1
        for name in run.screened_out:
            screened_out[name] = screened_out.get(name, 0) + 1
    screening = statistics.median(r.screening_s for r in runs) / 60
    return {
        "minutes": round(statistics.median(r.minutes for r in runs), 2),
        "minutes_high": round(max(r.minutes for r in runs), 2),
        "screening_minutes": round(screening, 2) if screens(plan) else None,
        "deciding_minutes": round(
            statistics.median(r.minutes - r.screening_s / 60 for r in runs), 2
        ),
        "screened_out": screened_out,
        "rounds": round(statistics.median(r.rounds for r in runs)),
        "requests": round(statistics.median(r.requests for r in runs)),
        "unserved_s": round(statistics.median(r.unserved_s for r in runs), 1),
        "seeds": seeds,
        "outcomes": outcomes,
    }


class LiveService(NamedTuple):
    """The live service as a cycle's BASELINE step measured it: its run (short requests one at a
    time), the seconds its backend took from start until it answered, the machine's memory."""

    run: CandidateRun
    ready_s: float | None
    memory_gb: float


def live_cost(
    plan: FrozenPlan,
    live: LiveService,
    policy: Policy,
    mode: Literal["concurrent", "exclusive"],
    recipes: Mapping[str, Recipe],
    seeds: int = COST_SEEDS,
) -> PlanCost:
    """A home's first projection, made where no sealed cycle has measured anything: ``plan``
    priced on the live service as its BASELINE step measured it, every configuration as the
    live recipe (its decode and prefill rates, its readiness time as each start's load)."""
    cost = partial(PlanCost, configurations=plan.candidates, mode=mode)
    prompts = {p.id: p for p in load_suite(plan.protocol.suite).prompts}
    cpt = _chars_per_token(live.run.samples, prompts)
    truth = _config_truth([live.run], prompts, plan.protocol, cpt, diverges=False)
    if truth is None or not live.ready_s or live.memory_gb <= 0:
        missing = "no timed answer" if truth is None else "no readiness time or memory"
        why = f"the live service's measure at BASELINE had {missing} to price the plan from"
        return cost(basis="unknown", why=why)
    truth = truth.model_copy(update={"load_s": round(live.ready_s, 3)})
    profile = TargetProfile(
        name="live-service",
        description="the live service as this cycle's BASELINE step measured it",
        assumptions=[
            "every configuration is priced as the live recipe (no gain): nothing else has been "
            "measured in this home",
            f"each start loads in the live backend's own {live.ready_s:.0f} s to readiness",
            "the live service's rates were measured beside whatever traffic it served",
            f"spread between starts and between requests: {ASSUMED_SPREAD:.0%} assumed",
        ],
        memory_gb=live.memory_gb,
        baseline=truth,
        start_spread=ASSUMED_SPREAD,
        request_spread=ASSUMED_SPREAD,
        chars_per_token=cpt,
    )
    truths = dict.fromkeys(plan.candidates[1:], truth)
    return cost(
        basis="live-service",
        why="the product's own round loop over the live service measured at BASELINE",
        assumptions=profile.assumptions,
        **_projected(plan, profile, truths, policy, mode, recipes, seeds),
    )


class LiveRecipe(NamedTuple):
    """The live configuration a plan is priced against: its id, and whether its greedy pass
    is kept from an earlier cycle (``flows.answers.kept_for``)."""

    candidate_id: str
    answers_kept: bool = False


KEPT = "the baseline's greedy outputs are kept from an earlier cycle of the same configuration"


# project_cost's parameters with a home instead of bundles: it finds them, caches, may defer.
def plan_cost(
    home: Home,
    plan: FrozenPlan,
    policy: Policy,
    live: LiveRecipe,
    mode: Literal["concurrent", "exclusive"],
    recipes: Mapping[str, Recipe],
    *,
    wait: bool = True,
    seeds: int = COST_SEEDS,
) -> PlanCost:
    """``project_cost`` on this home's newest sealed bundles, kept in the home's projection
    cache (``state/projections/``) under a key of the bundles' signed manifests, the plan, the
    recipes, the live recipe and the mode. ``wait=False`` (a read that must stay fast): a
    projection not in the cache yet is computed in the background and ``pending`` returned."""
    bundles = sealed_bundles(home)
    if not bundles:
        return PlanCost(basis="unknown", why=NO_FIGURES, configurations=plan.candidates, mode=mode)
    live_recipe, kept = live
    key = _cost_key(bundles, plan, policy, live_recipe, mode, recipes, seeds, kept)
    path = home.projections / f"{key}.json"
    with contextlib.suppress(CorruptFile):
        if (cached := read_optional(path, PlanCost)) is not None:
            return cached
    job = ProjectionJob(
        path=str(path),
        bundles=[str(b) for b in bundles],
        plan=plan,
        policy=policy,
        live_recipe=live_recipe,
        mode=mode,
        recipes=dict(recipes),
        seeds=seeds,
        answers_kept=kept,
    )
    if wait:
        return keep_projection(job)
    BACKGROUND.submit(key, job)
    return PlanCost(
        basis="pending",
        why=f"being projected from {bundles[0].name} (a few seconds); ask again",
        configurations=plan.candidates,
        mode=mode,
    )


def keep_projection(job: ProjectionJob) -> PlanCost:
    """Compute one projection and keep it in the home's projection cache (a projection never
    breaks the answer it is part of: one that fails is kept with the reason)."""
    try:
        cost = project_cost(
            [Path(b) for b in job.bundles],
            job.plan,
            job.policy,
            job.live_recipe,
            job.mode,
            job.recipes,
            job.seeds,
            job.answers_kept,
        )
    except Exception as exc:  # noqa: BLE001  said in the answer instead
        cost = failed_projection(job, f"{type(exc).__name__}: {exc}")
    path = Path(job.path)
    private_dir(path.parent)
    write_model(path, cost)
    _prune(path.parent)
    return cost


def _prune(folder: Path, keep: int = CACHE_KEEP) -> None:
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """A child of ``projection_jobs.run_batch``: compute and keep every job of the file
    ``argv[0]``, at low priority."""
    with contextlib.suppress(OSError):
        os.nice(NICE)
    for job in read_model(Path(argv[0]), ProjectionJobs).jobs:
        keep_projection(job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
