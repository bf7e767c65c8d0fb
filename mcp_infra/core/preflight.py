"""Registry: candidate manifests, their preflight on this machine, and candidate → recipe.

Preflight is a pure function of a manifest, the policy and a snapshot of this machine's facts
(``HostFacts``), so every check can be tested directly and one failing manifest never hides the
others: each check reports pass/fail and why.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import Field

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    EXACT_VERSION_PATTERN,
    SHA256_PATTERN,
    ArtifactRef,
    Manifest,
    Part,
    Policy,
    RuntimeEnvSpec,
    TemplateName,
    Variant,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.templates import unknown_flags

RUNTIME_PACKAGES = {
    "mlx_lm_server": "mlx-lm",
    "mlx_vlm_server": "mlx-vlm",
    "mlx_lm_distributed": "mlx-lm",
}


class RuntimeFacts(Part):
    """A runtime environment built under ``<home>/runtimes/<hash>/``, as its lock says and a
    quick look (file set, sizes, visible packages) found it."""

    built: bool
    problems: list[str] = Field(default_factory=list)
    packages: dict[str, str] = Field(default_factory=dict)
    accepted_flags: dict[str, list[str]] = Field(default_factory=dict)
    size_bytes: int = 0
    lock_digest: str | None = None


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
    python: str = Field("", description="the control plane's Python (X.Y.Z)")
    shared_site: str = Field("", description="the control plane's site-packages")
    runtimes: dict[str, RuntimeFacts] = Field(
        default_factory=dict, description="built runtime environments by content hash"
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


SPLIT_DEMO = "demo:split-target"
MANIFEST_LATER_FIELDS = frozenset({"environment"})
"""Manifest fields added later: absent while None, so a manifest frozen before keeps its hash."""


def manifest_hash(manifest: Manifest) -> str:
    data = manifest.model_dump(mode="json", by_alias=True)
    return sha256_bytes(canonical_json(data, absent_when_none=MANIFEST_LATER_FIELDS))


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


def normalize_name(name: str) -> str:
    """A package name as PEP 503 compares it (``MLX_LM`` and ``mlx-lm`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin_problems(spec: RuntimeEnvSpec) -> list[str]:
    """Why a runtime environment is not pinned (empty: every package has an exact version and
    at least one sha256): what pip's ``--require-hashes`` would refuse, said before it runs."""
    problems = []
    for package in spec.packages:
        if not re.fullmatch(EXACT_VERSION_PATTERN, package.version):
            problems.append(
                f"{package.name} {package.version!r} is not an exact version (write X.Y.Z)"
            )
        if not package.sha256:
            problems.append(f"{package.name} has no sha256 (pip --require-hashes needs one)")
        bad = [h for h in package.sha256 if not re.fullmatch(SHA256_PATTERN, h)]
        if bad:
            problems.append(f"{package.name}: {len(bad)} sha256 value(s) are not 64 hex digits")
    return problems


def env_hash(spec: RuntimeEnvSpec, python: str, platform: str, shared_site: str) -> str:
    """The content hash naming a runtime environment's folder: what is pinned, for which
    interpreter (X.Y) and platform, and (site: shared) which control plane it sees."""
    return sha256_bytes(
        canonical_json(
            {
                "spec": spec.model_dump(mode="json"),
                "python": ".".join(python.split(".")[:2]),
                "platform": platform,
                "shared_site": shared_site if spec.site == "shared" else None,
            }
        )
    )


def env_label(spec: RuntimeEnvSpec) -> str:
    """What an environment is, in a few words: its runtime packages first."""
    runtime = [p for p in spec.packages if p.name in RUNTIME_PACKAGES.values()]
    shown = runtime or spec.packages[:2]
    words = ", ".join(f"{p.name} {p.version}" for p in shown)
    site = "on the control plane's site" if spec.site == "shared" else "isolated"
    return f"{words} ({site})"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


def runtime_checks(
    check: Callable[[str, bool, str, str], None],
    spec: RuntimeEnvSpec,
    template: TemplateName,
    variant: Variant,
    facts: HostFacts,
    cid: str,
) -> dict[str, str]:
    """The checks of a candidate's own runtime environment: pinned, for this Python, built,
    untampered, and every flag its knobs pass listed by that runtime's ``--help``. Returns the
    packages the environment serves with (its lock once built, else what it pins over what it
    would share), for the version checks."""
    pins = pin_problems(spec)
    check(
        "runtime_pinned",
        not pins,
        f"{len(spec.packages)} package(s) pinned to exact versions with sha256",
        "not pinned: " + "; ".join(pins),
    )
    have_python = ".".join(facts.python.split(".")[:2])
    check(
        "runtime_python",
        have_python == spec.python,
        f"Python {spec.python}, as the control plane's interpreter it is built from",
        f"the environment needs Python {spec.python}; this machine builds it from the control "
        f"plane's Python {have_python or 'unknown'}",
    )
    digest = env_hash(spec, facts.python, facts.platform, facts.shared_site)
    built = facts.runtimes.get(digest)
    where = f"runtimes/{digest[:12]}"
    check(
        "runtime_built",
        built is not None and built.built,
        f"built in {where} ({env_label(spec)})",
        f"not built yet ({where}): run `mcp-infra prepare {cid}`",
    )
    check(
        "runtime_integrity",
        built is None or not built.problems,
        "its files and packages match the lock" if built else "nothing built yet to check",
        "the environment differs from its lock: " + "; ".join(built.problems[:3] if built else []),
    )
    if built is None or not built.built:
        check(
            "runtime_flags",
            True,
            "checked against the runtime's --help when the environment is built",
            "",
        )
        pinned = {normalize_name(p.name): p.version for p in spec.packages}
        return {**(facts.packages if spec.site == "shared" else {}), **pinned}
    accepted = built.accepted_flags.get(template)
    try:
        unknown = unknown_flags(template, variant.knobs, accepted or [])
    except ValueError as exc:
        unknown = [str(exc)]
    check(
        "runtime_flags",
        accepted is not None and not unknown,
        f"every flag it passes is in the --help of {template} in this environment",
        f"the environment has no {template} server to ask (no {RUNTIME_PACKAGES[template]} in it)"
        if accepted is None
        else f"{RUNTIME_PACKAGES[template]} {built.packages.get(RUNTIME_PACKAGES[template], '?')} "
        f"does not accept {', '.join(unknown)} (its --help at build time)",
    )
    return dict(built.packages)


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
    spec = manifest.environment_of(variant)
    packages = dict(facts.packages)
    if spec is not None:
        packages = runtime_checks(check, spec, template, variant, facts, cid)
    needed = dict(manifest.runtime.min_versions)
    needed.setdefault(RUNTIME_PACKAGES[template], "0")
    needed.setdefault("mlx", "0")
    for package, minimum in sorted(needed.items()):
        version = packages.get(package)
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
                if any(k.startswith("demo:") and k != SPLIT_DEMO for k in missing)
                else []
            )
            + (
                [
                    "the splittable demo target is built by "
                    "mcp_infra.demo.models.build_split_target(<home>/models)"
                ]
                if SPLIT_DEMO in missing
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
