"""Registry: candidate manifests, their preflight on this machine, and candidate → recipe.

Preflight is a pure function of a manifest, the policy and a snapshot of this machine's facts
(``HostFacts``), so every check can be tested directly and one failing manifest never hides the
others: each check reports pass/fail and why.
"""

from __future__ import annotations

import re

from pydantic import Field

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    ArtifactRef,
    Manifest,
    Part,
    Policy,
    Variant,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes

RUNTIME_PACKAGES = {"mlx_lm_server": "mlx-lm", "mlx_vlm_server": "mlx-vlm"}


class HostFacts(Part):
    """What preflight needs to know about this machine, gathered once by ``host_facts``."""

    platform: str
    packages: dict[str, str]
    memory_gb: float
    free_disk_gb: float
    available_artifacts: list[str] = Field(default_factory=list)
    artifact_problems: dict[str, list[str]] = Field(
        default_factory=dict,
        description="repo@revision → why its cached snapshot cannot be "
        "trusted (no sha256 inventory, missing, extra or resized files)",
    )
    cache_free_disk_gb: float | None = Field(
        None, description="free space where hub downloads go (the shared Hugging Face cache)"
    )


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


def artifact_key(artifact: ArtifactRef) -> str:
    return f"demo:{artifact.demo}" if artifact.demo else f"{artifact.repo}@{artifact.revision}"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


def preflight(
    manifest: Manifest,
    variant: Variant,
    policy: Policy,
    facts: HostFacts,
    *,
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
    repos = [a.repo for a in hub_refs if a.repo]  # the same artifacts, their repo ids typed
    untrusted = sorted({r for r in repos if r.split("/")[0] not in policy.trusted_namespaces})
    check(
        "trusted_namespace",
        not untrusted,
        (f"{', '.join(sorted({r.split('/')[0] for r in repos}))} trusted by policy {policy.name}")
        if hub_refs
        else "no hub artifacts (local demo models)",
        f"not in policy {policy.name}'s trusted namespaces "
        f"({', '.join(policy.trusted_namespaces) or 'none'}): {', '.join(untrusted)}",
    )
    check(
        "class_allowed",
        candidate_class in policy.allowed_classes,
        f"class {candidate_class.value} is allowed by policy {policy.name}",
        f"class {candidate_class.value} is not allowed by policy {policy.name}",
    )
    template = manifest.runtime.template
    check(
        "template_allowed",
        template in policy.allowed_templates,
        f"template {template} is allowed by policy {policy.name}",
        f"template {template} is not allowed by policy {policy.name}",
    )
    unpinned = [
        a.repo for a in hub_refs if not (a.revision and re.fullmatch(r"[0-9a-f]{40}", a.revision))
    ]
    check(
        "pinned",
        not unpinned,
        ("pinned: " + ", ".join(f"{a.repo}@{(a.revision or '')[:12]}" for a in hub_refs))
        if hub_refs
        else "no hub artifacts (local demo models)",
        f"not pinned to a 40-hex commit: {', '.join(str(r) for r in unpinned)}",
    )
    check(
        "remote_code",
        not manifest.runtime.trust_remote_code,
        "trust_remote_code is off",
        "the manifest asks for trust_remote_code, which mcp-infra never enables",
    )
    licenses = ", ".join(f"{a.role} {a.license}" for a in hub_refs if a.license)
    check(
        "license",
        manifest.license_reviewed,
        "license reviewed" + (f" ({licenses})" if licenses else ""),
        "the manifest does not mark its licenses as reviewed (license_reviewed: true)",
    )
    check(
        "platform",
        facts.platform in manifest.runtime.platforms,
        f"{facts.platform} is supported",
        f"this machine is {facts.platform}; the manifest runs only on "
        f"{', '.join(manifest.runtime.platforms)}",
    )
    needed = dict(manifest.runtime.min_versions)
    needed.setdefault(RUNTIME_PACKAGES[template], "0")
    needed.setdefault("mlx", "0")
    for package, minimum in sorted(needed.items()):
        version = facts.packages.get(package)
        ok = version is not None and _version_tuple(version) >= _version_tuple(minimum)
        shown = f">= {minimum}" if minimum != "0" else "installed"
        check(
            f"version:{package}",
            ok,
            f"{package} {version} ({shown})",
            f"{package} is not installed (the manifest needs {package} {shown})"
            if version is None
            else f"{package} {version} is older than the required {minimum}",
        )
    check(
        "memory",
        facts.memory_gb >= manifest.resources.memory_gb,
        f"{facts.memory_gb:.1f} GB >= {manifest.resources.memory_gb:g} GB required",
        f"this machine has {facts.memory_gb:.1f} GB of memory; the manifest needs "
        f"{manifest.resources.memory_gb:g} GB",
    )
    have = set(facts.available_artifacts)
    missing = [artifact_key(a) for a in artifacts if artifact_key(a) not in have]
    download_gb = sum(a.size_gb or 0 for a in hub_refs if artifact_key(a) not in have)
    free = facts.cache_free_disk_gb if facts.cache_free_disk_gb is not None else facts.free_disk_gb
    check(
        "disk",
        free >= download_gb,
        f"{free:.1f} GB free >= {download_gb:.2f} GB to download"
        if download_gb
        else "nothing to download",
        f"only {free:.1f} GB free where the hub cache lives; {download_gb:.2f} GB must be "
        "downloaded",
    )
    check(
        "disk_budget",
        manifest.resources.disk_gb <= policy.budgets.disk_gb,
        f"{manifest.resources.disk_gb:g} GB of disk within the policy's "
        f"{policy.budgets.disk_gb:g} GB budget",
        f"the manifest needs {manifest.resources.disk_gb:g} GB of disk; the policy's budget "
        f"is {policy.budgets.disk_gb:g} GB",
    )
    check(
        "download_budget",
        download_gb <= policy.budgets.download_gb,
        f"{download_gb:.2f} GB to download is within the {policy.budgets.download_gb:g} GB budget",
        f"{download_gb:.2f} GB to download exceeds the policy's {policy.budgets.download_gb:g} "
        "GB download budget",
    )
    if require_artifacts or any(a.demo for a in artifacts):
        hint = "; ".join(
            (
                ["run `mcp-infra demo` to build the demo models"]
                if any(k.startswith("demo:") for k in missing)
                else []
            )
            + (
                [f"run `mcp-infra prepare {cid}`"]
                if any(not k.startswith("demo:") for k in missing)
                else []
            )
        )
        check(
            "artifacts",
            not missing,
            "all artifacts are present locally",
            f"missing locally: {', '.join(missing)} ({hint})",
        )
    tampered = {
        k: facts.artifact_problems[k]
        for k in (artifact_key(a) for a in hub_refs)
        if k in have and k in facts.artifact_problems
    }
    check(
        "integrity",
        not tampered,
        "cached hub artifacts match their sha256 inventory (sizes and files; every byte is "
        "re-hashed before use)"
        if any(artifact_key(a) in have for a in hub_refs)
        else "nothing prepared yet to check"
        if hub_refs
        else "local demo models",
        "; ".join(f"{k}: {', '.join(v[:3])}" for k, v in tampered.items()),
    )
    return Preflight(
        candidate=f"{manifest.id}:{variant.id}", passed=all(c.passed for c in checks), checks=checks
    )
