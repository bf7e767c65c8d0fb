"""Recipe memory: what every sealed cycle learned about every candidate, and what it implies.

Each sealed cycle leaves ``memory/<cycle_id>.json`` (a ``CycleMemory``): per candidate its
decision, reasons, gate results and figures, with the manifest hash, the policy hash and an
*environment key* it was judged under. The environment key is a sha256 over

* the machine: operating system, architecture, CPU model, Python major.minor, the BLAS preload;
* the runtime: installed versions of mlx, mlx-lm and mlx-vlm;
* the candidate's own artifacts: a hub snapshot by its sha256 inventory digest (or repo@revision),
  a local folder by the bytes of its small files and the size and mtime of its large ones.

**Skip rule** (``skips``, used when a plan is frozen): a candidate whose latest remembered outcome,
under the *same* manifest hash, policy hash and environment key, failed a gate that does not
depend on the plan (``lossless``, ``smoke``, ``quality``, ``agreement``; ``memory`` only if it
failed under a cap at least as loose as the policy's) is refused with a reason naming the cycle and
the gate. Change any of them — edit the manifest, upgrade mlx-vlm, rebuild the model, change the
policy — and it runs again. Measurements that were merely too slow or inconclusive are never
skipped: noise is not a reason to stop measuring. Nor is a gate that failed in a run whose
requests went unanswered (a server killed for memory, a rank that died, a hang): it judged the
machine's moment, not the recipe's answers.

Only the supervisor writes (``record``, at sealing); everything else reads. A sealed bundle that
was never recorded (a crash between sealing and recording, or bundles older than this module) is
read from the bundle on the fly, with its environment from its own ``environment.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mcp_infra.contracts import (
    CandidateRun,
    CandidateVerdict,
    CycleMemory,
    CycleSummary,
    Decision,
    EnvironmentFingerprint,
    Event,
    FrozenPlan,
    JSONValue,
    Policy,
    Recipe,
    RememberedGate,
    RememberedOutcome,
    Verdict,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.state.hostfacts import artifact_identity, environment, environment_from
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_journal_file,
    read_model,
    read_optional,
    utcnow,
    write_model,
)

__all__ = [
    "PLAN_INDEPENDENT_GATES",
    "environment",
    "environment_key",
    "latest",
    "outcomes",
    "record",
    "skip_reason",
    "skips",
]

PLAN_INDEPENDENT_GATES = ("lossless", "smoke", "quality", "agreement")


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def environment_key(
    env: dict[str, str],
    recipe: Recipe | dict[str, JSONValue],
    identities: dict[str, str] | None = None,
) -> str:
    """sha256 of the environment, the candidate's artifacts (``identities`` caches
    ``artifact_identity`` by path) and, for a recipe that runs from its own runtime environment,
    that environment's lock: an outcome is remembered for the packages it was measured with."""
    data = recipe.model_dump(mode="json") if isinstance(recipe, Recipe) else recipe
    cache = identities if identities is not None else {}
    artifacts = {}
    for role, field in (("target", "model_path"), ("draft", "draft_path")):
        path = data.get(field)
        if path:
            if path not in cache:
                cache[path] = artifact_identity(path)
            artifacts[role] = cache[path]
    key: dict[str, JSONValue] = {"environment": env, "artifacts": artifacts}
    runtime = data.get("runtime")
    if isinstance(runtime, dict):  # absent for the control plane's interpreter: keys unchanged
        key["runtime_lock"] = runtime.get("lock_digest")
    return sha256_bytes(canonical_json(key))


# ---------------------------------------------------------------------------------------------
# Recording (the supervisor, at sealing)
# ---------------------------------------------------------------------------------------------


def memory_path(home: Home, cycle_id: str) -> Path:
    return home.memory / f"{cycle_id}.json"


def record(home: Home, cycle_id: str) -> CycleMemory | None:
    """Remember every candidate outcome of a sealed cycle (idempotent); None if not sealed."""
    path = memory_path(home, cycle_id)
    existing = read_optional(path, CycleMemory) if path.exists() else None
    if existing is not None:
        return existing
    memo = from_bundle(home, cycle_id, env_now=True)
    if memo is not None:
        write_model(path, memo)
    return memo


Recipes = dict[str, dict[str, JSONValue]]
"""Each candidate's resolved recipe as its cycle journaled it (PREPARE): candidate id → fields."""


def from_bundle(home: Home, cycle_id: str, *, env_now: bool = False) -> CycleMemory | None:
    """A cycle's outcomes read from its sealed evidence bundle: a person's approval remembers
    the one approved candidate, a cycle every candidate its verdict judged."""
    files = CycleFiles(home.evidence / cycle_id)
    try:
        summary = read_model(files.summary, CycleSummary)
        verdict = read_optional(files.verdict, Verdict)
        plan = read_optional(files.plan, FrozenPlan)
        fingerprint = read_optional(files.environment, EnvironmentFingerprint)
    except (FileNotFoundError, CorruptFile):
        return None
    env = environment() if env_now or fingerprint is None else environment_from(fingerprint)
    recipes, approval_of = _journaled(read_journal_file(files.journal)[0])
    shared = _Shared(cycle_id, summary.ended_at, env, plan.policy_hash if plan else None, {})
    if approval_of is not None:
        outcomes = [_approved(shared, summary, recipes, approval_of)]
    elif verdict is not None:
        cap = plan.thresholds.max_peak_memory_gb if plan else None
        runs = _selection_runs(files)
        outcomes = [
            _judged(shared, summary, verdict, item, recipes.get(item.candidate, {}), cap, runs)
            for item in verdict.candidates
        ]
    else:
        outcomes = []
    return CycleMemory(
        cycle_id=cycle_id,
        outcome=summary.outcome,
        recorded_at=utcnow(),
        environment=env,
        outcomes=outcomes,
    )


def _journaled(
    events: list[Event],
) -> tuple[dict[str, dict[str, JSONValue]], dict[str, Any] | None]:
    """From a bundle's journal: each candidate's resolved recipe (PREPARE), and the approval
    this cycle carries out, if it is one (its QUEUED line)."""
    recipes: Recipes = {}
    approval_of = None
    for event in events:
        if event.state.value == "PREPARE" and isinstance(event.fields.get("recipes"), dict):
            recipes.update(event.fields["recipes"])
        if event.state.value == "QUEUED" and event.fields.get("approval_of"):
            approval_of = event.fields
    return recipes, approval_of


@dataclass(frozen=True)
class _RunFacts:
    """What memory keeps of a candidate's selection run (held-out and live runs are not it)."""

    started: bool = True
    failed_requests: int = 0


def _selection_runs(files: CycleFiles) -> dict[str, _RunFacts]:
    """Each candidate's selection run: did it start, how many of its requests got no answer."""
    facts: dict[str, _RunFacts] = {}
    for run_file in sorted(files.runs.glob("*.json")):
        try:
            run = read_model(run_file, CandidateRun)
        except CorruptFile:
            continue
        if run.purpose == "selection":
            failed = sum(1 for s in [*run.samples, *run.greedy] if s.error is not None)
            facts[run.candidate] = _RunFacts(run.started, failed)
    return facts


@dataclass
class _Shared:
    """What all of one cycle's remembered outcomes share: the cycle, when it was sealed, its
    environment and policy."""

    cycle_id: str
    sealed_at: datetime
    env: dict[str, str]
    policy_hash: str | None
    identities: dict[str, str]  # model-file identities read so far

    def outcome(
        self, candidate: str, recipe: dict[str, JSONValue], **decided: Any
    ) -> RememberedOutcome:
        return RememberedOutcome(
            candidate=candidate,
            cycle_id=self.cycle_id,
            sealed_at=self.sealed_at,
            manifest_hash=recipe.get("manifest_hash"),
            environment_key=environment_key(self.env, recipe, self.identities),
            policy_hash=self.policy_hash,
            **decided,
        )


def _approved(
    shared: _Shared,
    summary: CycleSummary,
    recipes: Recipes,
    approval_of: dict[str, Any],
) -> RememberedOutcome:
    """An approval: only the approved candidate, promoted or not."""
    candidate = str(approval_of.get("candidate"))
    recipe = recipes.get(candidate) or approval_of.get("recipe") or {}
    return shared.outcome(
        candidate,
        recipe,
        decision=Decision.QUALIFIED,
        selected=summary.selected == candidate,
        reasons=[
            f"approved by a person from cycle {approval_of.get('approval_of')}: "
            f"{summary.outcome.value} — {summary.reason}"[:500]
        ],
    )


def _judged(
    shared: _Shared,
    summary: CycleSummary,
    verdict: Verdict,
    item: CandidateVerdict,
    recipe: dict[str, JSONValue],
    cap: float | None,
    runs: dict[str, _RunFacts],
) -> RememberedOutcome:
    """One candidate the cycle's verdict judged, with its gates and figures."""
    run = runs.get(item.candidate, _RunFacts())
    return shared.outcome(
        item.candidate,
        recipe,
        decision=item.decision,
        reasons=item.reasons[:8],
        gates=[
            RememberedGate(gate=g.gate, passed=g.passed, detail=g.detail[:300]) for g in item.gates
        ],
        started=run.started,
        failed_requests=run.failed_requests,
        speedup_estimate=item.speedup_estimate,
        ci_low=item.ci_low,
        ci_high=item.ci_high,
        baseline_tps=item.baseline_tps,
        candidate_tps=item.candidate_tps,
        peak_memory_gb=item.peak_memory_gb,
        max_peak_memory_gb=cap,
        selected=verdict.selected == item.candidate and summary.selected == item.candidate,
    )


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def cycles(home: Home) -> list[CycleMemory]:
    """Every remembered cycle, oldest first; sealed bundles not yet recorded are read live."""
    seen: dict[str, CycleMemory] = {}
    if home.memory.is_dir():
        for path in sorted(home.memory.glob("*.json")):
            try:
                memo = read_model(path, CycleMemory)
            except CorruptFile:
                continue
            seen[memo.cycle_id] = memo
    for bundle in home.bundle_dirs():
        cycle_id = bundle.name
        if (bundle / CycleFiles.MANIFEST).exists() and cycle_id not in seen:
            found = from_bundle(home, cycle_id)
            if found is not None:
                seen[cycle_id] = found
    return sorted(
        seen.values(),
        key=lambda m: (min((o.sealed_at for o in m.outcomes), default=m.recorded_at), m.cycle_id),
    )


def outcomes(home: Home, candidate: str | None = None) -> list[RememberedOutcome]:
    """Every remembered outcome (of one candidate, if given), oldest first."""
    found = [
        o
        for memo in cycles(home)
        for o in memo.outcomes
        if candidate is None or o.candidate == candidate
    ]
    return sorted(found, key=lambda o: (o.sealed_at, o.cycle_id))


def latest(
    history: list[RememberedOutcome],
    *,
    manifest_hash: str | None,
    environment_key_: str,
    policy_hash: str | None,
) -> RememberedOutcome | None:
    """The newest outcome judged under exactly these conditions."""
    same = [
        o
        for o in history
        if o.manifest_hash is not None
        and o.manifest_hash == manifest_hash
        and o.environment_key == environment_key_
        and o.policy_hash == policy_hash
    ]
    return same[-1] if same else None


def skip_reason(outcome: RememberedOutcome | None, policy: Policy) -> str | None:
    """Why this remembered outcome means the candidate must not run again (None: it may)."""
    if outcome is None or outcome.decision != Decision.REJECTED:
        return None
    failed = [g for g in outcome.gates if not g.passed]
    # Requests that got no answer: the gates beside them judged the server's moment, not the
    # recipe's answers (module notes); the memory gate reads the measured peak, which stands.
    judged = () if outcome.failed_requests else PLAN_INDEPENDENT_GATES
    blocking = [g for g in failed if g.gate in judged]
    if not blocking:
        loose = policy.thresholds.max_peak_memory_gb.default
        blocking = [
            g
            for g in failed
            if g.gate == "memory"
            and outcome.max_peak_memory_gb is not None
            and outcome.max_peak_memory_gb >= loose
        ]
    if not blocking:
        return None
    gate = blocking[0]
    return (
        f"skipped by recipe memory: it failed the {gate.gate} gate in cycle "
        f"{outcome.cycle_id} ({gate.detail[:160]}) under this same manifest (hash "
        f"{(outcome.manifest_hash or '')[:12]}), policy and environment; it runs again "
        "when the manifest, the policy, the runtime packages, the model files or the "
        "machine change"
    )


def _history(home: Home) -> dict[str, list[RememberedOutcome]]:
    """Remembered outcomes by candidate, oldest first."""
    history: dict[str, list[RememberedOutcome]] = {}
    for item in outcomes(home):
        history.setdefault(item.candidate, []).append(item)
    return history


def _measured_before(
    home: Home, recipes: dict[str, Recipe], env: dict[str, str] | None
) -> list[tuple[str, Recipe, list[RememberedOutcome], str]]:
    """The recipes this home remembers outcomes of, by id: each with its outcomes (oldest
    first) and its environment key now (``env``: this machine's, unless given)."""
    env = env or environment()
    history = _history(home)
    identities: dict[str, str] = {}
    return [
        (cid, recipe, history[cid], environment_key(env, recipe, identities))
        for cid, recipe in sorted(recipes.items())
        if cid in history
    ]


def skips(
    home: Home,
    recipes: dict[str, Recipe],
    policy: Policy,
    policy_hash: str,
    env: dict[str, str] | None = None,
) -> dict[str, str]:
    """candidate id → reason to skip it now (see the module notes), none where the policy
    turns recipe memory off (``Policy.recipe_memory``). Deterministic."""
    out: dict[str, str] = {}
    if not policy.recipe_memory:
        return out
    for cid, recipe, remembered, env_key in _measured_before(home, recipes, env):
        last = latest(
            remembered,
            manifest_hash=recipe.manifest_hash,
            environment_key_=env_key,
            policy_hash=policy_hash,
        )
        reason = skip_reason(last, policy)
        if reason:
            out[cid] = reason
    return out
