"""Registry: candidate manifests, their preflight on this machine, and candidate → recipe.

Preflight is a pure function of a manifest, the policy and a snapshot of this machine's facts
(``HostFacts``), so every check can be tested directly and one failing manifest never hides the
others: each check reports pass/fail and why.
"""

from __future__ import annotations

import platform
import re
import shutil
from pathlib import Path

import psutil
import yaml
from pydantic import Field, ValidationError

from mcp_infra import hub
from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    ArtifactRef,
    Manifest,
    Part,
    Policy,
    Recipe,
    Variant,
)
from mcp_infra.datafiles import shipped_dir
from mcp_infra.state.filecache import installed_version as cached_version
from mcp_infra.state.filecache import load_yaml
from mcp_infra.store import canonical_json, sha256_bytes

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = {"mlx_lm_server": "mlx-lm", "mlx_vlm_server": "mlx-vlm"}


class RegistryError(ValueError):
    """A manifest file that does not load; the message names the file and the problem."""


class HostFacts(Part):
    """What preflight needs to know about this machine, gathered once by ``host_facts``."""

    platform: str
    packages: dict[str, str]
    memory_gb: float
    free_disk_gb: float
    available_artifacts: list[str] = Field(default_factory=list)
    artifact_problems: dict[str, list[str]] = Field(
        default_factory=dict, description="repo@revision → why its cached snapshot cannot be "
        "trusted (no sha256 inventory, missing, extra or resized files)")
    cache_free_disk_gb: float | None = Field(
        None, description="free space where hub downloads go (the shared Hugging Face cache)")


class Check(Part):
    name: str
    passed: bool
    detail: str


class Preflight(Part):
    candidate: str
    passed: bool
    checks: list[Check]

    def failures(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.passed]


def registry_dir() -> Path:
    return shipped_dir("registry")


def load_manifest(path: Path) -> Manifest:
    try:
        data = load_yaml(path)
        manifest = Manifest.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise RegistryError(f"{path.name}: cannot read: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()[:8]
        )
        raise RegistryError(f"{path.name}: invalid manifest: {problems}") from exc
    if manifest.id != path.stem:
        raise RegistryError(f"{path.name}: manifest id {manifest.id!r} must equal the file name")
    return manifest


def load_registry(directory: Path | None = None, extra: Path | None = None) -> dict[str, Manifest]:
    """All manifests by id: the shipped registry plus the home's own ``registry/`` folder.

    A broken file raises (a registry is trusted configuration, not agent input), and a home
    manifest may add candidates but never shadow a shipped one.
    """
    manifests: dict[str, Manifest] = {}
    for folder in (directory or registry_dir(), extra):
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            manifest = load_manifest(path)
            if manifest.id in manifests:
                raise RegistryError(f"{path}: manifest id {manifest.id!r} is already defined")
            manifests[manifest.id] = manifest
    return manifests


def manifest_hash(manifest: Manifest) -> str:
    return sha256_bytes(canonical_json(manifest.model_dump(mode="json", by_alias=True)))


def registry_hash(manifests: dict[str, Manifest]) -> str:
    return sha256_bytes(canonical_json({k: manifest_hash(m) for k, m in sorted(manifests.items())}))


def split_candidate(candidate_id: str) -> tuple[str, str] | None:
    if candidate_id == BASELINE_ID or not re.fullmatch(CANDIDATE_ID_PATTERN, candidate_id):
        return None
    manifest_id, variant_id = candidate_id.split(":", 1)
    return manifest_id, variant_id


def find_candidate(
    manifests: dict[str, Manifest], candidate_id: str
) -> tuple[Manifest, Variant] | None:
    parts = split_candidate(candidate_id)
    if parts is None or parts[0] not in manifests:
        return None
    manifest = manifests[parts[0]]
    variant = manifest.variant(parts[1])
    return (manifest, variant) if variant else None


def all_candidates(manifests: dict[str, Manifest]) -> list[str]:
    return [f"{m.id}:{v.id}" for m in manifests.values() for v in m.variants]


# ---------------------------------------------------------------------------------------------
# Host facts (shell) and preflight (pure)
# ---------------------------------------------------------------------------------------------


def platform_tag() -> str:
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine in {"amd64", "x64"}:
        machine = "x86_64"
    if machine == "aarch64" and system == "darwin":
        machine = "arm64"
    return f"{system}-{machine}"


def installed_version(package: str) -> str | None:
    return cached_version(package)


def artifact_key(artifact: ArtifactRef) -> str:
    return f"demo:{artifact.demo}" if artifact.demo else f"{artifact.repo}@{artifact.revision}"


def host_facts(home_root: Path, models_dir: Path, hf_cache: Path | None = None) -> HostFacts:
    """Snapshot this machine's facts for preflight."""
    packages = {}
    for name in ("mlx", "mlx-lm", "mlx-vlm", "mcp", "huggingface_hub"):
        version = installed_version(name)
        if version:
            packages[name] = version
    home_root.mkdir(parents=True, exist_ok=True)
    available = [f"demo:{name}" for name in ("target", "draft") if (models_dir / name).is_dir()]
    problems: dict[str, list[str]] = {}
    shared = hub.hub_cache()
    for cache in _caches(hf_cache):
        for key, snap in _cached_hub_artifacts(cache):
            if key in available:
                continue
            available.append(key)
            result = hub.quick_check(snap)
            if not result.ok:
                problems[key] = result.problems
    probe = shared
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return HostFacts(
        platform=platform_tag(),
        packages=packages,
        memory_gb=psutil.virtual_memory().total / 2**30,
        free_disk_gb=shutil.disk_usage(home_root).free / 2**30,
        available_artifacts=available,
        artifact_problems=problems,
        cache_free_disk_gb=shutil.disk_usage(probe).free / 2**30,
    )


def _caches(hf_cache: Path | None) -> list[Path]:
    """Where hub snapshots are looked for: the given cache (the home's), then the shared one
    that ``mcp-infra prepare`` downloads into."""
    caches = [hf_cache] if hf_cache is not None else []
    shared = hub.hub_cache()
    if not any(c.resolve() == shared.resolve() for c in caches):
        caches.append(shared)
    return caches


def _cached_hub_artifacts(hf_cache: Path | None) -> list[tuple[str, Path]]:
    """(repo@revision, snapshot folder) of every non-empty snapshot in a Hugging Face cache."""
    found: list[tuple[str, Path]] = []
    if hf_cache is None or not hf_cache.is_dir():
        return found
    for repo_dir in sorted(hf_cache.glob("models--*")):
        repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
        for snap in sorted((repo_dir / "snapshots").glob("*")):
            if snap.is_dir() and any(snap.iterdir()):
                found.append((f"{repo}@{snap.name}", snap))
    return found


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


def preflight(
    manifest: Manifest, variant: Variant, policy: Policy, facts: HostFacts, *,
    require_artifacts: bool = False,
) -> Preflight:
    """Every check for one candidate on this machine, each with its reason."""
    checks: list[Check] = []

    def check(name: str, passed: bool, ok: str, bad: str) -> None:
        checks.append(Check(name=name, passed=passed, detail=ok if passed else bad))

    cid = f"{manifest.id}:{variant.id}"
    candidate_class = manifest.class_of(variant)
    used = [a for a in manifest.artifacts if a.role != "draft" or variant.knobs.draft]
    artifacts = [manifest.target, *used]  # only what this variant runs with
    hub_refs = [a for a in artifacts if a.repo]
    untrusted = sorted({a.repo for a in hub_refs if a.repo.split("/")[0]
                        not in policy.trusted_namespaces})
    check("trusted_namespace", not untrusted,
          (f"{', '.join(sorted({a.repo.split('/')[0] for a in hub_refs}))} trusted by policy "
           f"{policy.name}") if hub_refs else "no hub artifacts (local demo models)",
          f"not in policy {policy.name}'s trusted namespaces "
          f"({', '.join(policy.trusted_namespaces) or 'none'}): {', '.join(untrusted)}")
    check("class_allowed", candidate_class in policy.allowed_classes,
          f"class {candidate_class.value} is allowed by policy {policy.name}",
          f"class {candidate_class.value} is not allowed by policy {policy.name}")
    template = manifest.runtime.template
    check("template_allowed", template in policy.allowed_templates,
          f"template {template} is allowed by policy {policy.name}",
          f"template {template} is not allowed by policy {policy.name}")
    unpinned = [a.repo for a in hub_refs
                if not (a.revision and re.fullmatch(r"[0-9a-f]{40}", a.revision))]
    check("pinned", not unpinned,
          ("pinned: " + ", ".join(f"{a.repo}@{a.revision[:12]}" for a in hub_refs  # type: ignore[index]
                                  )) if hub_refs else "no hub artifacts (local demo models)",
          f"not pinned to a 40-hex commit: {', '.join(str(r) for r in unpinned)}")
    check("remote_code", not manifest.runtime.trust_remote_code, "trust_remote_code is off",
          "the manifest asks for trust_remote_code, which mcp-infra never enables")
    licenses = ", ".join(f"{a.role} {a.license}" for a in hub_refs if a.license)
    check("license", manifest.license_reviewed,
          "license reviewed" + (f" ({licenses})" if licenses else ""),
          "the manifest does not mark its licenses as reviewed (license_reviewed: true)")
    check("platform", facts.platform in manifest.runtime.platforms,
          f"{facts.platform} is supported",
          f"this machine is {facts.platform}; the manifest runs only on "
          f"{', '.join(manifest.runtime.platforms)}")
    needed = dict(manifest.runtime.min_versions)
    needed.setdefault(RUNTIME_PACKAGES[template], "0")
    needed.setdefault("mlx", "0")
    for package, minimum in sorted(needed.items()):
        have = facts.packages.get(package)
        ok = have is not None and _version_tuple(have) >= _version_tuple(minimum)
        shown = f">= {minimum}" if minimum != "0" else "installed"
        check(f"version:{package}", ok, f"{package} {have} ({shown})",
              f"{package} is not installed (the manifest needs {package} {shown})"
              if have is None else f"{package} {have} is older than the required {minimum}")
    check("memory", facts.memory_gb >= manifest.resources.memory_gb,
          f"{facts.memory_gb:.1f} GB >= {manifest.resources.memory_gb:g} GB required",
          f"this machine has {facts.memory_gb:.1f} GB of memory; the manifest needs "
          f"{manifest.resources.memory_gb:g} GB")
    have = set(facts.available_artifacts)
    missing = [artifact_key(a) for a in artifacts if artifact_key(a) not in have]
    download_gb = sum(a.size_gb or 0 for a in hub_refs if artifact_key(a) not in have)
    free = facts.cache_free_disk_gb if facts.cache_free_disk_gb is not None else facts.free_disk_gb
    check("disk", free >= download_gb,
          f"{free:.1f} GB free >= {download_gb:.2f} GB to download" if download_gb
          else "nothing to download",
          f"only {free:.1f} GB free where the hub cache lives; {download_gb:.2f} GB must be "
          "downloaded")
    check("disk_budget", manifest.resources.disk_gb <= policy.budgets.disk_gb,
          f"{manifest.resources.disk_gb:g} GB of disk within the policy's "
          f"{policy.budgets.disk_gb:g} GB budget",
          f"the manifest needs {manifest.resources.disk_gb:g} GB of disk; the policy's budget "
          f"is {policy.budgets.disk_gb:g} GB")
    check("download_budget", download_gb <= policy.budgets.download_gb,
          f"{download_gb:.2f} GB to download is within the {policy.budgets.download_gb:g} GB "
          "budget",
          f"{download_gb:.2f} GB to download exceeds the policy's {policy.budgets.download_gb:g} "
          "GB download budget")
    if require_artifacts or any(a.demo for a in artifacts):
        hint = "; ".join(
            (["run `mcp-infra demo` to build the demo models"]
             if any(k.startswith("demo:") for k in missing) else [])
            + ([f"run `mcp-infra prepare {cid}`"]
               if any(not k.startswith("demo:") for k in missing) else []))
        check("artifacts", not missing, "all artifacts are present locally",
              f"missing locally: {', '.join(missing)} ({hint})")
    tampered = {k: facts.artifact_problems[k] for k in (artifact_key(a) for a in hub_refs)
                if k in have and k in facts.artifact_problems}
    check("integrity", not tampered,
          "cached hub artifacts match their sha256 inventory (sizes and files; every byte is "
          "re-hashed before use)" if any(artifact_key(a) in have for a in hub_refs)
          else "nothing prepared yet to check" if hub_refs else "local demo models",
          "; ".join(f"{k}: {', '.join(v[:3])}" for k, v in tampered.items()))
    return Preflight(candidate=f"{manifest.id}:{variant.id}",
                     passed=all(c.passed for c in checks), checks=checks)


def resolve_recipe(
    manifest: Manifest, variant: Variant, models_dir: Path, hf_cache: Path | None = None,
    *, fingerprint: object = None,
) -> Recipe:
    """The recipe a candidate runs as: template, knobs, local paths of its artifacts."""
    draft = manifest.draft_artifact() if variant.knobs.draft else None
    model_path = artifact_path(manifest.target, models_dir, hf_cache)
    draft_path = artifact_path(draft, models_dir, hf_cache) if draft else None
    hashes: dict[str, str] = {}
    if callable(fingerprint):  # about to be used: hub snapshots must match their inventory
        for role, artifact, path in (("target", manifest.target, model_path),
                                     ("draft", draft, draft_path)):
            if artifact is None or path is None:
                continue
            if artifact.repo and Path(path).is_dir():
                hashes[role] = "inventory:" + hub.ensure_untampered(Path(path))
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
    )


def artifact_path(artifact: ArtifactRef, models_dir: Path, hf_cache: Path | None) -> str:
    if artifact.demo:
        return str(models_dir / artifact.demo)
    assert artifact.repo and artifact.revision
    found = hub.find_snapshot(artifact.repo, artifact.revision, _caches(hf_cache))
    # not prepared yet: where `mcp-infra prepare` will put it (the shared Hugging Face cache)
    return str(found or hub.snapshot_path(hub.hub_cache(), artifact.repo, artifact.revision))
