"""Named checks of an evidence bundle: what `mcp-infra evidence verify` runs.

Each check returns ok, failed (with why) or skipped (with why). The signature and the chain
say whether the bundle is what this home sealed; the other checks recompute what can be
recomputed from the bundle's own raw data and compare it with what the bundle claims, so that
an edit shows even where the files were re-hashed consistently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from mcp_infra.contracts import (
    CandidateRun,
    CheckResult,
    CycleState,
    CycleSummary,
    DsseEnvelope,
    Event,
    EvidenceManifest,
    EvidencePredicate,
    FrozenPlan,
    InTotoStatement,
    JournalStep,
    Manifest,
    Part,
    Policy,
    Recipe,
    RuntimeLock,
    Verdict,
)
from mcp_infra.core.preflight import env_hash
from mcp_infra.core.units import selected_speedup_pct
from mcp_infra.core.workload import decisive_view
from mcp_infra.state import sealing, signing
from mcp_infra.state.runtimes import lock_digest
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    inventory_digest,
    read_journal_file,
    read_model,
    read_optional,
    sha256_file,
)

SELECTING = "selecting by the frozen thresholds"
TOLERANCE = 1e-6


class Verification(Part):
    bundle: str
    hashes_ok: bool
    verdict_ok: bool
    problems: list[str] = Field(default_factory=list)
    checks: list[CheckResult] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list, description="names of the failed checks")
    key_fingerprint: str | None = Field(
        None, description="SHA-256 (hex) of the raw public key the signature was checked with"
    )
    key_path: str | None = Field(None, description="the public key file checked with")
    key_trust: Literal["home", "pinned", "unpinned"] | None = Field(
        None,
        description="home: the verifying home's own key; pinned: the fingerprint the verifier "
        "gave; unpinned: neither, so the signature shows only that the holder of that key "
        "sealed the files, not who that is",
    )
    pinned_fingerprint: str | None = Field(None, description="the fingerprint asked for, if any")
    key_note: str = Field("", description="which key, and how far to trust it, in words")

    @property
    def ok(self) -> bool:
        return self.hashes_ok and self.verdict_ok and not self.failed


def load_runs(bundle: Path) -> tuple[CandidateRun | None, list[CandidateRun]]:
    runs_dir = CycleFiles(bundle).runs
    baseline = None
    others: dict[str, CandidateRun] = {}
    for path in sorted(runs_dir.glob("*.json")) if runs_dir.is_dir() else []:
        run = read_model(path, CandidateRun)
        if run.purpose != "selection":  # held-out and live runs never feed the selector
            continue
        if run.candidate == "baseline":
            baseline = run
        else:
            others[run.candidate] = run
    return baseline, list(others.values())


def recompute(bundle: Path) -> Verdict | None:
    """The verdict the selector reaches from the bundle's raw samples and frozen plan."""
    from mcp_infra.core.selector import select

    plan = read_model(CycleFiles(bundle).plan, FrozenPlan)
    baseline, runs = load_runs(bundle)
    if baseline is None:
        return None
    order = {c: i for i, c in enumerate(plan.candidates)}
    runs.sort(key=lambda r: order.get(r.candidate, len(order)))
    return select(
        decisive_view(baseline, plan.protocol),
        [decisive_view(r, plan.protocol) for r in runs],
        plan.thresholds,
        plan.protocol,
        plan.auto_promote,
    )


class Failed(Exception):
    """A check failed, with the reason."""


class Skipped(Exception):
    """A check could not apply to this bundle, with the reason."""


class Bundle:
    """A bundle's files, read lazily; a broken file fails the checks that need it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: dict[str, object] = {}

    def _get(self, name: str, load: Callable[[], object]) -> object:
        if name not in self._cache:
            self._cache[name] = load()
        return self._cache[name]

    def plan(self) -> FrozenPlan:
        return self._get("plan", lambda: read_model(self.path / "plan.json", FrozenPlan))  # type: ignore[return-value]

    def verdict(self) -> Verdict | None:
        return self._get("verdict", lambda: read_optional(self.path / "verdict.json", Verdict))  # type: ignore[return-value]

    def summary(self) -> CycleSummary:
        return self._get("summary", lambda: read_model(self.path / "summary.json", CycleSummary))  # type: ignore[return-value]

    def events(self) -> list[Event]:
        return self._get("events", lambda: read_journal_file(self.path / "journal.ndjson")[0])  # type: ignore[return-value]

    def runs(self) -> list[CandidateRun]:
        def load() -> list[CandidateRun]:
            folder = self.path / "runs"
            return (
                [read_model(p, CandidateRun) for p in sorted(folder.glob("*.json"))]
                if folder.is_dir()
                else []
            )

        return self._get("runs", load)  # type: ignore[return-value]

    def envelope(self) -> DsseEnvelope:
        SIGNATURE = CycleFiles.SIGNATURE

        return self._get("envelope", lambda: read_model(self.path / SIGNATURE, DsseEnvelope))  # type: ignore[return-value]

    def statement(self) -> InTotoStatement:
        def load() -> InTotoStatement:
            return InTotoStatement.model_validate_json(signing.payload_of(self.envelope()))

        return self._get("statement", load)  # type: ignore[return-value]

    def predicate(self) -> EvidencePredicate:
        try:
            return self.statement().predicate
        except FileNotFoundError as exc:
            raise Failed("the bundle is not signed (no SIGNATURE.dsse.json)") from exc


# ---------------------------------------------------------------------------------------------
# The checks, in the order they are reported
# ---------------------------------------------------------------------------------------------


def _fail_on(problems: list[str]) -> None:
    """A check fails with every problem it found, in one detail."""
    if problems:
        raise Failed("; ".join(problems))


def check_file_hashes(b: Bundle) -> str:
    manifest = read_model(b.path / "MANIFEST.json", EvidenceManifest)
    SIGNATURE = CycleFiles.SIGNATURE

    present = {str(p.relative_to(b.path)) for p in b.path.rglob("*") if p.is_file()}
    present -= {"MANIFEST.json", SIGNATURE}
    problems = []
    for name, digest in sorted(manifest.files.items()):
        path = b.path / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(path) != digest:
            problems.append(f"{name}: sha256 differs from the manifest")
    problems += [
        f"{extra}: not listed in the manifest" for extra in sorted(present - set(manifest.files))
    ]
    _fail_on(problems)
    return f"{len(manifest.files)} file(s) match MANIFEST.json"


def check_signature(b: Bundle, key_path: Path | None, pin: str | None = None) -> str:
    if key_path is None:
        raise Failed(
            "no public key to check with: pass --key FILE (the key of the home that sealed it)"
            + (" whose fingerprint is the pinned one" if pin else "")
        )
    try:
        envelope = b.envelope()
    except FileNotFoundError as exc:
        raise Failed("the bundle is not signed (no SIGNATURE.dsse.json)") from exc
    key = signing.load_public(key_path)
    if pin is not None and signing.fingerprint(key) != pin:
        raise Failed(
            f"the key {key_path} has fingerprint {signing.fingerprint(key)}, not the pinned "
            f"{pin}: this bundle is not shown to be signed by the pinned key"
        )
    why = signing.verify_envelope(envelope, key)
    if why:
        raise Failed(why)
    return f"Ed25519 signature by {signing.fingerprint(key)[:16]}… ({key_path})"


def check_statement_files(b: Bundle) -> str:
    listed = {s.name: s.digest.get("sha256") for s in b.statement().subject}
    actual = {s.name: s.digest["sha256"] for s in sealing.subjects(b.path)}
    problems = [f"{n}: not in the signed Statement" for n in sorted(set(actual) - set(listed))]
    problems += [
        f"{n}: in the signed Statement but missing" for n in sorted(set(listed) - set(actual))
    ]
    problems += [
        f"{n}: sha256 differs from the signed Statement"
        for n in sorted(actual)
        if n in listed and listed[n] != actual[n]
    ]
    if problems:
        raise Failed(
            "; ".join(problems[:8]) + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else "")
        )
    manifest = sha256_file(b.path / "MANIFEST.json")
    if b.predicate().manifest_sha256 != manifest:
        raise Failed("MANIFEST.json differs from the one the Statement names")
    return f"{len(listed)} file(s) match the signed Statement, MANIFEST.json included"


def _siblings(folder: Path, own: Path) -> list[Path]:
    return (
        [p for p in folder.iterdir() if p.is_dir() and p != own and (p / "MANIFEST.json").exists()]
        if folder.is_dir()
        else []
    )


def check_chain(b: Bundle) -> str:
    previous = b.predicate().previous
    if previous is None:
        return "the first bundle of its home (names no previous bundle)"
    there = b.path.parent / previous.cycle_id
    if not (there / "MANIFEST.json").exists():
        if not _siblings(b.path.parent, b.path):
            raise Skipped(f"a lone copy: the previous bundle {previous.cycle_id} is not here")
        raise Failed(f"the previous bundle {previous.cycle_id} is missing (deleted?)")
    digest = sealing.bundle_digest(there)
    if digest != previous.digest:
        raise Failed(
            f"the previous bundle {previous.cycle_id} is not the one this bundle names (rewritten?)"
        )
    return f"links to {previous.cycle_id} (sha256 {previous.digest[:12]}…)"


def check_chain_head(b: Bundle, home: Home | None) -> str:
    if home is None or b.path.parent.resolve() != home.evidence.resolve():
        raise Skipped("the bundle is not in this home's evidence folder")
    head = read_optional(signing.keys_dir(home) / "chain.json", signing_head_type())
    if head is None:
        raise Failed("the home has no chain head (keys/chain.json) although it holds a bundle")
    there = home.evidence / head.cycle_id
    if not (there / "MANIFEST.json").exists():
        raise Failed(f"the newest bundle {head.cycle_id} is missing (deleted?)")
    if sealing.bundle_digest(there) != head.digest:
        raise Failed(f"the newest bundle {head.cycle_id} was rewritten")
    return (
        f"the home's newest bundle {head.cycle_id} is present and unchanged ({head.count} sealed)"
    )


def signing_head_type() -> type:
    from mcp_infra.contracts import ChainHead

    return ChainHead


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
    for prefix in ("shipped", "home"):
        folder = b.path / sealing.INPUTS / "registry" / prefix
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            manifest = load_manifest(path)
            out.setdefault(manifest.id, manifest)
    return out


def check_plan_inputs(b: Bundle) -> str:
    """The frozen thresholds follow from the bundled policy, manifests and the proposed plan."""
    from mcp_infra.core.preflight import find_candidate, registry_hash
    from mcp_infra.core.sanitize import combined_thresholds, policy_hash

    plan = b.plan()
    path = b.path / sealing.INPUTS / "policy.yaml"
    if not path.is_file():
        raise Failed("no copy of the policy in the bundle (inputs/policy.yaml)")
    policy = Policy.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
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
        combined_thresholds(plan.proposed, policy, used, peak, []) for peak in (None, math.inf, 0.0)
    ]
    if plan.thresholds not in options:
        expected = options[0]
        looser = [
            f"{k}: {getattr(plan.thresholds, k)} (policy gives {getattr(expected, k)})"
            for k in type(expected).model_fields
            if getattr(plan.thresholds, k) != getattr(expected, k)
        ]
        problems.append("the plan's thresholds do not follow from the policy: " + "; ".join(looser))
    if plan.protocol.model_dump() != policy.protocol.model_dump():
        problems.append("the plan's protocol is not the policy's")
    _fail_on(problems)
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
    _fail_on(problems)
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
    _fail_on(problems)
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
    _fail_on(problems)
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
    _fail_on(problems)
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


def _fingerprint_of(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return signing.fingerprint(signing.load_public(path))
    except signing.KeyFileError:
        return None


def choose_key(bundle: Path, key: Path | None, home: Home | None, pin: str | None) -> Path | None:
    """The public key to check with: the one given; else the home's; with a pinned fingerprint
    and no key given, the home's or the one beside the bundle (``<id>.pub``, as `evidence
    export` writes it), whichever has the pinned fingerprint. A key beside a bundle is never
    used unpinned: anyone who can replace the bundle can replace it."""
    if key is not None:
        return key
    own = signing.public_key_path(home) if home is not None else None
    own = own if own is not None and own.is_file() else None
    if pin is None:
        return own
    beside = bundle.parent / f"{bundle.name}.pub"
    for path in (own, beside if beside.is_file() else None):
        if path is not None and _fingerprint_of(path) == pin:
            return path
    return own or (beside if beside.is_file() else None)


def trust_words(
    fingerprint: str | None, trust: str | None, key_path: Path | None, pin: str | None
) -> str:
    """Which key verified the signature, and what that is worth, in plain words."""
    if fingerprint is None:
        return "no public key was read, so nothing says who sealed this bundle"
    where = f"key {fingerprint} ({key_path})"
    if pin is not None and fingerprint != pin:
        return f"{where} is NOT the pinned key {pin}"
    if trust == "pinned":
        return f"checked with {where}: the pinned fingerprint"
    if trust == "home":
        return f"checked with {where}: this home's own key"
    return (
        f"checked with {where}, which is NOT this home's key and NOT pinned: the signature shows "
        "only that whoever holds that key sealed these files. Compare the fingerprint with one "
        "the bundle's owner published, and pin it with --fingerprint"
    )


def verify(
    bundle: Path, key: Path | None = None, home: Home | None = None, pin: str | None = None
) -> Verification:
    """Run every check; the result names each one (see ``Verification``). ``home``: the
    verifying home (its key is the default, and "the home's own key" is said of it); ``pin``: a
    fingerprint the signing key must have (``signing.parse_fingerprint``'s form)."""

    b = Bundle(bundle)
    key_path = choose_key(bundle, key, home, pin)
    plan: list[tuple[str, Callable[[], str]]] = [
        ("file_hashes", lambda: check_file_hashes(b)),
        ("signature", lambda: check_signature(b, key_path, pin)),
        ("statement_files", lambda: check_statement_files(b)),
        ("chain", lambda: check_chain(b)),
        ("chain_head", lambda: check_chain_head(b, home)),
        ("plan_hash", lambda: check_plan_hash(b)),
        ("plan_inputs", lambda: check_plan_inputs(b)),
        ("suites", lambda: check_suites(b)),
        ("candidates_accounted", lambda: check_candidates_accounted(b)),
        ("verdict_present", lambda: check_verdict_present(b)),
        ("verdict_recomputed", lambda: check_verdict_recomputed(b)),
        ("gates_recomputed", lambda: check_gates_recomputed(b)),
        ("summary_agrees", lambda: check_summary_agrees(b)),
        ("journal_agrees", lambda: check_journal_agrees(b)),
        ("samples_covered", lambda: check_samples_covered(b)),
        ("sample_arithmetic", lambda: check_sample_arithmetic(b)),
        ("runtime_locks", lambda: check_runtime_locks(b)),
    ]
    checks: list[CheckResult] = []
    for name, run in plan:
        try:
            checks.append(CheckResult(name=name, status="ok", detail=run()))
        except Skipped as exc:
            checks.append(CheckResult(name=name, status="skipped", detail=str(exc)))
        except Failed as exc:
            checks.append(CheckResult(name=name, status="failed", detail=str(exc)))
        except (
            FileNotFoundError,
            CorruptFile,
            ValueError,
            signing.KeyFileError,
            yaml.YAMLError,
        ) as exc:
            checks.append(
                CheckResult(
                    name=name, status="failed", detail=f"{type(exc).__name__}: {str(exc)[:300]}"
                )
            )
    failed = [c.name for c in checks if c.status == "failed"]
    by = {c.name: c for c in checks}
    fingerprint = _fingerprint_of(key_path)
    trust: Literal["home", "pinned", "unpinned"] | None = None
    if fingerprint is not None:
        if pin is not None and fingerprint == pin:
            trust = "pinned"
        elif home is not None and fingerprint == signing.home_fingerprint(home):
            trust = "home"
        else:
            trust = "unpinned"
    return Verification(
        bundle=str(bundle),
        hashes_ok=by["file_hashes"].status == "ok",
        verdict_ok=all(by[n].status != "failed" for n in ("verdict_present", "verdict_recomputed")),
        problems=[f"{c.name}: {c.detail}" for c in checks if c.status == "failed"],
        checks=checks,
        failed=failed,
        key_fingerprint=fingerprint,
        key_path=str(key_path) if key_path is not None else None,
        key_trust=trust,
        pinned_fingerprint=pin,
        key_note=trust_words(fingerprint, trust, key_path, pin),
    )
