"""Registry: candidate manifests, their preflight on this machine, and candidate → recipe.

Preflight is a pure function of a manifest, the policy and a snapshot of this machine's facts
(``HostFacts``), so every check can be tested directly and one failing manifest never hides the
others: each check reports pass/fail and why.
"""

from __future__ import annotations

import platform
import re
import shutil
from importlib import metadata
from pathlib import Path

import psutil
import yaml
from pydantic import Field, ValidationError

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
    return REPO_ROOT / "registry"


def load_manifest(path: Path) -> Manifest:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


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
    available += _cached_hub_artifacts(hf_cache)
    return HostFacts(
        platform=platform_tag(),
        packages=packages,
        memory_gb=psutil.virtual_memory().total / 2**30,
        free_disk_gb=shutil.disk_usage(home_root).free / 2**30,
        available_artifacts=available,
    )


def _cached_hub_artifacts(hf_cache: Path | None) -> list[str]:
    """repo@revision of every complete snapshot folder in a Hugging Face cache."""
    found: list[str] = []
    if hf_cache is None or not hf_cache.is_dir():
        return found
    for repo_dir in hf_cache.glob("models--*"):
        repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
        for snap in (repo_dir / "snapshots").glob("*"):
            if snap.is_dir() and any(snap.iterdir()):
                found.append(f"{repo}@{snap.name}")
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

    candidate_class = manifest.class_of(variant)
    used = [a for a in manifest.artifacts if a.role != "draft" or variant.knobs.draft]
    artifacts = [manifest.target, *used]  # only what this variant runs with
    hub = [a for a in artifacts if a.repo]
    untrusted = [a.repo for a in hub if a.repo.split("/")[0] not in policy.trusted_namespaces]
    check("trusted_namespace", not untrusted, "every hub artifact is from a trusted namespace",
          f"not in the policy's trusted namespaces: {', '.join(sorted(set(untrusted)))}")
    check("class_allowed", candidate_class in policy.allowed_classes,
          f"class {candidate_class.value} is allowed",
          f"class {candidate_class.value} is not allowed by policy {policy.name}")
    template = manifest.runtime.template
    check("template_allowed", template in policy.allowed_templates,
          f"template {template} is allowed", f"template {template} is not allowed by policy")
    check("pinned", all(a.revision for a in hub),
          "every hub artifact is pinned to a 40-hex revision" if hub else "no hub artifacts",
          "a hub artifact is not pinned")
    check("remote_code", not manifest.runtime.trust_remote_code, "trust_remote_code is off",
          "the manifest asks for trust_remote_code, which mcp-infra never enables")
    check("license", manifest.license_reviewed, "license reviewed",
          "license not marked as reviewed in the manifest")
    check("platform", facts.platform in manifest.runtime.platforms,
          f"{facts.platform} is supported",
          f"this machine is {facts.platform}; the manifest supports only "
          f"{', '.join(manifest.runtime.platforms)}")
    needed = dict(manifest.runtime.min_versions)
    needed.setdefault(RUNTIME_PACKAGES[template], "0")
    for package, minimum in sorted(needed.items()):
        have = facts.packages.get(package)
        ok = have is not None and _version_tuple(have) >= _version_tuple(minimum)
        check(f"version:{package}", ok, f"{package} {have} >= {minimum}",
              f"{package} is not installed" if have is None
              else f"{package} {have} is older than the required {minimum}")
    check("memory", facts.memory_gb >= manifest.resources.memory_gb,
          f"{facts.memory_gb:.1f} GB >= {manifest.resources.memory_gb:.1f} GB required",
          f"this machine has {facts.memory_gb:.1f} GB; the manifest needs "
          f"{manifest.resources.memory_gb:.1f} GB")
    have = set(facts.available_artifacts)
    missing = [artifact_key(a) for a in artifacts if artifact_key(a) not in have]
    download_gb = sum(a.size_gb or 0 for a in artifacts
                      if artifact_key(a) not in facts.available_artifacts)
    check("disk", facts.free_disk_gb >= download_gb,
          f"{facts.free_disk_gb:.1f} GB free >= {download_gb:.2f} GB to download",
          f"only {facts.free_disk_gb:.1f} GB free; {download_gb:.2f} GB must be downloaded")
    check("download_budget", download_gb <= policy.budgets.download_gb,
          f"{download_gb:.2f} GB to download is within the {policy.budgets.download_gb} GB budget",
          f"{download_gb:.2f} GB to download exceeds the {policy.budgets.download_gb} GB budget")
    if require_artifacts or any(a.demo for a in artifacts):
        check("artifacts", not missing, "all artifacts are present locally",
              f"missing locally: {', '.join(missing)} (run `mcp-infra demo` for demo models or "
              "`mcp-infra prepare` for hub artifacts)")
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
    if callable(fingerprint):
        hashes["target"] = fingerprint(Path(model_path))
        if draft_path:
            hashes["draft"] = fingerprint(Path(draft_path))
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
    cache = hf_cache or Path.home() / ".cache" / "huggingface" / "hub"
    folder = cache / f"models--{artifact.repo.replace('/', '--')}" / "snapshots" / artifact.revision
    return str(folder)
