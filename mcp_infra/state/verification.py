"""Named checks of an evidence bundle: what `mcp-infra evidence verify` runs.

Each check returns ok, failed (with why) or skipped (with why). The checks here (file hashes,
the signature, the signed file list, the chain) say whether the bundle is what its home sealed;
``state.recomputed``'s recompute what can be recomputed from the bundle's own raw data and
compare it with what the bundle claims. ``verify`` runs them all, in the order they are
reported, and says which key checked the signature and how far to trust it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from mcp_infra.contracts import (
    CheckResult,
    EvidenceManifest,
    Part,
)
from mcp_infra.state import sealing, signing
from mcp_infra.state.bundle import Bundle, Failed, Skipped, fail_on
from mcp_infra.state.recomputed import (
    check_builds,
    check_candidates_accounted,
    check_gates_recomputed,
    check_journal_agrees,
    check_plan_hash,
    check_plan_inputs,
    check_references,
    check_runtime_locks,
    check_sample_arithmetic,
    check_samples_covered,
    check_screening_recomputed,
    check_suites,
    check_summary_agrees,
    check_verdict_present,
    check_verdict_recomputed,
)
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_model,
    read_optional,
    sha256_file,
)


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


# ---------------------------------------------------------------------------------------------
# The checks, in the order they are reported
# ---------------------------------------------------------------------------------------------


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
    fail_on(problems)
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
        ("screening_recomputed", lambda: check_screening_recomputed(b)),
        ("gates_recomputed", lambda: check_gates_recomputed(b)),
        ("summary_agrees", lambda: check_summary_agrees(b)),
        ("journal_agrees", lambda: check_journal_agrees(b)),
        ("samples_covered", lambda: check_samples_covered(b)),
        ("sample_arithmetic", lambda: check_sample_arithmetic(b)),
        ("runtime_locks", lambda: check_runtime_locks(b)),
        ("builds", lambda: check_builds(b)),
        ("references", lambda: check_references(b)),
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
