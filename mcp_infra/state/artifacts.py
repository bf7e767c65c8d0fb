"""Pinned hub artifacts: plan, budget-check, download, inventory, and a tamper check before use.

* **Where.** Into the shared Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``) in its usual layout, so ``mlx_lm``/``mlx_vlm`` and any other tool
  reuse the same bytes. Recipes pass the snapshot folder (``.../snapshots/<revision>``) to the
  runtime, never a repo name, so nothing is resolved or downloaded at serve time.
* **What.** Only the files the runtime needs: the artifact's ``files`` patterns, else
  ``DEFAULT_ALLOW_PATTERNS``; code and pickles (``NEVER_PATTERNS``) are never fetched.
* **Before.** Sizes come from the hub's metadata at the pinned revision; the download must fit the
  policy's download budget and the free disk (with a margin) before a byte is fetched.
* **After.** Every file's sha256 is recorded in an inventory next to the cache
  (``<cache>/../mcp-infra-inventory/models--org--name/<revision>.json``); LFS files are also
  checked against the sha256 the hub publishes, small files against their git blob id.
* **Before each use.** ``verify_snapshot`` re-hashes every file and compares it with the
  inventory (missing, extra, resized or changed files are named). Hashes are memoized per process
  by (path, size, mtime, ctime, inode): any write to a file changes its ctime, so an unchanged
  stat means unchanged bytes, and a long-lived supervisor does not re-read 20 GB per candidate.
* **Offline** (``HF_HUB_OFFLINE=1`` or no hub reachable): the cache is used as it is, through
  ``snapshot_download(local_files_only=True)``; anything missing is named in one error.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import (
    ArtifactInventory,
    ArtifactRef,
    BuildRecord,
    InventoryFile,
    Manifest,
    Policy,
    Recipe,
    RecipeRuntime,
    Variant,
)
from mcp_infra.core.modelfacts import RUNTIME_PATTERNS
from mcp_infra.core.preflight import manifest_hash
from mcp_infra.errors import McpInfraError
from mcp_infra.state.modelfolder import FILES_PREFIX, not_built, recorded_build
from mcp_infra.state.runtimes import (
    BuildResult,
    as_recipe_runtime,
    ensure_runtime,
    read_lock,
    spec_hash,
)
from mcp_infra.state.runtimes import folder as runtime_folder
from mcp_infra.state.store import (
    file_sha256,
    inventory_digest,
    read_model,
    utcnow,
    write_model,
)

__all__ = [
    "DEFAULT_ALLOW_PATTERNS",
    "NEVER_PATTERNS",
    "ArtifactPlan",
    "ArtifactTampered",
    "BudgetExceeded",
    "HubError",
    "InventoryCheck",
    "OfflineMissing",
    "PrepareResult",
    "PreparedArtifact",
    "build_inventory",
    "candidate_artifacts",
    "check_budget",
    "ensure_untampered",
    "find_snapshot",
    "hub_cache",
    "inventory_digest",
    "inventory_path",
    "is_offline",
    "plan_artifact",
    "prepare",
    "quick_check",
    "read_inventory",
    "repo_folder",
    "snapshot_path",
    "verify_snapshot",
]

DEFAULT_ALLOW_PATTERNS = list(RUNTIME_PATTERNS)  # the files a runtime reads from a folder
NEVER_PATTERNS = [
    "*.py",
    "*.pyc",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.pkl",
    "*.pickle",
    "*.ckpt",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.gguf",
    ".git*",
]
DISK_MARGIN_GB = 1.0
GB = 1e9  # manifests and the hub state sizes in decimal gigabytes


class HubError(McpInfraError, RuntimeError):
    """Preparation failed; the message says what, where, and what to do."""


class OfflineMissing(HubError):
    """The hub cannot be reached and the cache lacks what the candidate needs."""


class BudgetExceeded(HubError):
    """The download does not fit the policy's budget or the free disk; nothing was downloaded."""


class ArtifactTampered(HubError):
    """A prepared snapshot no longer matches its sha256 inventory: it is not used."""


class HubModel(BaseModel):
    """Base of what preparing artifacts plans and reports (in memory only, so no
    schema_version)."""

    model_config = ConfigDict(extra="forbid")


class FilePlan(HubModel):
    path: str
    size: int | None = None
    sha256: str | None = None
    git_sha1: str | None = None
    cached: bool = False


class ArtifactPlan(HubModel):
    role: str
    repo: str
    revision: str
    allow_patterns: list[str]
    snapshot: str
    source: str = Field(description="'hub' (sizes from the hub) or 'cache' (offline)")
    files: list[FilePlan] = Field(default_factory=list)
    download_bytes: int = 0
    estimated: bool = Field(False, description="download size from the manifest's size_gb")


class PreparedArtifact(HubModel):
    role: str
    repo: str
    revision: str
    snapshot: str
    inventory: str
    files: int
    bytes: int
    downloaded_bytes: int
    digest: str


class PrepareResult(HubModel):
    candidate: str
    cache: str
    offline: bool
    artifacts: list[PreparedArtifact]
    runtime: BuildResult | None = Field(
        None, description="its runtime environment, if it names one"
    )
    build: BuildRecord | None = Field(None, description="its build, if it serves one")


class InventoryCheck(HubModel):
    snapshot: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    digest: str | None = None
    files: int = 0


# ---------------------------------------------------------------------------------------------
# Cache layout
# ---------------------------------------------------------------------------------------------


def hub_cache() -> Path:
    """The shared Hugging Face hub cache, read from the environment at call time."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(os.path.expandvars(env)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def is_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in {"1", "true", "yes", "on"}


def repo_folder(cache: Path, repo: str) -> Path:
    return Path(cache) / f"models--{repo.replace('/', '--')}"


def snapshot_path(cache: Path, repo: str, revision: str) -> Path:
    return repo_folder(cache, repo) / "snapshots" / revision


def find_snapshot(repo: str, revision: str, caches: Iterable[Path | None]) -> Path | None:
    """The first cache holding a non-empty snapshot of repo@revision."""
    for cache in caches:
        if cache is None:
            continue
        snap = snapshot_path(cache, repo, revision)
        if snap.is_dir() and any(snap.iterdir()):
            return snap
    return None


def inventory_path(snapshot: Path) -> Path:
    """Where the sha256 inventory of a snapshot lives: beside the cache, never inside it."""
    snapshot = Path(snapshot)
    cache = snapshot.parents[2]
    return cache.parent / "mcp-infra-inventory" / snapshot.parents[1].name / f"{snapshot.name}.json"


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _wanted(name: str, allow: list[str]) -> bool:
    return _matches(name, allow) and not _matches(name, NEVER_PATTERNS)


def _snapshot_files(snapshot: Path) -> dict[str, Path]:
    if not snapshot.is_dir():
        return {}
    return {
        p.relative_to(snapshot).as_posix(): p
        for p in sorted(snapshot.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def candidate_artifacts(manifest: Manifest, draft: bool) -> list[ArtifactRef]:
    """The hub artifacts a candidate runs with: the target, and the drafter if it drafts."""
    used = [a for a in manifest.artifacts if a.role != "draft" or draft]
    return [a for a in (manifest.target, *used) if a.repo]


# ---------------------------------------------------------------------------------------------
# Hashing (``store.file_sha256``, memoized by stat)
# ---------------------------------------------------------------------------------------------


def _git_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _bar(total: int, desc: str, enabled: bool) -> Any:  # a tqdm bar (tqdm has no stubs)
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface_hub
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False)


# ---------------------------------------------------------------------------------------------
# Plan and budget
# ---------------------------------------------------------------------------------------------


def plan_artifact(
    artifact: ArtifactRef,
    cache: Path,
    *,
    offline: bool,
    api: Any = None,  # an HfApi, or a stand-in with its model_info (tests)
) -> ArtifactPlan:
    """What preparing one artifact means: its files, their sizes, what must still be fetched.

    Online, sizes and hashes come from the hub at the pinned revision; offline, from the cache.
    """
    assert artifact.repo and artifact.revision
    allow = list(artifact.files) or list(DEFAULT_ALLOW_PATTERNS)
    snap = snapshot_path(cache, artifact.repo, artifact.revision)
    local = _snapshot_files(snap)
    planned = partial(
        ArtifactPlan,
        role=artifact.role,
        repo=artifact.repo,
        revision=artifact.revision,
        allow_patterns=allow,
        snapshot=str(snap),
    )
    if offline:
        files = [
            FilePlan(path=name, size=_size(path), cached=True)
            for name, path in local.items()
            if _wanted(name, allow)
        ]
        missing = not files
        estimate = int((artifact.size_gb or 0) * GB) if missing else 0
        return planned(source="cache", files=files, download_bytes=estimate, estimated=missing)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    info = api.model_info(artifact.repo, revision=artifact.revision, files_metadata=True)
    sha = getattr(info, "sha", None)
    if sha and sha != artifact.revision:
        raise HubError(
            f"{artifact.repo}: the hub resolved revision {artifact.revision} to {sha}; "
            "a pinned revision must be a full commit hash"
        )
    files = []
    for sibling in info.siblings or []:
        name = sibling.rfilename
        if not _wanted(name, allow):
            continue
        lfs = getattr(sibling, "lfs", None)
        sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        cached = name in local and _size(local[name]) == sibling.size
        files.append(
            FilePlan(
                path=name,
                size=sibling.size,
                sha256=sha256,
                git_sha1=None if lfs else getattr(sibling, "blob_id", None),
                cached=cached,
            )
        )
    if not files:
        raise HubError(f"{artifact.repo}@{artifact.revision}: no file matches the patterns {allow}")
    download = sum(f.size or 0 for f in files if not f.cached)
    return planned(source="hub", files=files, download_bytes=download)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def check_budget(
    plans: list[ArtifactPlan], manifest: Manifest, policy: Policy, free_bytes: int
) -> list[str]:
    """Problems that forbid downloading (empty: it fits). Nothing is downloaded before this."""
    problems = []
    download = sum(p.download_bytes for p in plans)
    if download / GB > policy.budgets.download_gb:
        problems.append(
            f"{download / GB:.2f} GB to download exceeds the policy's download budget "
            f"of {policy.budgets.download_gb:g} GB"
        )
    if download and free_bytes < download + DISK_MARGIN_GB * GB:
        problems.append(
            f"only {free_bytes / GB:.2f} GB free in the cache's file system; "
            f"{download / GB:.2f} GB must be downloaded "
            f"(+{DISK_MARGIN_GB:g} GB margin)"
        )
    if manifest.resources.disk_gb > policy.budgets.disk_gb:
        problems.append(
            f"the manifest needs {manifest.resources.disk_gb:g} GB of disk; the "
            f"policy's disk budget is {policy.budgets.disk_gb:g} GB"
        )
    return problems


def _free_bytes(cache: Path) -> int:
    probe = Path(cache)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


# ---------------------------------------------------------------------------------------------
# Prepare
# ---------------------------------------------------------------------------------------------


def prepare(
    manifest: Manifest,
    candidate: str,
    draft: bool,
    policy: Policy,
    *,
    cache: Path | None = None,
    offline: bool | None = None,
    progress: bool = True,
) -> PrepareResult:
    """Download (or find, offline) a candidate's pinned artifacts, then inventory them.

    Raises ``BudgetExceeded`` before any download, ``OfflineMissing`` naming everything absent,
    ``ArtifactTampered`` if downloaded bytes differ from the hub's hashes, ``HubError`` otherwise.
    """
    cache = Path(cache) if cache else hub_cache()
    offline = is_offline() if offline is None else offline
    artifacts = candidate_artifacts(manifest, draft)
    if not artifacts:
        return PrepareResult(candidate=candidate, cache=str(cache), offline=offline, artifacts=[])
    plans: list[ArtifactPlan] = []
    unreachable = None
    for artifact in artifacts:
        try:
            plans.append(plan_artifact(artifact, cache, offline=offline))
        except HubError:
            raise
        except Exception as exc:  # no hub: network, DNS, proxy, HTTP errors of any client
            if offline:
                raise
            unreachable = f"{type(exc).__name__}: {str(exc)[:200]}"
            offline = True
            plans = [plan_artifact(a, cache, offline=True) for a in artifacts]
            break
    if offline:
        _require_cached(plans, candidate, cache, unreachable)
    problems = check_budget(plans, manifest, policy, _free_bytes(cache))
    if problems:
        raise BudgetExceeded(f"{candidate}: not downloading: " + "; ".join(problems))
    cache.mkdir(parents=True, exist_ok=True)
    prepared = [
        _fetch_and_inventory(plan, cache, offline=offline, progress=progress) for plan in plans
    ]
    return PrepareResult(candidate=candidate, cache=str(cache), offline=offline, artifacts=prepared)


def _require_cached(
    plans: list[ArtifactPlan], candidate: str, cache: Path, unreachable: str | None
) -> None:
    missing = []
    for plan in plans:
        names = [f.path for f in plan.files]
        essentials = [
            p
            for p in ("config.json", "*.safetensors")
            if not any(fnmatch.fnmatchcase(n, p) for n in names)
        ]
        if not names:
            missing.append(
                f"{plan.role} {plan.repo}@{plan.revision}: no snapshot in the cache "
                f"(expected at {plan.snapshot})"
            )
        elif essentials:
            missing.append(
                f"{plan.role} {plan.repo}@{plan.revision}: the cached snapshot lacks "
                f"{', '.join(essentials)}"
            )
    if missing:
        why = (
            f"the hub is unreachable ({unreachable})"
            if unreachable
            else "offline (HF_HUB_OFFLINE is set)"
        )
        raise OfflineMissing(
            f"{candidate}: {why} and the Hugging Face cache at {cache} does not hold what it "
            "needs: " + "; ".join(missing) + ". Run `mcp-infra prepare` where the hub is "
            "reachable, or copy those models--… folders into this cache."
        )


def _fetch_and_inventory(
    plan: ArtifactPlan, cache: Path, *, offline: bool, progress: bool
) -> PreparedArtifact:
    from huggingface_hub import snapshot_download

    before = plan.download_bytes if not offline else 0
    kwargs: dict[str, Any] = {  # snapshot_download's keyword arguments, of mixed types
        "revision": plan.revision,
        "cache_dir": str(cache),
        "allow_patterns": plan.allow_patterns,
        "ignore_patterns": NEVER_PATTERNS,
        "local_files_only": offline,
    }
    try:
        folder = Path(snapshot_download(plan.repo, **kwargs))
    except Exception as exc:
        if offline:
            raise OfflineMissing(
                f"{plan.repo}@{plan.revision}: not in the Hugging Face cache at "
                f"{cache}: {type(exc).__name__}"
            ) from exc
        raise HubError(
            f"{plan.repo}@{plan.revision}: download failed: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    if folder.name != plan.revision:
        raise HubError(f"{plan.repo}: snapshot {folder.name} is not the pinned {plan.revision}")
    inventory = build_inventory(folder, plan, progress=progress)
    previous = read_inventory(folder)
    if previous is not None and previous.digest != inventory.digest and plan.source != "hub":
        # offline there is no reference but the old inventory: never bless changed bytes
        raise ArtifactTampered(
            f"{plan.repo}@{plan.revision}: the cached files differ from the sha256 inventory "
            f"recorded at {previous.prepared_at:%Y-%m-%d %H:%M}Z; remove {folder.parent.parent} "
            "and prepare again where the hub is reachable"
        )
    write_model(inventory_path(folder), inventory)
    return PreparedArtifact(
        role=plan.role,
        repo=plan.repo,
        revision=plan.revision,
        snapshot=str(folder),
        inventory=str(inventory_path(folder)),
        files=len(inventory.files),
        bytes=sum(f.size for f in inventory.files),
        downloaded_bytes=before,
        digest=inventory.digest,
    )


def build_inventory(
    snapshot: Path, plan: ArtifactPlan, *, progress: bool = False
) -> ArtifactInventory:
    """sha256 of every file of the snapshot, checked against the hub's hashes when known."""
    local = _snapshot_files(snapshot)
    expected = {f.path: f for f in plan.files}
    absent = [name for name in expected if name not in local]
    if absent and plan.source == "hub":
        raise HubError(f"{plan.repo}@{plan.revision}: after download, missing {absent[:5]}")
    total = sum(_size(p) or 0 for p in local.values())
    bar = _bar(total, f"sha256 {plan.repo}", progress)
    files = []
    try:
        for name, path in local.items():
            if not path.exists():
                raise HubError(f"{plan.repo}@{plan.revision}: {name} is a broken link in the cache")
            digest = file_sha256(path, bar.update if bar else None)
            want = expected.get(name)
            if want and want.sha256 and want.sha256 != digest:
                raise ArtifactTampered(
                    f"{plan.repo}@{plan.revision}: {name} has sha256 "
                    f"{digest[:12]}…, the hub publishes {want.sha256[:12]}…"
                )
            small = want is not None and (want.size or 0) < 50_000_000
            if small and want and want.git_sha1 and _git_sha1(path) != want.git_sha1:
                raise ArtifactTampered(
                    f"{plan.repo}@{plan.revision}: {name} differs from the "
                    "hub's git blob at this revision"
                )
            files.append(InventoryFile(path=name, size=path.stat().st_size, sha256=digest))
    finally:
        if bar is not None:
            bar.close()
    return ArtifactInventory(
        repo=plan.repo,
        revision=plan.revision,
        snapshot=str(snapshot),
        allow_patterns=plan.allow_patterns,
        prepared_at=utcnow(),
        files=files,
        digest=inventory_digest(files),
    )


# ---------------------------------------------------------------------------------------------
# Tamper checks
# ---------------------------------------------------------------------------------------------


def read_inventory(snapshot: Path) -> ArtifactInventory | None:
    path = inventory_path(snapshot)
    if not path.is_file():
        return None
    try:
        return read_model(path, ArtifactInventory)
    except Exception:  # a corrupt inventory is as good as none: it proves nothing
        return None


def _compare(snapshot: Path, full: bool, progress: bool = False) -> InventoryCheck:
    snapshot = Path(snapshot)
    inventory = read_inventory(snapshot)
    if inventory is None:
        return InventoryCheck(
            snapshot=str(snapshot),
            ok=False,
            problems=[
                "no sha256 inventory: not prepared by mcp-infra (run `mcp-infra prepare "
                "CANDIDATE`; it reuses cached files and records their hashes)"
            ],
        )
    local = _snapshot_files(snapshot)
    recorded = {f.path: f for f in inventory.files}
    problems = [f"missing: {n}" for n in sorted(set(recorded) - set(local))]
    problems += [f"not in the inventory: {n}" for n in sorted(set(local) - set(recorded))]
    repo_root = snapshot.parents[1].resolve()
    todo = []
    for name in sorted(set(local) & set(recorded)):
        path = local[name]
        if not path.exists():
            problems.append(f"broken link: {name}")
            continue
        if path.is_symlink() and repo_root not in path.resolve().parents:
            problems.append(f"{name} points outside the cache folder of its repo")
            continue
        size = path.stat().st_size
        if size != recorded[name].size:
            problems.append(f"{name}: {size} bytes, the inventory says {recorded[name].size}")
            continue
        todo.append(name)
    if full:
        bar = _bar(sum(recorded[n].size for n in todo), f"verify {inventory.repo}", progress)
        try:
            for name in todo:
                digest = file_sha256(local[name], bar.update if bar else None)
                if digest != recorded[name].sha256:
                    problems.append(
                        f"{name}: sha256 {digest[:12]}… differs from the inventory's "
                        f"{recorded[name].sha256[:12]}…"
                    )
        finally:
            if bar is not None:
                bar.close()
    return InventoryCheck(
        snapshot=str(snapshot),
        ok=not problems,
        problems=problems,
        digest=inventory.digest if not problems else None,
        files=len(recorded),
    )


def quick_check(snapshot: Path) -> InventoryCheck:
    """File set, sizes and link targets against the inventory: cheap enough for every read."""
    return _compare(snapshot, full=False)


def verify_snapshot(snapshot: Path, *, progress: bool = False) -> InventoryCheck:
    """Every file's sha256 against the inventory (memoized by stat; see the module notes)."""
    return _compare(snapshot, full=True, progress=progress)


def ensure_untampered(snapshot: Path) -> str:
    """The inventory digest of a verified snapshot; raises ``ArtifactTampered`` otherwise."""
    result = verify_snapshot(snapshot)
    if not result.ok:
        raise ArtifactTampered(f"{snapshot}: " + "; ".join(result.problems[:5]))
    assert result.digest
    return result.digest


# ---------------------------------------------------------------------------------------------
# `mcp-infra prepare CANDIDATE`
# ---------------------------------------------------------------------------------------------

PREPARE_IGNORES = {"artifacts", "integrity", "runtime_built"}  # what preparing is for


def resolve_recipe(
    manifest: Manifest,
    variant: Variant,
    models_dir: Path,
    hf_cache: Path | None = None,
    *,
    fingerprint: object = None,
    runtimes: Path | None = None,
    builds: Path | None = None,
) -> Recipe:
    """The recipe a candidate runs as: template, knobs, local paths of its artifacts, and the
    runtime environment it runs from when its manifest names one (``runtimes``: the home's
    ``runtimes/`` folder; without it, for views only, none is named). About to be used
    (``fingerprint`` given), every hub snapshot and the environment are checked against their
    inventory and lock (``ArtifactTampered``, ``runtimes.RuntimeTampered``,
    ``runtimes.RuntimeMissing``); otherwise the environment is named by its lock as built,
    unchecked, or left out while it is not built. A variant with a build is served from its
    recorded build in ``builds`` (the home's), once made (``state.ownbuilds``)."""
    spec = manifest.environment_of(variant)
    runtime: RecipeRuntime | None = None
    if spec is not None and runtimes is not None:
        if callable(fingerprint):
            runtime = ensure_runtime(spec, runtimes)
        elif (lock := read_lock(runtime_folder(runtimes, spec_hash(spec)))) is not None:
            runtime = as_recipe_runtime(lock)
    draft = manifest.draft_artifact() if variant.knobs.draft else None
    model_path = artifact_path(manifest.target, models_dir, hf_cache)
    draft_path = artifact_path(draft, models_dir, hf_cache) if draft else None
    hashes: dict[str, str] = {}
    if variant.build is not None:  # served from its build in the home, once it is made
        source = manifest.build_source()
        record = (
            recorded_build(builds, variant.build, source.digest)
            if builds is not None and source.digest
            else None
        )
        model_path = record.folder if record else not_built(builds or models_dir, variant.build)
        if record is not None and callable(fingerprint):
            hashes["source"] = FILES_PREFIX + record.source_digest
            hashes["target"] = FILES_PREFIX + record.digest
    if callable(fingerprint):  # about to be used: hub snapshots must match their inventory
        for role, artifact, path in (
            ("target", manifest.target, model_path),
            ("draft", draft, draft_path),
        ):
            if artifact is None or path is None or role in hashes:
                continue
            if role == "target" and variant.build is not None:
                continue  # a build not made yet: nothing to check until it is
            if artifact.digest:  # a local folder: its recorded files, checked at each start
                hashes[role] = FILES_PREFIX + artifact.digest
            elif artifact.repo and Path(path).is_dir():
                hashes[role] = "inventory:" + ensure_untampered(Path(path))
            else:
                hashes[role] = fingerprint(Path(path))
    return Recipe(
        candidate_id=f"{manifest.id}:{variant.id}",
        template=manifest.runtime.template,
        model_path=model_path,
        draft_path=draft_path,
        knobs=variant.knobs,
        artifact_hashes=hashes,
        semantics=manifest.semantics_of(variant),
        candidate_class=manifest.class_of(variant),
        manifest_hash=manifest_hash(manifest),
        runtime=runtime,
    )


CONFIGURED_UNKNOWN = "(the configured target: this home configures none)"


def artifact_path(artifact: ArtifactRef, models_dir: Path, hf_cache: Path | None) -> str:
    """The folder an artifact is served from. A "configured" artifact is written in when the
    home's manifests are loaded (``owncatalog.bind_configured``); unbound, it names none."""
    if artifact.demo:
        return str(models_dir / artifact.demo)
    if artifact.path:
        return artifact.path
    if artifact.configured:
        return CONFIGURED_UNKNOWN
    assert artifact.repo and artifact.revision
    found = find_snapshot(artifact.repo, artifact.revision, hub_caches(hf_cache))
    # not prepared yet: where `mcp-infra prepare` will put it (the shared Hugging Face cache)
    return str(found or snapshot_path(hub_cache(), artifact.repo, artifact.revision))


def hub_caches(hf_cache: Path | None) -> list[Path]:
    """Where hub snapshots are looked for: the given cache (the home's), then the shared one
    that ``mcp-infra prepare`` downloads into."""
    caches = [hf_cache] if hf_cache is not None else []
    shared = hub_cache()
    if not any(c.resolve() == shared.resolve() for c in caches):
        caches.append(shared)
    return caches


def cached_hub_artifacts(hf_cache: Path | None) -> list[tuple[str, Path]]:
    """(repo@revision, snapshot folder) of every non-empty snapshot in a Hugging Face cache."""
    found: list[tuple[str, Path]] = []
    if hf_cache is None or not hf_cache.is_dir():
        return found
    for repo_dir in sorted(hf_cache.glob("models--*")):
        repo = repo_dir.name[len("models--") :].replace("--", "/", 1)
        for snap in sorted((repo_dir / "snapshots").glob("*")):
            if snap.is_dir() and any(snap.iterdir()):
                found.append((f"{repo}@{snap.name}", snap))
    return found
