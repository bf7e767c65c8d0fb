"""Evidence bundles: seal a cycle's files with a sha256 manifest, show them, verify them.

A bundle is written into a hidden temporary folder and renamed into place, so it either exists
whole or not at all. ``verify`` re-checks every hash and recomputes the verdict from the raw
samples with the same ``selector.select`` the cycle used; both must agree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import Field

from mcp_infra.contracts import (
    CandidateRun,
    CheckResult,
    CycleCost,
    CycleSummary,
    EvidenceManifest,
    FrozenPlan,
    Part,
    Verdict,
)
from mcp_infra.store import (
    CorruptFile,
    Home,
    read_journal_file,
    read_model,
    sha256_file,
    write_model,
)

BUNDLE_FILES = ("plan.json", "environment.json", "verdict.json", "journal.ndjson",
                "online.json", "service_impact.json")
SIGNATURE = "SIGNATURE.dsse.json"


def seal(home: Home, cycle_id: str, summary: CycleSummary, cost: CycleCost | None = None) -> Path:
    """Copy the cycle's durable files and the inputs needed to re-judge it (suites, policy and
    manifest texts) into ``evidence/<cycle_id>/`` with a hash manifest, sign a Statement over
    them with the home's key, and link the bundle to the home's previous one."""
    from mcp_infra.state import sealing

    source = home.cycle_dir(cycle_id)
    final = home.evidence / cycle_id
    if (final / "MANIFEST.json").exists():
        return final
    tmp = home.evidence / f".{cycle_id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in BUNDLE_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, tmp / name)
    if (source / "runs").is_dir():
        (tmp / "runs").mkdir()
        for run in sorted((source / "runs").glob("*.json")):
            shutil.copy2(run, tmp / "runs" / run.name)
    sealing.copy_inputs(home, tmp)
    write_model(tmp / "summary.json", summary)
    if cost is not None:
        write_model(tmp / "cost.json", cost)
    files = {str(p.relative_to(tmp)): sha256_file(p)
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    write_model(tmp / "MANIFEST.json", EvidenceManifest(cycle_id=cycle_id, files=files))
    digest = sealing.sign_bundle(home, tmp, cycle_id)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    sealing.advance_chain(home, cycle_id, digest)
    return final


def bundle_path(home: Home, ref: str) -> Path:
    """A cycle id (in the home's evidence folder) or a path to a bundle."""
    candidate = Path(ref)
    if candidate.is_dir() and (candidate / "MANIFEST.json").exists():
        return candidate
    if "/" in ref or ref.startswith("."):
        raise FileNotFoundError(f"no evidence bundle at {ref}")
    path = home.evidence / ref
    if not (path / "MANIFEST.json").exists():
        raise FileNotFoundError(f"no sealed evidence for cycle {ref}")
    return path


class Verification(Part):
    bundle: str
    hashes_ok: bool
    verdict_ok: bool
    problems: list[str] = Field(default_factory=list)
    checks: list[CheckResult] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list, description="names of the failed checks")
    key_fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        return self.hashes_ok and self.verdict_ok and not self.failed


def load_runs(bundle: Path) -> tuple[CandidateRun | None, list[CandidateRun]]:
    runs_dir = bundle / "runs"
    baseline = None
    others: dict[str, CandidateRun] = {}
    for path in sorted(runs_dir.glob("*.json")) if runs_dir.is_dir() else []:
        run = read_model(path, CandidateRun)
        if run.candidate == "baseline":
            baseline = run
        else:
            others[run.candidate] = run
    return baseline, list(others.values())


def recompute(bundle: Path) -> Verdict | None:
    """The verdict the selector reaches from the bundle's raw samples and frozen plan."""
    from mcp_infra.selector import select

    plan = read_model(bundle / "plan.json", FrozenPlan)
    baseline, runs = load_runs(bundle)
    if baseline is None:
        return None
    order = {c: i for i, c in enumerate(plan.candidates)}
    runs.sort(key=lambda r: order.get(r.candidate, len(order)))
    return select(baseline, runs, plan.thresholds, plan.protocol, plan.auto_promote)


def verify(bundle: Path, key: Path | None = None, home: Home | None = None) -> Verification:
    """Every named check of ``state.audit``: hashes, signature and chain, the plan and its
    inputs, every sample, the verdict, gates, summary and journal recomputed or compared."""
    from mcp_infra.state import audit, signing

    if home is None and key is None and bundle.resolve().parent.name == "evidence":
        owner = Home(bundle.resolve().parent.parent)  # a bundle inside a home: that home's key
        home = owner if signing.public_key_path(owner).is_file() else None
    return audit.verify(bundle, key=key, home=home)  # type: ignore[return-value]


def list_cycles(home: Home) -> list[CycleSummary]:
    out = []
    if not home.evidence.is_dir():
        return out
    for path in sorted(home.evidence.glob("*/summary.json")):
        try:
            out.append(read_model(path, CycleSummary))
        except CorruptFile:
            continue
    return sorted(out, key=lambda s: s.started_at, reverse=True)


def journal_of(bundle: Path) -> list[dict]:
    events, problems = read_journal_file(bundle / "journal.ndjson")
    rows = [e.model_dump(mode="json") for e in events]
    rows += [{"problem": p} for p in problems]
    return rows
