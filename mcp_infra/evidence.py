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
                "service_impact.json")


def seal(home: Home, cycle_id: str, summary: CycleSummary) -> Path:
    """Copy the cycle's durable files into ``evidence/<cycle_id>/`` with a hash manifest."""
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
    write_model(tmp / "summary.json", summary)
    files = {str(p.relative_to(tmp)): sha256_file(p)
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    write_model(tmp / "MANIFEST.json", EvidenceManifest(cycle_id=cycle_id, files=files))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
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

    @property
    def ok(self) -> bool:
        return self.hashes_ok and self.verdict_ok


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


def verify(bundle: Path) -> Verification:
    problems: list[str] = []
    try:
        manifest = read_model(bundle / "MANIFEST.json", EvidenceManifest)
    except (FileNotFoundError, CorruptFile) as exc:
        return Verification(bundle=str(bundle), hashes_ok=False, verdict_ok=False,
                            problems=[f"MANIFEST.json unreadable: {exc}"])
    present = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    present.discard("MANIFEST.json")
    for name, digest in sorted(manifest.files.items()):
        path = bundle / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(path) != digest:
            problems.append(f"{name}: sha256 differs from the manifest")
    for extra in sorted(present - set(manifest.files)):
        problems.append(f"{extra}: not listed in the manifest")
    hashes_ok = not problems
    verdict_ok = False
    try:
        if (bundle / "verdict.json").exists():
            recorded = read_model(bundle / "verdict.json", Verdict)
            again = recompute(bundle)
            if again is None:
                problems.append("no baseline run to recompute from")
            elif again.model_dump(mode="json") != recorded.model_dump(mode="json"):
                problems.append("recomputed verdict differs from verdict.json "
                                f"(recomputed selection: {again.selected}, "
                                f"recorded: {recorded.selected})")
            else:
                verdict_ok = True
        else:
            verdict_ok = True  # a cycle that never reached SELECT has no verdict to recompute
    except (CorruptFile, FileNotFoundError) as exc:
        problems.append(f"cannot recompute: {exc}")
    return Verification(bundle=str(bundle), hashes_ok=hashes_ok, verdict_ok=verdict_ok,
                        problems=problems)


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
