"""The checks of ``evidence verify`` that recompute a bundle's claims from its own raw data: the
plan's hash and its inputs, the suites, every candidate accounted for, the verdict and the gates
recomputed, the summary and the journal agreeing with them, every sample covered by the signed
digest and internally consistent, and each runtime environment's lock. An edit shows here even
where the files were re-hashed consistently.
"""

from __future__ import annotations

import math

import yaml

from mcp_infra.contracts import (
    CandidateRun,
    CycleState,
    JournalStep,
    Manifest,
    Policy,
    Recipe,
    RuntimeLock,
    Sample,
    Verdict,
)
from mcp_infra.core.preflight import env_hash
from mcp_infra.core.units import selected_speedup_pct
from mcp_infra.state import sealing
from mcp_infra.state.bundle import Bundle, Failed, Skipped, fail_on, recompute
from mcp_infra.state.runtimes import lock_digest
from mcp_infra.state.store import (
    CycleFiles,
    inventory_digest,
    read_model,
    read_optional,
    sha256_file,
)

SELECTING = "selecting by the frozen thresholds"


def check_plan_hash(b: Bundle) -> str:
    from mcp_infra.core.sanitize import plan_content_hash

    plan = b.plan()
    again = plan_content_hash(plan)
    if again != plan.content_hash:
        raise Failed(
            f"plan.json's content hash is {plan.content_hash[:12]}…, its content hashes "
            f"to {again[:12]}… (the plan was edited)"
        )
    signed = b.predicate().plan_content_hash
    if signed != again:
        raise Failed(
            f"the signed Statement names plan {signed[:12]}…, the bundle holds {again[:12]}…"
        )
    if not b.path.name.endswith(plan.content_hash[:6]) and b.path.name.startswith("c-"):
        raise Failed(f"the cycle id {b.path.name} does not end with the plan's hash")
    return f"plan content hash {again[:12]}… recomputed"


def _bundled_manifests(b: Bundle) -> dict[str, Manifest]:
    from mcp_infra.state.catalog import load_manifest

    out: dict[str, Manifest] = {}
    for prefix in ("generated", "shipped", "home"):  # generated: as the home loaded them
        folder = b.path / sealing.INPUTS / "registry" / prefix
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            manifest = load_manifest(path)
            out.setdefault(manifest.id, manifest)
    return out


def check_plan_inputs(b: Bundle) -> str:
    """The frozen thresholds follow from the bundled policy, manifests and the proposed plan."""
    from mcp_infra.core.budget import frozen_as, policy_as_frozen
    from mcp_infra.core.preflight import find_candidate, registry_hash
    from mcp_infra.core.sanitize import combined_thresholds, policy_hash

    plan = b.plan()
    path = b.path / sealing.INPUTS / "policy.yaml"
    if not path.is_file():
        raise Failed("no copy of the policy in the bundle (inputs/policy.yaml)")
    text = yaml.safe_load(path.read_text(encoding="utf-8"))
    policy = Policy.model_validate(policy_as_frozen(text, plan.thresholds))
    problems = []
    if policy_hash(policy) != plan.policy_hash:
        problems.append("the bundled policy is not the one the plan was frozen under")
    manifests = _bundled_manifests(b)
    if not manifests:
        problems.append("no copy of the registry manifests in the bundle")
    elif registry_hash(manifests) != plan.registry_hash:
        problems.append("the bundled manifests are not the registry the plan was frozen under")
    used = [
        found[0] for c in plan.candidates[1:] if (found := find_candidate(manifests, c)) is not None
    ]
    options = [
        frozen_as(combined_thresholds(plan.proposed, policy, used, peak, []), plan.thresholds)
        for peak in (None, math.inf, 0.0)
    ]
    if plan.thresholds not in options:
        expected = options[0]
        looser = [
            f"{k}: {getattr(plan.thresholds, k)} (policy gives {getattr(expected, k)})"
            for k in type(expected).model_fields
            if getattr(plan.thresholds, k) != getattr(expected, k)
        ]
        problems.append("the plan's thresholds do not follow from the policy: " + "; ".join(looser))
    # The plan freezes the policy's protocol with this home's learned spread where the policy
    # asks to learn one (core.sanitize.frozen_protocol); the spread names the sealed cycles it
    # was learned from.
    if plan.protocol.learned_spread is not None and not policy.protocol.learn_spread:
        problems.append("the plan carries a learned spread its policy does not ask for")
    learned = {"learned_spread"}
    if plan.protocol.model_dump(exclude=learned) != policy.protocol.model_dump(exclude=learned):
        problems.append("the plan's protocol is not the policy's")
    fail_on(problems)
    return "policy hash, registry hash, thresholds and protocol re-derived from the bundled texts"


def check_suites(b: Bundle) -> str:
    from mcp_infra.state.catalog import load_suite

    plan = b.plan()
    folder = b.path / sealing.INPUTS / "suites"
    problems, ids = [], set()
    for name in sealing.suite_names(plan):
        if not (folder / f"{name}.yaml").is_file():
            problems.append(f"suite {name} is not in the bundle")
            continue
        ids |= {p.id for p in load_suite(name, folder).prompts}
    measured = {s.prompt_id for r in b.runs() for s in [*r.samples, *r.greedy] if s.repeat >= 0}
    strangers = sorted(measured - ids)
    if strangers and not problems:
        problems.append(f"samples of prompts no bundled suite holds: {', '.join(strangers[:5])}")
    fail_on(problems)
    return f"{len(ids)} prompt(s) in {len(sealing.suite_names(plan))} bundled suite(s)"


def check_candidates_accounted(b: Bundle) -> str:
    plan = b.plan()
    have = {r.candidate for r in b.runs()}
    missing = [c for c in plan.candidates if c not in have]
    if missing and _reached(b, CycleState.SELECT):
        raise Failed(
            f"no run file or recorded refusal for {', '.join(missing)} (a result was removed?)"
        )
    verdict = b.verdict()
    if verdict is not None:
        judged = {c.candidate for c in verdict.candidates}
        absent = [c for c in plan.candidates[1:] if c not in judged]
        if absent:
            raise Failed(f"the verdict does not judge {', '.join(absent)}")
    return f"{len(plan.candidates)} candidate(s) of the plan accounted for" + (
        f"; {len(plan.refused)} refused at freezing" if plan.refused else ""
    )


def _reached(b: Bundle, state: CycleState, message: str | None = None) -> bool:
    return any(e.state == state and (message is None or e.message == message) for e in b.events())


def _died_selecting(b: Bundle) -> bool:
    """The supervisor died between journaling the selection and writing its verdict: the very
    next record is the recovery's."""
    events = b.events()
    for event, nxt in zip(events, events[1:], strict=False):
        if event.state == CycleState.SELECT and event.message == SELECTING:
            return nxt.state == CycleState.RECOVER
    return False


def check_verdict_present(b: Bundle) -> str:
    verdict_file = b.path / "verdict.json"
    signed = b.predicate().verdict_sha256 if (b.path / "SIGNATURE.dsse.json").exists() else None
    if not verdict_file.exists():
        if _reached(b, CycleState.SELECT, SELECTING) and not _died_selecting(b):
            raise Failed("the journal shows selection ran, but verdict.json is missing")
        if signed:
            raise Failed("the signed Statement names a verdict, but verdict.json is missing")
        return "no selection ran, so no verdict was written"
    if signed is not None and signed != sha256_file(verdict_file):
        raise Failed("verdict.json differs from the one the signed Statement names")
    return "verdict.json present"


def _recomputed(b: Bundle) -> Verdict:
    """The verdict this code's selector reaches on the bundle's raw samples."""
    key = "recomputed"
    if key not in b._cache:
        b._cache[key] = recompute(b.path)
    again = b._cache[key]
    if again is None:
        raise Failed("no baseline run to recompute the verdict from")
    return again  # type: ignore[return-value]


def check_verdict_recomputed(b: Bundle) -> str:
    from mcp_infra.core.selector import DECISION_METHOD

    recorded = b.verdict()
    if recorded is None:
        raise Skipped("no verdict.json")
    if recorded.method != DECISION_METHOD:
        # Another method may reach another verdict on the same samples; the samples, the
        # hashes and the signature are still checked, and this says so by name.
        raise Skipped(
            f"not recomputed: the verdict was reached by decision method {recorded.method} and "
            f"this mcp-infra decides by method {DECISION_METHOD} (docs/statistics.md says what "
            "changed); verify with the mcp-infra that sealed it to recompute"
        )
    again = _recomputed(b)
    strip = {"candidates": {"__all__": {"gates"}}}
    if again.model_dump(mode="json", exclude=strip) != recorded.model_dump(
        mode="json", exclude=strip
    ):
        raise Failed(
            f"the selector, run again on the raw samples, reaches another verdict "
            f"(recomputed selection: {again.selected}, recorded: {recorded.selected})"
        )
    return f"selector re-run on the raw samples: {again.selected or 'no candidate'} selected"


def check_screening_recomputed(b: Bundle) -> str:
    """A screened plan: what screening dropped, recomputed from the first round's samples,
    agrees with the verdict and with the journal's screening line (what the cycle dropped
    then, before any later start was measured)."""
    from mcp_infra.core.screening import SCREEN_FROM, screens
    from mcp_infra.core.selector import DECISION_METHOD

    plan = b.plan()
    if not screens(plan):
        raise Skipped(
            f"the plan names {len(plan.candidates) - 1} candidate(s); plans of {SCREEN_FROM} "
            "or more are screened"
        )
    recorded = b.verdict()
    if recorded is None:
        raise Skipped("no verdict.json")
    if recorded.method != DECISION_METHOD:
        raise Skipped(f"the verdict was reached by decision method {recorded.method}")
    again = _recomputed(b).screening
    if again is None:
        raise Failed("the plan is screened, but no screening could be recomputed")
    problems = []
    if recorded.screening != again:
        problems.append(
            f"the verdict's screening dropped {sorted((recorded.screening or again).dropped)}, "
            f"recomputed from the samples it drops {sorted(again.dropped)}"
        )
    lines = [
        e for e in b.events() if e.state == CycleState.EXPERIMENT and e.step == JournalStep.SCREENED
    ]
    if not lines:
        problems.append("the journal has no screening line")
    elif lines[-1].fields.get("dropped") != again.dropped:
        problems.append(
            f"the journal says screening dropped {sorted(lines[-1].fields.get('dropped') or {})}"
            f", recomputed from the samples it drops {sorted(again.dropped)}"
        )
    fail_on(problems)
    return (
        f"screening recomputed from the first round: {len(again.dropped)} of "
        f"{len(again.judged) + len(again.held)} dropped"
        + (f" ({', '.join(again.dropped)})" if again.dropped else "")
    )


def check_gates_recomputed(b: Bundle) -> str:
    from mcp_infra.core.gates import compare_greedy

    recorded = b.verdict()
    problems: list[str] = []
    count = 0
    if recorded is not None:
        again = {c.candidate: c.gates for c in _recomputed(b).candidates}
        for item in recorded.candidates:
            count += len(item.gates)
            if [g.model_dump(mode="json") for g in again.get(item.candidate, [])] != [
                g.model_dump(mode="json") for g in item.gates
            ]:
                problems.append(
                    f"{item.candidate}: gates differ when recomputed from the stored greedy outputs"
                )
    online = read_optional(b.path / "online.json", CandidateRun)
    verified = [
        e
        for e in b.events()
        if e.state == CycleState.VERIFY and e.step in (JournalStep.PASSED, JournalStep.FAILED)
    ]
    if online is not None:
        run = next((r for r in b.runs() if r.candidate == online.candidate), None)
        if run is None:
            problems.append(f"online samples of {online.candidate}, which has no run")
        else:
            gate = compare_greedy(run.greedy, online.samples)
            count += 1
            journaled = verified[-1].step if verified else None
            if journaled == JournalStep.PASSED and not gate.passed:
                problems.append(
                    f"the journal says online verification passed, but the stored "
                    f"online outputs fail the gate: {gate.detail}"
                )
    elif any(e.step == JournalStep.PASSED for e in verified):
        problems.append(
            "the journal says online verification passed, but its samples "
            "(online.json) are not in the bundle"
        )
    fail_on(problems)
    return f"{count} gate(s) recomputed from stored outputs"


def _approval_of(b: Bundle) -> tuple[str, str] | None:
    """(source cycle, candidate) when this bundle is a person's approval of an earlier cycle."""
    for event in b.events()[:1]:
        if event.fields.get("approval_of") and event.fields.get("candidate"):
            return str(event.fields["approval_of"]), str(event.fields["candidate"])
    return None


def _expected(b: Bundle, verdict: Verdict | None) -> tuple[str | None, list[str]]:
    """The candidate a promotion may name: the verdict's selection, or, in an approval cycle,
    a candidate the verdict qualified and left awaiting approval."""
    approval = _approval_of(b)
    if approval is None or verdict is None:
        return (verdict.selected if verdict else None), []
    item = next((c for c in verdict.candidates if c.candidate == approval[1]), None)
    if item is None or item.decision.value != "qualified":
        return None, [
            f"the approval names {approval[1]}, which the recomputed verdict does not qualify"
        ]
    return approval[1], []


def _agree(
    b: Bundle,
    who: str,
    outcome: str | None,
    selected: str | None,
    speedup: float | None,
    verdict: Verdict | None,
    interrupted: bool,
) -> list[str]:
    expected, problems = _expected(b, verdict)
    if verdict is None:
        if selected is not None and not interrupted:
            problems.append(f"{who} names {selected} as selected, but there is no verdict")
        return problems
    if (
        selected is not None
        and selected != expected
        and not (interrupted and selected == verdict.selected)
    ):
        problems.append(f"{who} names {selected}, the recomputed verdict {expected}")
    if outcome == "promoted" and selected is None and not interrupted:  # recovery may not know
        problems.append(f"{who} says promoted but names no candidate")
    if selected is not None and outcome != "promoted":
        problems.append(f"{who} names {selected} with outcome {outcome}")
    if selected is not None and not (interrupted and speedup is None):
        want = selected_speedup_pct(verdict, selected)
        if speedup is None or want is None or abs(speedup - want) > 0.011:
            problems.append(f"{who} claims {speedup}% speedup, the recomputed verdict {want}%")
    return problems


def _verdict_for_claims(b: Bundle) -> Verdict | None:
    if b.verdict() is None and not (b.path / "runs" / "baseline.json").exists():
        return None
    try:
        return _recomputed(b)
    except Failed:
        return None


def check_summary_agrees(b: Bundle) -> str:
    summary = b.summary()
    verdict = _verdict_for_claims(b)
    problems = _agree(
        b,
        "summary.json",
        summary.outcome.value,
        summary.selected,
        summary.speedup_pct,
        verdict,
        summary.interrupted,
    )
    if summary.cycle_id != b.path.name and b.path.name.startswith("c-"):
        problems.append(f"summary.json is of cycle {summary.cycle_id}")
    fail_on(problems)
    return f"outcome {summary.outcome.value}, selected {summary.selected or '-'}"


def check_journal_agrees(b: Bundle) -> str:
    events = b.events()
    final = [e for e in events if e.state == CycleState.SEALED and e.step == JournalStep.ENTER]
    if not final:
        raise Failed("the journal has no final SEALED record")
    last = final[-1].fields
    summary = b.summary()
    verdict = _verdict_for_claims(b)
    problems = _agree(
        b,
        "the journal",
        last.get("outcome"),
        last.get("selected"),
        last.get("speedup_pct"),
        verdict,
        summary.interrupted,
    )
    if last.get("outcome") != summary.outcome.value or last.get("selected") != summary.selected:
        problems.append(
            f"the journal ends with {last.get('outcome')}/{last.get('selected')}, "
            f"summary.json says {summary.outcome.value}/{summary.selected}"
        )
    promoted = [
        e.fields.get("recipe", {}).get("candidate_id")
        for e in events
        if e.state == CycleState.PROMOTE and e.step == JournalStep.ENTER
    ]
    expected, _ = _expected(b, verdict)
    if verdict is not None and promoted and promoted[-1] != expected:
        problems.append(
            f"the journal promoted {promoted[-1]}, the recomputed verdict selects {expected}"
        )
    fail_on(problems)
    return f"final record: {last.get('outcome')}, selected {last.get('selected') or '-'}"


def check_samples_covered(b: Bundle) -> str:
    predicate = b.predicate()
    digest, counts = sealing.samples_digest(b.path)
    if counts != predicate.sample_counts:
        raise Failed(f"sample counts {counts} differ from the signed {predicate.sample_counts}")
    if digest != predicate.samples_sha256:
        raise Failed(
            "the samples (timings, outputs, warm-up, drift or online ones) differ from those sealed"
        )
    return ", ".join(f"{n} {k}" for k, n in counts.items()) + " sample(s) covered"


def check_sample_arithmetic(b: Bundle) -> str:
    """Derived timing fields agree with the raw ones, as the client computed them."""
    bad: list[str] = []
    checked = 0
    for run in b.runs():
        for s in run.samples:
            if s.error or s.e2e_s is None or s.ttft_s is None:
                continue
            checked += 1
            where = f"{run.candidate}/{s.prompt_id}/{s.phase}#{s.repeat}"
            if s.decode_s is not None and s.e2e_s + 1e-6 < s.ttft_s + s.decode_s:
                bad.append(f"{where}: e2e shorter than TTFT + decode")
            if (
                s.completion_tokens
                and s.e2e_tps is not None
                and s.e2e_s > 0
                and not math.isclose(s.e2e_tps, s.completion_tokens / s.e2e_s, rel_tol=1e-6)
            ):
                bad.append(f"{where}: e2e tok/s is not tokens / e2e seconds")
            if (
                s.completion_tokens
                and s.completion_tokens > 1
                and s.decode_tps is not None
                and s.decode_s
                and not math.isclose(
                    s.decode_tps, (s.completion_tokens - 1) / s.decode_s, rel_tol=1e-6
                )
            ):
                bad.append(f"{where}: decode tok/s is not (tokens-1) / decode seconds")
    if bad:
        raise Failed(f"{len(bad)} sample(s) inconsistent, e.g. " + "; ".join(bad[:3]))
    return f"{checked} timed sample(s) internally consistent"


def _journaled_recipes(b: Bundle) -> list[Recipe]:
    """Every recipe the journal says the cycle resolved or promoted."""
    found: list[Recipe] = []
    for event in b.events():
        data = [*(event.fields.get("recipes") or {}).values(), event.fields.get("recipe")]
        found += [Recipe.model_validate(d) for d in data if isinstance(d, dict)]
    return found


def check_runtime_locks(b: Bundle) -> str:
    """Each runtime environment a recipe ran from is in the bundle with its full lock, whose
    digests recompute from its package and file lists, name its own folder hash, and are the
    ones the recipe was resolved (and so re-checked before each start) with."""
    runtimes = {r.runtime.env_hash: r for r in _journaled_recipes(b) if r.runtime is not None}
    folder = CycleFiles(b.path).runtimes
    bundled = {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()
    if not runtimes and not bundled:
        raise Skipped("no recipe of this cycle ran from a runtime environment of its own")
    problems = [f"runtimes/{h}.json: no recipe names it" for h in sorted(bundled - set(runtimes))]
    shown = []
    for digest, recipe in sorted(runtimes.items()):
        rt = recipe.runtime
        assert rt is not None
        if digest not in bundled:
            problems.append(f"{recipe.candidate_id}: the lock of {digest[:12]} is not bundled")
            continue
        lock = read_model(CycleFiles(b.path).runtime_lock(digest), RuntimeLock)
        rebuilt = env_hash(lock.spec, lock.python_version, lock.platform, lock.shared_site or "")
        where = f"{recipe.candidate_id} ({digest[:12]})"
        if lock.env_hash != digest or rebuilt != digest:
            problems.append(f"{where}: the lock's spec does not hash to its folder")
        if lock_digest(lock.packages) != lock.lock_digest:
            problems.append(f"{where}: the package list does not give the lock's digest")
        if inventory_digest(lock.files) != lock.files_digest:
            problems.append(f"{where}: the file list does not give the lock's file digest")
        if (lock.lock_digest, lock.files_digest) != (rt.lock_digest, rt.files_digest):
            problems.append(f"{where}: the recipe was resolved with another lock")
        shown.append(f"{recipe.candidate_id}: {rt.label or digest[:12]}, {len(lock.packages)} pkgs")
    if problems:
        raise Failed("; ".join(problems[:6]))
    return "; ".join(shown) + " (locks recompute and match the recipes)"


def check_builds(b: Bundle) -> str:
    """Each build a candidate was served from is in the bundle with its record: its digest
    recomputes, its command names its source and options, the recipe served it (``ownbuilds``)."""
    from mcp_infra.core.preflight import find_candidate
    from mcp_infra.state.ownbuilds import build_problems

    manifests = _bundled_manifests(b)
    found = [(c, find_candidate(manifests, c)) for c in b.plan().candidates[1:]]
    builds = {c for c, hit in found if hit is not None and hit[1].build is not None}
    problems, shown = build_problems(b.path, _journaled_recipes(b), builds)
    if not builds and not shown:
        raise Skipped("no candidate of this cycle served a build")
    fail_on(problems)
    return "; ".join(shown) + " (records recompute and match the recipes served)"


def check_references(b: Bundle) -> str:
    """Answers a run took from earlier cycles (``CandidateRun.reference``: the baseline's kept
    greedy outputs and quality answers) are those cycles' own: each equals an answer a run of a
    cycle it names holds, where those bundles sit beside this one (each verifies on its own)."""
    taking = [r for r in b.runs() if r.reference is not None]
    if not taking:
        raise Skipped("every answer was measured in this cycle")
    problems: list[str] = []
    checked, absent = 0, set()
    for run in taking:
        ref = run.reference
        assert ref is not None
        held: set[tuple[str, tuple[int, ...], str]] = set()
        for cycle in ref.cycles:
            source = b.path.parent / cycle
            if not (source / "summary.json").is_file():
                absent.add(cycle)
                continue
            held |= {_answer(s) for r in Bundle(source).runs() for s in [*r.greedy, *r.samples]}
        if absent:
            continue
        quality = [s for s in run.samples if s.phase == "quality"][: ref.quality]
        for sample in [*run.greedy[: ref.greedy], *quality]:
            checked += 1
            if _answer(sample) not in held:
                problems.append(f"{run.candidate}: {sample.prompt_id} is no answer of {ref.cycles}")
    fail_on(problems)
    if absent:
        raise Skipped(
            f"taken from {', '.join(sorted(absent))}, whose bundle is not beside this one"
        )
    return f"{checked} answer(s) taken from earlier cycles equal theirs"


def _answer(sample: Sample) -> tuple[str, tuple[int, ...], str]:
    return sample.prompt_id, tuple(sample.token_ids or ()), sample.text
