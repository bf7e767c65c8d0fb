"""Registry: candidate manifests, their preflight on this machine, and candidate → recipe.

Preflight is a pure function of a manifest, the policy and a snapshot of this machine's facts
(``HostFacts``), so every check can be tested directly and one failing manifest never hides the
others: each check reports pass/fail and why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from pydantic import Field

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    EXACT_VERSION_PATTERN,
    SHA256_PATTERN,
    ArtifactRef,
    FolderFacts,
    Manifest,
    Part,
    Policy,
    RuntimeEnvSpec,
    TemplateName,
    Variant,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.modelfacts import (
    RUNTIME_KV_GROUP,
    fit_problem,
    kv_groups,
    memory_need_gb,
    same_model,
    tokenizer_differences,
)
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
    target: FolderFacts | None = Field(
        None, description="the live model: the configured baseline's folder, as read now"
    )
    artifact_paths: dict[str, str] = Field(
        default_factory=dict,
        description="artifact key → the folder it resolves to here (symlinks resolved)",
    )
    folders: dict[str, FolderFacts] = Field(
        default_factory=dict, description="folder → its facts, for the folders that exist"
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


CONFIGURED = "configured"


def artifact_key(artifact: ArtifactRef) -> str:
    """One string per artifact: ``demo:NAME``, ``path:/FOLDER``, ``configured`` or
    ``REPO@REVISION``."""
    if artifact.demo:
        return f"demo:{artifact.demo}"
    if artifact.path:
        return f"path:{artifact.path}"
    if artifact.configured:
        return CONFIGURED
    return f"{artifact.repo}@{artifact.revision}"


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
    spec: RuntimeEnvSpec,
    template: TemplateName,
    variant: Variant,
    facts: HostFacts,
    cid: str,
) -> tuple[list[Check], dict[str, str]]:
    """The checks of a candidate's own runtime environment: pinned, for this Python, built,
    untampered, and every flag its knobs pass listed by that runtime's ``--help``; and the
    packages the environment serves with (its lock once built, else what it pins over what it
    would share), for the version checks."""
    pins = pin_problems(spec)
    have_python = ".".join(facts.python.split(".")[:2])
    digest = env_hash(spec, facts.python, facts.platform, facts.shared_site)
    built = facts.runtimes.get(digest)
    where = f"runtimes/{digest[:12]}"
    checks = [
        _check(
            "runtime_pinned",
            not pins,
            f"{len(spec.packages)} package(s) pinned to exact versions with sha256",
            "not pinned: " + "; ".join(pins),
        ),
        _check(
            "runtime_python",
            have_python == spec.python,
            f"Python {spec.python}, as the control plane's interpreter it is built from",
            f"the environment needs Python {spec.python}; this machine builds it from the "
            f"control plane's Python {have_python or 'unknown'}",
        ),
        _check(
            "runtime_built",
            built is not None and built.built,
            f"built in {where} ({env_label(spec)})",
            f"not built yet ({where}): run `mcp-infra prepare {cid}`",
        ),
        _check(
            "runtime_integrity",
            built is None or not built.problems,
            "its files and packages match the lock" if built else "nothing built yet to check",
            "the environment differs from its lock: "
            + "; ".join(built.problems[:3] if built else []),
        ),
    ]
    if built is None or not built.built:
        checks.append(
            _check(
                "runtime_flags",
                True,
                "checked against the runtime's --help when the environment is built",
                "",
            )
        )
        pinned = {normalize_name(p.name): p.version for p in spec.packages}
        return checks, {**(facts.packages if spec.site == "shared" else {}), **pinned}
    checks.append(_flags_check(template, variant, built))
    return checks, dict(built.packages)


def _flags_check(template: TemplateName, variant: Variant, built: RuntimeFacts) -> Check:
    accepted = built.accepted_flags.get(template)
    try:
        unknown = unknown_flags(template, variant.knobs, accepted or [])
    except ValueError as exc:
        unknown = [str(exc)]
    package = RUNTIME_PACKAGES[template]
    return _check(
        "runtime_flags",
        accepted is not None and not unknown,
        f"every flag it passes is in the --help of {template} in this environment",
        f"the environment has no {template} server to ask (no {package} in it)"
        if accepted is None
        else f"{package} {built.packages.get(package, '?')} does not accept "
        f"{', '.join(unknown)} (its --help at build time)",
    )


# ---------------------------------------------------------------------------------------------
# The checks, one short function each, over one `Subject`; `CHECKS` is their table
# ---------------------------------------------------------------------------------------------


def _check(name: str, passed: bool, ok: str, bad: str) -> Check:
    return Check(name=name, passed=passed, detail=ok if passed else bad)


@dataclass
class Subject:
    """One candidate as every check sees it: its manifest and variant, the policy, this
    machine's facts, and what follows from them (the artifacts it runs with, its hub pins)."""

    manifest: Manifest
    variant: Variant
    policy: Policy
    facts: HostFacts
    require_artifacts: bool = False

    @property
    def cid(self) -> str:
        return f"{self.manifest.id}:{self.variant.id}"

    @cached_property
    def artifacts(self) -> list[ArtifactRef]:
        """Only what this variant runs with: the target, and the drafter if it drafts."""
        used = [a for a in self.manifest.artifacts if a.role != "draft" or self.variant.knobs.draft]
        return [self.manifest.target, *used]

    @cached_property
    def hub_refs(self) -> list[ArtifactRef]:
        return [a for a in self.artifacts if a.repo]

    @cached_property
    def repos(self) -> list[str]:
        return [a.repo for a in self.hub_refs if a.repo]

    @property
    def template(self) -> TemplateName:
        return self.manifest.runtime.template

    @cached_property
    def environment(self) -> tuple[list[Check], dict[str, str]]:
        """The checks of its own runtime environment, if it names one, and the packages it
        serves with (the control plane's otherwise)."""
        spec = self.manifest.environment_of(self.variant)
        if spec is None:
            return [], dict(self.facts.packages)
        return runtime_checks(spec, self.template, self.variant, self.facts, self.cid)

    def folder(self, artifact: ArtifactRef) -> FolderFacts | None:
        """The facts of an artifact's folder, where it is on this machine."""
        path = self.facts.artifact_paths.get(artifact_key(artifact))
        return self.facts.folders.get(path) if path else None

    @cached_property
    def draft(self) -> ArtifactRef | None:
        return self.manifest.draft_artifact() if self.variant.knobs.draft else None


def trusted_namespace(s: Subject) -> list[Check]:
    untrusted = sorted({r for r in s.repos if r.split("/")[0] not in s.policy.trusted_namespaces})
    return [
        _check(
            "trusted_namespace",
            not untrusted,
            f"{', '.join(sorted({r.split('/')[0] for r in s.repos}))} trusted by policy "
            f"{s.policy.name}"
            if s.hub_refs
            else "no hub artifacts (local demo models)",
            f"not in policy {s.policy.name}'s trusted namespaces "
            f"({', '.join(s.policy.trusted_namespaces) or 'none'}): {', '.join(untrusted)}",
        )
    ]


def class_allowed(s: Subject) -> list[Check]:
    klass = s.manifest.class_of(s.variant).value
    return [
        _check(
            "class_allowed",
            s.manifest.class_of(s.variant) in s.policy.allowed_classes,
            f"class {klass} is allowed by policy {s.policy.name}",
            f"class {klass} is not allowed by policy {s.policy.name}",
        )
    ]


def template_allowed(s: Subject) -> list[Check]:
    return [
        _check(
            "template_allowed",
            s.template in s.policy.allowed_templates,
            f"template {s.template} is allowed by policy {s.policy.name}",
            f"template {s.template} is not allowed by policy {s.policy.name}",
        )
    ]


def pinned(s: Subject) -> list[Check]:
    unpinned = [
        a.repo for a in s.hub_refs if not (a.revision and re.fullmatch(r"[0-9a-f]{40}", a.revision))
    ]
    return [
        _check(
            "pinned",
            not unpinned,
            ("pinned: " + ", ".join(f"{a.repo}@{(a.revision or '')[:12]}" for a in s.hub_refs))
            if s.hub_refs
            else "no hub artifacts (local demo models)",
            f"not pinned to a 40-hex commit: {', '.join(str(r) for r in unpinned)}",
        )
    ]


def remote_code(s: Subject) -> list[Check]:
    return [
        _check(
            "remote_code",
            not s.manifest.runtime.trust_remote_code,
            "trust_remote_code is off",
            "the manifest asks for trust_remote_code, which mcp-infra never enables",
        )
    ]


def license_reviewed(s: Subject) -> list[Check]:
    licenses = ", ".join(f"{a.role} {a.license}" for a in s.hub_refs if a.license)
    return [
        _check(
            "license",
            s.manifest.license_reviewed,
            "license reviewed" + (f" ({licenses})" if licenses else ""),
            "the manifest does not mark its licenses as reviewed (license_reviewed: true)",
        )
    ]


def platform(s: Subject) -> list[Check]:
    return [
        _check(
            "platform",
            s.facts.platform in s.manifest.runtime.platforms,
            f"{s.facts.platform} is supported",
            f"this machine is {s.facts.platform}; the manifest runs only on "
            f"{', '.join(s.manifest.runtime.platforms)}",
        )
    ]


def runtime_environment(s: Subject) -> list[Check]:
    return s.environment[0]


def versions(s: Subject) -> list[Check]:
    packages = s.environment[1]
    needed = dict(s.manifest.runtime.min_versions)
    needed.setdefault(RUNTIME_PACKAGES[s.template], "0")
    needed.setdefault("mlx", "0")
    checks = []
    for package, minimum in sorted(needed.items()):
        version = packages.get(package)
        ok = version is not None and _version_tuple(version) >= _version_tuple(minimum)
        shown = f">= {minimum}" if minimum != "0" else "installed"
        checks.append(
            _check(
                f"version:{package}",
                ok,
                f"{package} {version} ({shown})",
                f"{package} is not installed (the manifest needs {package} {shown})"
                if version is None
                else f"{package} {version} is older than the required {minimum}",
            )
        )
    return checks


def memory(s: Subject) -> list[Check]:
    need = s.manifest.resources.memory_gb
    return [
        _check(
            "memory",
            s.facts.memory_gb >= need,
            f"{s.facts.memory_gb:.1f} GB >= {need:g} GB required",
            f"this machine has {s.facts.memory_gb:.1f} GB of memory; the manifest needs "
            f"{need:g} GB",
        )
    ]


def _download_gb(s: Subject) -> float:
    have = set(s.facts.available_artifacts)
    return sum(a.size_gb or 0 for a in s.hub_refs if artifact_key(a) not in have)


def disk(s: Subject) -> list[Check]:
    download_gb = _download_gb(s)
    facts = s.facts
    free = facts.cache_free_disk_gb if facts.cache_free_disk_gb is not None else facts.free_disk_gb
    return [
        _check(
            "disk",
            free >= download_gb,
            f"{free:.1f} GB free >= {download_gb:.2f} GB to download"
            if download_gb
            else "nothing to download",
            f"only {free:.1f} GB free where the hub cache lives; {download_gb:.2f} GB must be "
            "downloaded",
        )
    ]


def budgets(s: Subject) -> list[Check]:
    disk_gb, budget = s.manifest.resources.disk_gb, s.policy.budgets
    download_gb = _download_gb(s)
    return [
        _check(
            "disk_budget",
            disk_gb <= budget.disk_gb,
            f"{disk_gb:g} GB of disk within the policy's {budget.disk_gb:g} GB budget",
            f"the manifest needs {disk_gb:g} GB of disk; the policy's budget is "
            f"{budget.disk_gb:g} GB",
        ),
        _check(
            "download_budget",
            download_gb <= budget.download_gb,
            f"{download_gb:.2f} GB to download is within the {budget.download_gb:g} GB budget",
            f"{download_gb:.2f} GB to download exceeds the policy's {budget.download_gb:g} "
            "GB download budget",
        ),
    ]


def _missing_hint(s: Subject, missing: list[str]) -> str:
    hints = []
    if any(k.startswith("demo:") and k != SPLIT_DEMO for k in missing):
        hints.append("run `mcp-infra demo` to build the demo models")
    if SPLIT_DEMO in missing:
        hints.append(
            "the splittable demo target is built by "
            "mcp_infra.demo.models.build_split_target(<home>/models)"
        )
    if any(k.startswith("path:") or k == CONFIGURED for k in missing):
        hints.append("the folder is gone: run `mcp-infra init --model` again")
    if any(not k.startswith(("demo:", "path:")) and k != CONFIGURED for k in missing):
        hints.append(f"run `mcp-infra prepare {s.cid}`")
    return "; ".join(hints)


def artifacts_present(s: Subject) -> list[Check]:
    if not (s.require_artifacts or any(a.demo for a in s.artifacts)):
        return []
    have = set(s.facts.available_artifacts) | {
        artifact_key(a) for a in s.artifacts if not a.repo and not a.demo and s.folder(a)
    }
    missing = [artifact_key(a) for a in s.artifacts if artifact_key(a) not in have]
    return [
        _check(
            "artifacts",
            not missing,
            "all artifacts are present locally",
            f"missing locally: {', '.join(missing)} ({_missing_hint(s, missing)})",
        )
    ]


def integrity(s: Subject) -> list[Check]:
    have = set(s.facts.available_artifacts)
    keys = [artifact_key(a) for a in s.hub_refs]
    problems = s.facts.artifact_problems
    tampered = {k: problems[k] for k in keys if k in have and k in problems}
    return [
        _check(
            "integrity",
            not tampered,
            "cached hub artifacts match their sha256 inventory (sizes and files; every byte is "
            "re-hashed before use)"
            if any(k in have for k in keys)
            else "nothing prepared yet to check"
            if s.hub_refs
            else "local demo models",
            "; ".join(f"{k}: {', '.join(v[:3])}" for k, v in tampered.items()),
        )
    ]


# The checks against the live model: the facts of the configured target's folder
# (``HostFacts.target``) beside the facts of the candidate's own folders.


def _shown(artifact: ArtifactRef, path: str | None) -> str:
    """An artifact in few words: a hub pin or demo name as such, a local folder by its path."""
    if artifact.repo and artifact.revision:
        return f"{artifact.repo}@{artifact.revision[:12]}"
    return artifact_key(artifact) if artifact.demo or not path else path


def same_target(s: Subject) -> list[Check]:
    live = s.facts.target
    path = s.facts.artifact_paths.get(artifact_key(s.manifest.target))
    if live is None or s.manifest.target.configured:
        said = "no live model configured to compare with" if live is None else ""
        return [_check("same_target", True, said or "serves the configured target", "")]
    digest = s.manifest.target.digest
    same = path == live.path and not (digest and live.digest and digest != live.digest)
    return [
        _check(
            "same_target",
            same,
            f"its target is the live model ({live.path})",
            f"another model's candidate: its target is {_shown(s.manifest.target, path)}, "
            "not the live model"
            if path != live.path
            else f"made for another state of {live.path} (files {digest and digest[:12]}…, now "
            f"{live.digest and live.digest[:12]}…)",
        )
    ]


def loadable(s: Subject) -> list[Check]:
    checks = []
    for artifact in (s.manifest.target, *([s.draft] if s.draft else [])):
        folder = s.folder(artifact)
        if folder is None or folder.shape is None:
            continue
        runtime = RUNTIME_PACKAGES[s.template]
        model_type = folder.shape.model_type
        checks.append(
            _check(
                f"loadable:{artifact.role}",
                s.template in folder.loaders,
                f"{runtime} {s.facts.packages.get(runtime, '?')} loads model_type {model_type}",
                f"{runtime} {s.facts.packages.get(runtime, '?')} cannot load model_type "
                f"{model_type!r} ({artifact.role} {folder.path}): it has no module for it",
            )
        )
    return checks


def drafter_tokenizer(s: Subject) -> list[Check]:
    live = s.facts.target
    if s.draft is None or s.draft.configured or live is None:
        return []
    folder = s.folder(s.draft)
    if folder is None:
        return [_check("drafter_tokenizer", True, "checked once the drafter's folder is here", "")]
    if live.tokenizer is None or folder.tokenizer is None:
        whose = "the target's" if live.tokenizer is None else "the drafter's"
        return [_check("drafter_tokenizer", False, "", f"{whose} tokenizer files cannot be read")]
    problems = tokenizer_differences(live.tokenizer, folder.tokenizer)
    return [
        _check(
            "drafter_tokenizer",
            not problems,
            f"the drafter's tokenizer agrees with the target's ({live.tokenizer.vocab_size} "
            "tokens, same special-token ids)",
            "the drafter's tokenizer disagrees with the target's: " + "; ".join(problems),
        )
    ]


def kv_group(s: Subject) -> list[Check]:
    knobs = s.variant.knobs
    if knobs.kv_bits is None:
        return []
    group = knobs.kv_group_size or RUNTIME_KV_GROUP
    shape = s.facts.target.shape if s.facts.target else None
    head_dim = shape.head_dim if shape else None
    if not head_dim:
        return [_check("kv_group", True, "the live model's head dimension is unknown", "")]
    return [
        _check(
            "kv_group",
            head_dim % group == 0,
            f"KV group size {group} divides the head dimension {head_dim}",
            f"KV group size {group} does not divide the live model's head dimension {head_dim}: "
            "every request would fail in mx.quantize"
            + (
                f" (groups that divide it: {', '.join(map(str, kv_groups(head_dim)))})"
                if kv_groups(head_dim)
                else ""
            ),
        )
    ]


def model_memory(s: Subject) -> list[Check]:
    weights = {f.path: f.weights_bytes for a in s.artifacts if (f := s.folder(a)) is not None}
    if not sum(weights.values()):
        return []
    total = sum(weights.values())
    fraction = s.policy.service.memory_budget_fraction
    problem = fit_problem(total, s.facts.memory_gb, fraction)
    return [
        _check(
            "model_memory",
            problem is None,
            f"its models need about {memory_need_gb(total):.1f} GiB of the "
            f"{s.facts.memory_gb * fraction:.1f} GiB servers may use",
            f"does not fit: {problem}",
        )
    ]


def build_source(s: Subject) -> list[Check]:
    if s.variant.build is None:
        return []
    source = s.manifest.build_source()
    folder = s.folder(source)
    live = s.facts.target
    quantized = folder.shape.quantized if folder and folder.shape else None
    problem = (
        f"its source {_shown(source, None)} is not here"
        if folder is None
        else f"its source is quantized already ({quantized.bits}-bit {quantized.mode}): a "
        "build starts from a source of higher precision"
        if quantized
        else "its source is not the live model in other weights (architecture, shapes or "
        "tokenizer differ)"
        if source.role == "source" and live is not None and not same_model(live, folder)
        else None
    )
    return [
        _check(
            "build_source",
            problem is None,
            f"built from {folder.path if folder else '?'} ({s.variant.build.key()})",
            problem or "",
        )
    ]


CHECKS: tuple[Callable[[Subject], list[Check]], ...] = (
    trusted_namespace,
    class_allowed,
    template_allowed,
    pinned,
    remote_code,
    license_reviewed,
    platform,
    runtime_environment,
    versions,
    memory,
    disk,
    budgets,
    artifacts_present,
    integrity,
    same_target,
    loadable,
    drafter_tokenizer,
    kv_group,
    model_memory,
    build_source,
)
"""Every preflight check in the order they are reported; each returns its named results."""


def preflight(
    manifest: Manifest,
    variant: Variant,
    policy: Policy,
    facts: HostFacts,
    *,
    require_artifacts: bool = False,
) -> Preflight:
    """Every check for one candidate on this machine, each with its reason."""
    subject = Subject(manifest, variant, policy, facts, require_artifacts)
    checks = [result for check in CHECKS for result in check(subject)]
    return Preflight(candidate=subject.cid, passed=all(c.passed for c in checks), checks=checks)
