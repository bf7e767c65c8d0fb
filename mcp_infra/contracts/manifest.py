"""Registry manifests (registry/*.yaml): a target, how to serve it, the variants worth measuring."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from mcp_infra.contracts.base import (
    ID_PATTERN,
    REPO_PATTERN,
    REVISION_PATTERN,
    SHA256_PATTERN,
    Contract,
    Part,
    unset,
)
from mcp_infra.contracts.builds import BuildSpec


class CandidateClass(StrEnum):
    ACCELERATION_PLUGIN = "acceleration_plugin"
    SERVER_TUNING = "server_tuning"
    KV_CACHE = "kv_cache"
    QUANTIZATION = "quantization"
    RUNTIME_UPGRADE = "runtime_upgrade"
    MODEL_CHANGE = "model_change"


class Semantics(StrEnum):
    LOSSLESS = "lossless"
    LOSSY = "lossy"


TemplateName = Literal["mlx_lm_server", "mlx_vlm_server", "mlx_lm_distributed"]
DISTRIBUTED_TEMPLATE = "mlx_lm_distributed"


class Knobs(Part):
    """Typed launch knobs. Launch templates turn these, and nothing else, into argv."""

    draft: bool = Field(False, description="serve with the manifest's draft artifact")
    num_draft_tokens: int | None = Field(None, ge=1, le=16)
    draft_kind: Literal["dflash", "eagle3", "mtp"] | None = None
    draft_block_size: int | None = Field(None, ge=1, le=32)
    kv_bits: Literal[2, 3, 4, 6, 8] | None = None
    kv_group_size: Literal[32, 64, 128] | None = None
    quantized_kv_start: int | None = Field(None, ge=0, le=1_000_000)
    prefill_step_size: int | None = Field(None, ge=16, le=65_536)
    prompt_cache_size: int | None = Field(None, ge=0, le=1024)
    prompt_cache_bytes: int | None = Field(
        None,
        exclude_if=unset,
        ge=1 << 20,
        le=1 << 44,
        description="mlx_lm.server --prompt-cache-bytes: the prompt cache's size bound in bytes",
    )
    decode_concurrency: int | None = Field(
        None,
        exclude_if=unset,
        ge=1,
        le=1024,
        description="mlx_lm.server --decode-concurrency: requests decoded in one batch",
    )
    prompt_concurrency: int | None = Field(
        None,
        exclude_if=unset,
        ge=1,
        le=1024,
        description="mlx_lm.server --prompt-concurrency: prompts processed in one batch",
    )
    max_kv_size: int | None = Field(None, ge=256, le=1_048_576)
    ranks: int | None = Field(
        None,
        exclude_if=unset,
        ge=2,
        le=16,
        description="split the model over this many ranks through mlx.launch (template "
        "mlx_lm_distributed); the ranks run on the hosts of the home's config, never a plan's",
    )
    backend: Literal["ring", "jaccl", "mpi"] | None = Field(
        None,
        exclude_if=unset,
        description="mlx.launch backend (ring: TCP; jaccl: RDMA over Thunderbolt 5; mpi)",
    )
    split: Literal["tensor", "pipeline"] | None = Field(
        None,
        exclude_if=unset,
        description="tensor parallel (mlx_lm.server's default) or --pipeline",
    )

    @model_validator(mode="after")
    def _distributed_knobs(self) -> Knobs:
        if self.ranks is None and (self.backend or self.split):
            raise ValueError("backend and split need ranks")
        if self.ranks is not None and self.draft:
            raise ValueError("mlx_lm.server refuses draft models in distributed mode")
        return self

    def cost_key(self) -> tuple[int, int]:
        """Ordering used to prefer the cheaper of two tied candidates."""
        drafted = (self.num_draft_tokens or 0) + (self.draft_block_size or 0)
        if self.draft and not drafted:
            drafted = 99  # the drafter's own default, unknown here: never assumed to be cheap
        return (1 if self.draft else 0, drafted)


class ArtifactRef(Part):
    """A model artifact, in one of four forms: pinned on the hub (repo + 40-hex revision), built
    by `mcp-infra demo` (demo), a folder on this machine (path, with the sha256 of its files
    once recorded), or the home's configured target (configured: whatever model config.yaml's
    baseline serves, so one manifest serves any model)."""

    role: Literal["target", "draft", "source"] = Field(
        description="target: the model served; draft: its drafter; source: the folder a "
        "variant's build is made from, when it is not the target itself"
    )
    repo: Annotated[str, Field(pattern=REPO_PATTERN)] | None = None
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)] | None = None
    demo: Literal["target", "draft", "split-target"] | None = Field(
        None, description="name of a model that `mcp-infra demo` builds into the home directory"
    )
    path: str | None = Field(
        None,
        exclude_if=unset,
        min_length=2,
        max_length=1000,
        description="an absolute model folder on this machine",
    )
    digest: Annotated[str, Field(pattern=SHA256_PATTERN)] | None = Field(
        None,
        exclude_if=unset,
        description="path: sha256 over its files' sorted (path, size, sha256), as recorded; "
        "checked again before each start",
    )
    configured: bool = Field(
        False,
        exclude_if=unset,
        description="the home's configured target, whatever model it is (a draft: the target's "
        "own folder, e.g. its multi-token-prediction head)",
    )
    size_gb: float | None = Field(None, ge=0, le=2048)
    license: str | None = Field(None, max_length=64)
    files: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _one_source(self) -> ArtifactRef:
        hub = self.repo is not None or self.revision is not None
        forms = [hub, self.demo is not None, self.path is not None, self.configured]
        if sum(forms) != 1:
            raise ValueError(
                "an artifact is exactly one of: repo + revision (hub), demo, path, configured"
            )
        if hub and (self.repo is None or self.revision is None):
            raise ValueError("a hub artifact needs both repo and a 40-hex revision")
        if self.repo is not None and ("--" in self.repo or ".." in self.repo):
            raise ValueError("a hub repo id may not contain '--' or '..'")
        if self.path is not None and (
            not self.path.startswith("/") or "\0" in self.path or ".." in self.path.split("/")
        ):
            raise ValueError("an artifact path must be absolute, without '..'")
        if self.digest is not None and self.path is None:
            raise ValueError("digest belongs to a path artifact")
        for name in self.files:
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError("artifact file patterns must be relative, without '..'")
        return self


PACKAGE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
EXACT_VERSION_PATTERN = r"^\d+(\.\d+){0,3}((a|b|rc)\d+)?(\.post\d+)?$"


class PinnedPackage(Part):
    """One package of a runtime environment. Its version and sha256 are checked by preflight
    (``core.preflight``), not here, so an unpinned entry is refused with its reason instead of
    making the whole registry unreadable."""

    name: Annotated[str, Field(pattern=PACKAGE_NAME_PATTERN)]
    version: str = Field(max_length=64, description="an exact version (X.Y.Z), no range")
    sha256: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=16,
        description="sha256 of the distribution files pip may install (from the registry's "
        "JSON or `pip download` + `sha256sum`)",
    )
    size_bytes: int | None = Field(
        None, ge=0, le=2**40, description="the download's size, as the registry states it"
    )

    def requirement(self) -> str:
        """The line of a pip requirements file (`--require-hashes` mode)."""
        hashes = " ".join(f"--hash=sha256:{h}" for h in self.sha256)
        return f"{self.name}=={self.version} {hashes}".strip()


class RuntimeEnvSpec(Part):
    """A runtime environment as a pinned artifact: built under ``<home>/runtimes/<hash>/``
    (``state.runtimes``), its resolved lock recorded and re-checked before each use.

    ``site``: ``isolated`` — only the pinned packages (they must be the whole closure, checked
    by ``pip check`` after the build); ``shared`` — the pinned packages first, then the control
    plane's own site-packages (mlx, numpy, transformers, ...), every visible package and version
    recorded in the lock."""

    python: Annotated[str, Field(pattern=r"^3\.\d{1,2}$")]
    site: Literal["isolated", "shared"] = "shared"
    packages: list[PinnedPackage] = Field(min_length=1, max_length=128)

    @model_validator(mode="after")
    def _unique(self) -> RuntimeEnvSpec:
        names = [p.name for p in self.packages]
        if len(set(names)) != len(names):
            raise ValueError("a runtime environment names each package once")
        return self


class RuntimeSpec(Part):
    template: TemplateName
    min_versions: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")], str] = Field(
        default_factory=dict
    )
    platforms: list[Literal["linux-x86_64", "linux-aarch64", "darwin-arm64"]] = Field(min_length=1)
    trust_remote_code: bool = False
    environment: RuntimeEnvSpec | None = Field(
        None, description="serve from this pinned environment instead of the control plane's"
    )

    @field_validator("trust_remote_code")
    @classmethod
    def _no_remote_code(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "trust_remote_code must be false: mcp-infra never runs code from a model repository"
            )
        return value

    @field_validator("min_versions")
    @classmethod
    def _versions(cls, value: dict[str, str]) -> dict[str, str]:
        for pkg, ver in value.items():
            if not re.fullmatch(r"\d+(\.\d+){0,3}", ver):
                raise ValueError(f"minimum version for {pkg} must look like 1.2.3")
        return value


class Resources(Part):
    memory_gb: float = Field(
        0,
        ge=0,
        le=4096,
        description="peak of one server of this recipe (the exclusive mode's need)",
    )
    disk_gb: float = Field(0, ge=0, le=8192)
    concurrent_memory_gb: float | None = Field(
        None,
        ge=0,
        le=8192,
        description="stated need of this candidate beside the live backend "
        "(both processes); admission uses measured figures when it has them",
    )


class Variant(Part):
    """One configuration worth measuring. It may override the manifest's class and semantics
    (a KV-cache variant of a drafter manifest is lossy and of class kv_cache)."""

    id: Annotated[str, Field(pattern=ID_PATTERN)]
    title: str = Field("", max_length=200)
    knobs: Knobs = Field(default_factory=Knobs)
    candidate_class: CandidateClass | None = Field(None, alias="class")
    semantics: Semantics | None = None
    environment: RuntimeEnvSpec | None = Field(
        None, description="this variant's own runtime environment (else the manifest's)"
    )
    build: BuildSpec | None = Field(
        None,
        exclude_if=unset,
        description="serve a build of the manifest's source (else its target) made by "
        "`mcp-infra prepare` or the cycle's PREPARE step with mlx_lm.convert into the home",
    )


class Manifest(Contract):
    """One registry entry: a target, how to serve it, and the variants worth measuring."""

    id: Annotated[str, Field(pattern=ID_PATTERN)]
    title: str = Field(max_length=200)
    candidate_class: CandidateClass = Field(alias="class")
    semantics: Semantics
    description: str = Field("", max_length=2000)
    license_reviewed: bool = False
    runtime: RuntimeSpec
    target: ArtifactRef
    artifacts: list[ArtifactRef] = Field(default_factory=list, max_length=8)
    resources: Resources = Field(default_factory=Resources)
    max_peak_memory_gb: float | None = Field(None, gt=0, le=4096)
    min_speedup_pct: float | None = Field(None, ge=0, le=1000)
    variants: list[Variant] = Field(min_length=1, max_length=32)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.target.role != "target":
            raise ValueError("target artifact must have role 'target'")
        ids = [v.id for v in self.variants]
        if len(set(ids)) != len(ids):
            raise ValueError("variant ids must be unique")
        has_draft = any(a.role == "draft" for a in self.artifacts)
        builds = any(v.build for v in self.variants)
        if any(a.role == "source" for a in self.artifacts) and not builds:
            raise ValueError("a source artifact is for variants with a build")
        if builds and self.runtime.template == DISTRIBUTED_TEMPLATE:
            raise ValueError("a build is served by one server, not split over ranks")
        distributed = self.runtime.template == DISTRIBUTED_TEMPLATE
        for variant in self.variants:
            if variant.knobs.draft and not has_draft:
                raise ValueError(f"variant {variant.id} asks for a draft but none is listed")
            if distributed != (variant.knobs.ranks is not None):
                raise ValueError(
                    f"variant {variant.id}: ranks is set exactly when the template is "
                    f"{DISTRIBUTED_TEMPLATE}"
                )
            if distributed and self.semantics_of(variant) != Semantics.LOSSY:
                raise ValueError(
                    f"variant {variant.id} is split over ranks: its greedy tokens may differ "
                    "from one process's (reduction order), so its semantics must be lossy"
                )
        return self

    def draft_artifact(self) -> ArtifactRef | None:
        return next((a for a in self.artifacts if a.role == "draft"), None)

    def build_source(self) -> ArtifactRef:
        """What a variant's build is made from: the source artifact, else the target."""
        return next((a for a in self.artifacts if a.role == "source"), self.target)

    def variant(self, variant_id: str) -> Variant | None:
        return next((v for v in self.variants if v.id == variant_id), None)

    def class_of(self, variant: Variant) -> CandidateClass:
        return variant.candidate_class or self.candidate_class

    def semantics_of(self, variant: Variant) -> Semantics:
        return variant.semantics or self.semantics

    def environment_of(self, variant: Variant) -> RuntimeEnvSpec | None:
        return variant.environment or self.runtime.environment
