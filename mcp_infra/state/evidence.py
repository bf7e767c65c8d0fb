"""Evidence bundles: seal a cycle's files with a sha256 manifest, show them, verify them.

A bundle is written into a hidden temporary folder and renamed into place, so it either exists
whole or not at all. ``verify`` re-checks every hash and recomputes the verdict from the raw
samples with the same ``selector.select`` the cycle used; both must agree.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from mcp_infra.contracts import CheckResult, CycleCost, CycleSummary, EvidenceManifest, JSONValue
from mcp_infra.core.sanitize import nearest_text
from mcp_infra.state import sealing, signing, verification
from mcp_infra.state.bundle import Bundle, Failed, Skipped, load_runs, recompute
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_journal_file,
    read_model,
    sha256_file,
    write_model,
)
from mcp_infra.state.verification import Verification

BUNDLE_FILES = (
    CycleFiles.PLAN,
    CycleFiles.ENVIRONMENT,
    CycleFiles.VERDICT,
    CycleFiles.JOURNAL,
    "online.json",
    "service_impact.json",
    CycleFiles.DISTRIBUTED,
)
SIGNATURE = CycleFiles.SIGNATURE


def seal(home: Home, cycle_id: str, summary: CycleSummary, cost: CycleCost | None = None) -> Path:
    """Copy the cycle's durable files and the inputs needed to re-judge it (suites, policy and
    manifest texts) into ``evidence/<cycle_id>/`` with a hash manifest, sign a Statement over
    them with the home's key, and link the bundle to the home's previous one."""
    source = home.cycle_dir(cycle_id)
    final = home.evidence / cycle_id
    if (CycleFiles(final).manifest).exists():
        return final
    tmp = home.evidence / f".{cycle_id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in BUNDLE_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, tmp / name)
    # measured runs; locks of the environments they ran from; records of the builds they served
    for sub in ("runs", "runtimes", "builds"):
        if (source / sub).is_dir():
            (tmp / sub).mkdir()
            for item in sorted((source / sub).glob("*.json")):
                shutil.copy2(item, tmp / sub / item.name)
    sealing.copy_inputs(home, tmp)
    write_model(CycleFiles(tmp).summary, summary)
    if cost is not None:
        write_model(tmp / "cost.json", cost)
    files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    write_model(CycleFiles(tmp).manifest, EvidenceManifest(cycle_id=cycle_id, files=files))
    digest = sealing.sign_bundle(home, tmp, cycle_id)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    sealing.advance_chain(home, cycle_id, digest)
    return final


LATEST = "latest"


def bundle_path(home: Home, ref: str) -> Path:
    """A cycle id (in the home's evidence folder), ``latest`` (the newest sealed cycle) or a
    path to a bundle. The error names the nearest sealed cycle ids."""
    candidate = Path(ref)
    if ref != LATEST and candidate.is_dir() and (CycleFiles(candidate).manifest).exists():
        return candidate
    if "/" in ref or ref.startswith("."):
        raise FileNotFoundError(f"no evidence bundle at {ref}")
    if ref == LATEST:
        cycles = list_cycles(home)
        if not cycles:
            raise FileNotFoundError("no sealed cycle yet: `latest` names none")
        ref = cycles[0].cycle_id
    path = home.evidence / ref
    if not (CycleFiles(path).manifest).exists():
        raise FileNotFoundError(f"no sealed evidence for cycle {ref}" + _nearest_cycles(home, ref))
    return path


def _nearest_cycles(home: Home, ref: str) -> str:
    try:
        names = [p.name for p in home.bundle_dirs() if (p / CycleFiles.MANIFEST).exists()]
    except OSError:
        return ""
    if not names:
        return ""
    return nearest_text(ref, names) or " (`latest` names the newest)"


def verify(
    bundle: Path, key: Path | None = None, home: Home | None = None, pin: str | None = None
) -> Verification:
    """Every named check of ``state.verification``: hashes, signature and chain, the plan and its
    inputs, every sample, the verdict, gates, summary and journal recomputed or compared;
    ``pin``: the fingerprint the signing key must have."""
    if home is None and key is None and bundle.resolve().parent.name == "evidence":
        owner = Home(bundle.resolve().parent.parent)  # a bundle inside a home: that home's key
        home = owner if signing.public_key_path(owner).is_file() else None
    return verification.verify(bundle, key=key, home=home, pin=pin)


# ---------------------------------------------------------------------------------------------
# Verification for the read surfaces (status, the cycle list, the summary), cached
# ---------------------------------------------------------------------------------------------

Stamp = tuple[tuple[str, int, int, int, int], ...]
INTEGRITY = ("file_hashes", "signature", "statement_files")
_lock = threading.Lock()
_cache: dict[tuple[str, str], tuple[Stamp, Verification]] = {}
_flights: dict[tuple[str, str], threading.Lock] = {}


def _stamps(paths: list[Path]) -> Stamp:
    """Identity, size, modification and change time of each path: ``st_ctime`` moves on any
    write or ``utime`` and cannot be set back, so a file rewritten to the same size and
    modification time is still seen as changed."""
    out = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            out.append((str(path), 0, -1, 0, 0))
            continue
        out.append((str(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(out)


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (not descending into linked folders, as ``rglob``), by one
    directory scan each: half the time of ``rglob`` with an ``is_file`` per entry, and read on
    every `status` call."""
    out: list[Path] = []
    for root, _dirs, names in os.walk(folder):  # an unreadable folder lists nothing
        out += [Path(root, name) for name in names]
    return sorted(out)


def key_for(bundle: Path, home: Home | None) -> Path | None:
    """The key a read surface verifies a bundle with: its home's, else the ``<id>.pub`` that
    `evidence export` puts beside a copy (a key that is not the home's: surfaces say so)."""
    if home is not None and signing.public_key_path(home).is_file():
        return signing.public_key_path(home)
    beside = bundle.parent / f"{bundle.name}.pub"
    return beside if beside.is_file() else None


def integrity(bundle: Path, home: Home | None = None) -> Verification:
    """The checks a listing can afford on every call: every file's sha256 against the
    manifest, the manifest's signature with the home's key, the signed Statement naming the
    same files. A summary.json edited after sealing fails here (re-hashed, its signature
    fails). Cached while no file of the bundle and no key changed."""
    key = key_for(bundle, home)
    stamp = _stamps([*_files(bundle), *([key] if key else [])])
    cache_key = ("integrity", str(bundle))
    with _lock:
        hit = _cache.get(cache_key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    b = Bundle(bundle)
    checks: list[CheckResult] = []
    plan: list[tuple[str, Callable[[], str]]] = [
        ("file_hashes", lambda: verification.check_file_hashes(b)),
        ("signature", lambda: verification.check_signature(b, key)),
        ("statement_files", lambda: verification.check_statement_files(b)),
    ]
    for name, run in plan:
        try:
            checks.append(CheckResult(name=name, status="ok", detail=run()))
        except Skipped as exc:
            checks.append(CheckResult(name=name, status="skipped", detail=str(exc)))
        except (
            Failed,
            FileNotFoundError,
            CorruptFile,
            ValueError,
            signing.KeyFileError,
        ) as exc:
            checks.append(CheckResult(name=name, status="failed", detail=str(exc)[:300]))
    failed = [c.name for c in checks if c.status == "failed"]
    result = Verification(
        bundle=str(bundle),
        hashes_ok=checks[0].status == "ok",
        verdict_ok=True,
        problems=[f"{c.name}: {c.detail}" for c in checks if c.status == "failed"],
        checks=checks,
        failed=failed,
    )
    with _lock:
        _cache[cache_key] = (stamp, result)
    return result


def bundle_stamp(bundle: Path, home: Home | None = None) -> Stamp:
    """Stamps of every file a bundle's verification and views read: its own files, its
    siblings' manifests and signatures (the chain), the home's keys and chain head, the key
    beside a copy."""
    siblings = [
        f
        for sibling in sorted(bundle.parent.iterdir() if bundle.parent.is_dir() else [])
        if sibling.is_dir() and sibling != bundle
        for f in (sibling / CycleFiles.MANIFEST, sibling / SIGNATURE)
    ]
    key = key_for(bundle, home)
    keys = _files(signing.keys_dir(home)) if home is not None else []
    return _stamps([*_files(bundle), *siblings, *keys, *([key] if key else [])])


def verify_cached(bundle: Path, home: Home | None = None) -> Verification:
    """``verify`` for the read surfaces: every check, recomputed only when a file it reads
    changed (``bundle_stamp``). `evidence verify` itself never uses a cache."""
    stamp = bundle_stamp(bundle, home)
    cache_key = ("full", str(bundle))
    with _lock:
        flight = _flights.setdefault(cache_key, threading.Lock())
    with flight:  # one verification of a bundle at a time: a second caller takes its result
        with _lock:
            hit = _cache.get(cache_key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        key = key_for(bundle, home)
        result = verify(bundle, key=None if home else key, home=home)
        with _lock:
            _cache[cache_key] = (stamp, result)
        return result


def verify_command(home: Home | None, ref: str, bundle: Path | None = None) -> str:
    """The command that checks a bundle for good: in a home, by id with the home's key
    fingerprint named; a copy elsewhere, by path with the key beside it."""
    if home is None:
        beside = bundle.parent / f"{bundle.name}.pub" if bundle is not None else None
        key = f" --key {beside}" if beside is not None and beside.is_file() else ""
        return f"mcp-infra evidence verify {ref}{key}"
    fingerprint = signing.home_fingerprint(home)
    pinned = f" (key fingerprint {fingerprint})" if fingerprint else ""
    return f"mcp-infra --home {home.root} evidence verify {ref}{pinned}"


def list_cycles(home: Home) -> list[CycleSummary]:
    out: list[CycleSummary] = []
    for bundle in home.bundle_dirs():
        path = CycleFiles(bundle).summary
        if not path.is_file():
            continue
        try:
            out.append(read_model(path, CycleSummary))
        except CorruptFile:
            continue
    return sorted(out, key=lambda s: s.started_at, reverse=True)


def journal_of(bundle: Path) -> list[dict[str, JSONValue]]:
    events, problems = read_journal_file(CycleFiles(bundle).journal)
    rows = [e.model_dump(mode="json") for e in events]
    rows += [{"problem": p} for p in problems]
    return rows


__all__ = [
    "BUNDLE_FILES",
    "SIGNATURE",
    "Verification",
    "bundle_path",
    "journal_of",
    "list_cycles",
    "load_runs",
    "recompute",
    "seal",
    "verify",
]
