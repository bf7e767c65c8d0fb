"""What sealing adds to a bundle: the inputs needed to re-judge it, the signed Statement and the
link to the home's previous bundle. ``evidence.seal`` calls these in order; ``verification``
reads them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

from mcp_infra.contracts import (
    CandidateRun,
    ChainHead,
    EvidencePredicate,
    FrozenPlan,
    InTotoStatement,
    PreviousBundle,
    Sample,
    ServiceConfig,
    StatementSubject,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.state import signing
from mcp_infra.state.store import (
    CorruptFile,
    CycleFiles,
    Home,
    read_model,
    read_optional,
    sha256_file,
    utcnow,
    write_model,
)

INPUTS = "inputs"
REPO_ROOT = Path(__file__).resolve().parents[2]


def suite_names(plan: FrozenPlan) -> list[str]:
    """Every suite the plan's protocol names (selection, quality, held-out: any field *suite*)."""
    names: list[str] = []
    for field, value in plan.protocol.model_dump().items():
        if "suite" in field and isinstance(value, str) and value not in names:
            names.append(value)
        if "suite" in field and isinstance(value, list):
            names += [v for v in value if isinstance(v, str) and v not in names]
    return names


def copy_inputs(home: Home, bundle: Path) -> None:
    """The texts the cycle was judged by: policy, registry manifests, suites (as files)."""
    from mcp_infra.state.catalog import SUITES_DIR, policy_dir, registry_dir

    inputs = bundle / INPUTS
    plan = read_optional(CycleFiles(bundle).plan, FrozenPlan)
    config = read_optional(home.config, ServiceConfig)
    name = config.policy if config else "default"
    own = home.user_policy / f"{name}.yaml"
    policy = own if own.is_file() else policy_dir() / f"{name}.yaml"
    if policy.is_file():
        (inputs).mkdir(parents=True, exist_ok=True)
        shutil.copy2(policy, inputs / "policy.yaml")
    for folder, prefix in ((registry_dir(), "shipped"), (home.user_registry, "home")):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            (inputs / "registry" / prefix).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, inputs / "registry" / prefix / path.name)
    copy_generated(home, inputs / "registry" / "generated")
    for suite in suite_names(plan) if plan else []:
        path = SUITES_DIR / f"{suite}.yaml"
        if path.is_file():
            (inputs / "suites").mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, inputs / "suites" / path.name)


def copy_generated(home: Home, folder: Path) -> None:
    """The manifests the home loads unlike any file says: the catalog generated for its model,
    and manifests whose "configured target" was written in (``HomeContext.manifests``), each
    as the plan was judged by."""
    from mcp_infra.core.preflight import manifest_hash
    from mcp_infra.state.catalog import read_registry
    from mcp_infra.state.context import HomeContext

    if not home.config.exists():
        return
    files, _ = read_registry(extra=home.user_registry)
    for mid, manifest in HomeContext(home).manifests.items():
        if mid not in files or manifest_hash(files[mid]) != manifest_hash(manifest):
            write_model(folder / f"{mid}.yaml", manifest)


def all_samples(bundle: Path) -> list[tuple[str, str, Sample]]:
    """(file, list, sample) for every sample of every run file and of the online check."""
    out: list[tuple[str, str, Sample]] = []
    runs = CycleFiles(bundle).runs
    files = sorted(runs.glob("*.json")) if runs.is_dir() else []
    if (bundle / "online.json").is_file():
        files.append(bundle / "online.json")
    for path in files:
        run = read_model(path, CandidateRun)
        name = str(path.relative_to(bundle))
        out += [(name, "samples", s) for s in run.samples]
        out += [(name, "greedy", s) for s in run.greedy]
    return out


def samples_digest(bundle: Path) -> tuple[str, dict[str, int]]:
    rows = all_samples(bundle)
    body = [[name, where, s.model_dump(mode="json")] for name, where, s in rows]
    counts: dict[str, int] = {}
    for _, where, sample in rows:
        key = "greedy" if where == "greedy" else sample.phase
        counts[key] = counts.get(key, 0) + 1
    return sha256_bytes(canonical_json(body)), dict(sorted(counts.items()))


def subjects(bundle: Path) -> list[StatementSubject]:
    return [
        StatementSubject(name=str(p.relative_to(bundle)), digest={"sha256": sha256_file(p)})
        for p in sorted(bundle.rglob("*"))
        if p.is_file() and p.name != signing_file()
    ]


def signing_file() -> str:
    SIGNATURE = CycleFiles.SIGNATURE

    return SIGNATURE


def version_and_commit() -> tuple[str, str | None]:
    from mcp_infra.state.hostfacts import installed_version

    version = installed_version("mcp-infra") or ""
    commit = None
    git = shutil.which("git")
    if git and (REPO_ROOT / ".git").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [git, "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            commit = done.stdout.strip() or None
    return version, commit


def sign_bundle(home: Home, bundle: Path, cycle_id: str) -> str:
    """Write SIGNATURE.dsse.json; return the bundle's digest (sha256 of the Statement)."""
    key = signing.ensure_keypair(home)
    plan = read_optional(CycleFiles(bundle).plan, FrozenPlan)
    digest, counts = samples_digest(bundle)
    verdict = CycleFiles(bundle).verdict
    head = read_optional(signing.keys_dir(home) / "chain.json", ChainHead)
    version, commit = version_and_commit()
    statement = InTotoStatement(
        subject=subjects(bundle),
        predicate=EvidencePredicate(
            cycle_id=cycle_id,
            sealed_at=utcnow(),
            manifest_sha256=sha256_file(CycleFiles(bundle).manifest),
            previous=PreviousBundle(cycle_id=head.cycle_id, digest=head.digest) if head else None,
            plan_content_hash=plan.content_hash if plan else "",
            samples_sha256=digest,
            sample_counts=counts,
            verdict_sha256=sha256_file(verdict) if verdict.exists() else None,
            key_fingerprint=signing.fingerprint(key.public_key()),
            mcp_infra_version=version,
            mcp_infra_commit=commit,
        ),
    )
    envelope = signing.sign(statement, key)
    write_model(bundle / signing_file(), envelope)
    return sha256_bytes(signing.statement_bytes(statement))


def bundle_digest(bundle: Path) -> str | None:
    """sha256 of a sealed bundle's Statement (what the next bundle names), None if unsigned."""
    from mcp_infra.contracts import DsseEnvelope

    try:
        envelope = read_model(bundle / signing_file(), DsseEnvelope)
        return sha256_bytes(signing.payload_of(envelope))
    except (FileNotFoundError, CorruptFile, ValueError):
        return None


def advance_chain(home: Home, cycle_id: str, digest: str) -> None:
    path = signing.keys_dir(home) / "chain.json"
    head = read_optional(path, ChainHead)
    write_model(
        path, ChainHead(cycle_id=cycle_id, digest=digest, count=(head.count + 1) if head else 1)
    )
