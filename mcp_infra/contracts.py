"""Every data contract of mcp-infra: pydantic models that forbid unknown fields.

Each file the project writes is one of these models (see ``store.write_model``); each carries a
``schema_version`` so that a reader can refuse what it does not understand instead of guessing.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
CANDIDATE_ID_PATTERN = r"^(baseline|[a-z0-9][a-z0-9._-]{0,63}:[a-z0-9][a-z0-9._-]{0,63})$"
REVISION_PATTERN = r"^[0-9a-f]{40}$"
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$"
BASELINE_ID = "baseline"


class Contract(BaseModel):
    """Base of every contract: unknown fields are an error, never silently kept."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_version: Literal[1] = SCHEMA_VERSION


class Part(BaseModel):
    """Base of nested parts (no version of their own; the enclosing contract has one)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --------------------------------------------------------------------------------------------
# Registry manifests
# --------------------------------------------------------------------------------------------


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


def _unset(value: object) -> bool:
    """Split knobs are left out of a dump while unset, so every manifest, recipe and record
    that does not split dumps, and hashes, exactly as before they existed."""
    return value is None


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
    max_kv_size: int | None = Field(None, ge=256, le=1_048_576)
    ranks: int | None = Field(
        None,
        exclude_if=_unset,
        ge=2,
        le=16,
        description="split the model over this many ranks through mlx.launch (template "
        "mlx_lm_distributed); the ranks run on the hosts of the home's config, never a plan's",
    )
    backend: Literal["ring", "jaccl", "mpi"] | None = Field(
        None,
        exclude_if=_unset,
        description="mlx.launch backend (ring: TCP; jaccl: RDMA over Thunderbolt 5; mpi)",
    )
    split: Literal["tensor", "pipeline"] | None = Field(
        None,
        exclude_if=_unset,
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
    """A model artifact: pinned on the hub (repo + 40-hex revision) or built by `mcp-infra demo`."""

    role: Literal["target", "draft"]
    repo: Annotated[str, Field(pattern=REPO_PATTERN)] | None = None
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)] | None = None
    demo: Literal["target", "draft", "split-target"] | None = Field(
        None, description="name of a model that `mcp-infra demo` builds into the home directory"
    )
    size_gb: float | None = Field(None, ge=0, le=2048)
    license: str | None = Field(None, max_length=64)
    files: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _one_source(self) -> ArtifactRef:
        hub = self.repo is not None or self.revision is not None
        if hub and self.demo is not None:
            raise ValueError("an artifact is either pinned on the hub or a demo model, not both")
        if hub and (self.repo is None or self.revision is None):
            raise ValueError("a hub artifact needs both repo and a 40-hex revision")
        if not hub and self.demo is None:
            raise ValueError("an artifact needs repo + revision or demo")
        if self.repo is not None and ("--" in self.repo or ".." in self.repo):
            raise ValueError("a hub repo id may not contain '--' or '..'")
        for name in self.files:
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError("artifact file patterns must be relative, without '..'")
        return self


PACKAGE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
EXACT_VERSION_PATTERN = r"^\d+(\.\d+){0,3}((a|b|rc)\d+)?(\.post\d+)?$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


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

    def variant(self, variant_id: str) -> Variant | None:
        return next((v for v in self.variants if v.id == variant_id), None)

    def class_of(self, variant: Variant) -> CandidateClass:
        return variant.candidate_class or self.candidate_class

    def semantics_of(self, variant: Variant) -> Semantics:
        return variant.semantics or self.semantics

    def environment_of(self, variant: Variant) -> RuntimeEnvSpec | None:
        return variant.environment or self.runtime.environment


# --------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------


class Bounded(Part):
    """A threshold: its default and the range a plan may move it within."""

    default: float
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> Bounded:
        if not (self.low <= self.default <= self.high):
            raise ValueError("need low <= default <= high")
        return self


class Thresholds(Part):
    min_speedup_pct: Bounded
    max_peak_memory_gb: Bounded
    max_error_rate: float = Field(0.0, ge=0, le=1)
    worst_prompt_tolerance_pct: float = Field(
        10.0, ge=0, le=100, description="largest per-prompt slowdown a qualified candidate may show"
    )
    tie_tolerance_pct: float = Field(2.0, ge=0, le=50)
    lossy_min_identical_fraction: float = Field(0.5, ge=0, le=1)


class WorkloadCell(Part):
    """One condition of the user's workload: a request class at a concurrency level. Decisive cells
    block promotion on a regression beyond tolerance and are measured in every start; a guard
    cell (a costly one, such as long prefills at concurrency 4) is measured in a configuration's
    first start only and blocks only a clear regression; reported cells are shown only."""

    request_class: Literal["short", "long_prefill"]
    concurrency: int = Field(ge=1, le=64)
    role: Literal["decisive", "guard", "reported"] = "decisive"


def _default_workload() -> list[WorkloadCell]:
    return [
        WorkloadCell(request_class=c, concurrency=n)  # type: ignore[arg-type]
        for c in ("short", "long_prefill")
        for n in (1, 4)
    ]


class LearnedSpread(Part):
    """This home's start-to-start spread, learned from earlier cycles' baseline starts: the sd
    of a configuration's per-start mean log decode speed, pooled within cycles."""

    sd: float = Field(gt=0, le=1)
    df: int = Field(ge=1, le=1000, description="degrees of freedom: starts minus one per cycle")
    source: str = Field("", max_length=300, description="the cycles it was learned from")


class Protocol(Part):
    suite: Annotated[str, Field(pattern=ID_PATTERN)] = "demo-speed"
    quality_suite: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    repeats: int = Field(3, ge=1, le=50)
    warmup: int = Field(
        1,
        ge=0,
        le=10,
        description="untimed warm-up passes over every prompt per fresh start (phase warmup)",
    )
    max_tokens: int = Field(64, ge=2, le=8192)
    timed_max_tokens: int | None = Field(
        None,
        ge=8,
        le=8192,
        description="answer length of timed requests, if shorter than each prompt's budget: "
        "decode speed needs enough tokens to be measured, not the whole answer (greedy passes "
        "for the equality gate still ask the full budget)",
    )
    seed: int = 20261129
    bootstrap_resamples: int = Field(2000, ge=100, le=100_000)
    confidence: float = Field(
        0.96,
        gt=0.5,
        lt=1.0,
        description="two-sided confidence of the speedup intervals; a candidate qualifies on the "
        "lower bound, so one no faster than the threshold qualifies at most (1 - confidence) / 2 "
        "of the time, all early-stopping looks together (2% at 0.96; core.stats)",
    )
    drift_check: bool = False
    drift_tolerance_pct: float = Field(10.0, ge=0, le=100)
    request_timeout_s: float = Field(120.0, gt=0, le=3600)
    ready_timeout_s: float = Field(120.0, gt=0, le=3600)
    workload: list[WorkloadCell] = Field(
        default_factory=_default_workload, min_length=1, max_length=8
    )
    learn_spread: bool | None = Field(
        None,
        description="learn the start-to-start spread from this home's sealed cycles when a "
        "plan is frozen (state.spread)",
    )
    learned_spread: LearnedSpread | None = Field(
        None,
        description="set when the plan is frozen, from this home's history: pooled with each "
        "cycle's own start-to-start spread where the two agree (core.stats.pooled_variance)",
    )
    heldout_repeats: int | None = Field(
        None,
        ge=1,
        le=50,
        description="timed requests per held-out prompt in the confirmation (None: twice what "
        "selection's first rounds gave each prompt, at least 6)",
    )
    futility_confidence: float | None = Field(
        None,
        gt=0.5,
        lt=1.0,
        description="a candidate whose interval at this two-sided confidence lies wholly below "
        "the threshold stops as futile (non-binding: it can only reject, never qualify)",
    )
    min_starts: int = Field(
        2,
        ge=1,
        le=20,
        description="fresh server processes per configuration before any decision (one per round)",
    )
    max_starts: int = Field(
        13,
        ge=1,
        le=20,
        description="rounds at most: one more start per configuration per round while some "
        "decision is still open (13: enough to qualify a true gain 10 points above the threshold "
        "at 5% start-to-start noise, see core.stats)",
    )


class Window(Part):
    """When cycles may start. ``start``/``end`` are wall-clock times in ``timezone`` (an IANA name,
    or ``local`` for the machine's own zone); ``end`` earlier than ``start`` spans midnight and
    ``start == end`` means the whole day. See ``mcp_infra.core.schedule``."""

    mode: Literal["always", "window", "never"] = "always"
    start: Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")] = "00:00"
    end: Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")] = "00:00"
    timezone: str = Field("local", max_length=64)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if value == "local":
            return value
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {value[:64]!r} (or use 'local')") from exc
        return value


class Watch(Part):
    """`mcp-infra supervise --watch`: how often to look, and whether to re-check changed
    candidates on its own (each change at most ``budgets.retries`` + 1 times, waiting
    ``budgets.retry_backoff_s``, doubled per attempt, between attempts)."""

    recheck_changed: bool = Field(
        False,
        description="propose a re-check of candidates measured before whose manifest, "
        "policy or environment has changed since",
    )
    interval_s: float = Field(300, ge=1, le=86_400, description="seconds between looks")


class Budgets(Part):
    cycle_minutes: float = Field(30, gt=0, le=24 * 60)
    download_gb: float = Field(50, ge=0)
    disk_gb: float = Field(100, ge=0)
    retries: int = Field(1, ge=0, le=10, description="re-runs of a cycle that failed by error")
    retry_backoff_s: float = Field(30.0, ge=0, le=3600, description="doubles on each retry")


class ServicePolicy(Part):
    """How the stable endpoint (the front) behaves through a cycle, and what may run beside it."""

    max_hold_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="longest a request is held "
        "while no backend can serve; past it the front answers 503",
    )
    drain_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="longest wait for in-flight requests on an old backend before it is stopped",
    )
    memory_budget_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="share of physical memory that backends running at once may use",
    )
    max_live_requests_per_round: int = Field(
        2,
        ge=0,
        description="live requests overlapping a measurement round above which it is repeated",
    )
    max_round_repeats: int = Field(2, ge=0, le=10)
    quiet_wait_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="with quiet_cpu_fraction set: the longest a server start waits for a quiet "
        "machine before it is measured anyway (its round records the load)",
    )
    quiet_cpu_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="wait before each server start until processes other than this supervisor, "
        "the front and the servers it measures use at most this share of the CPUs (over a "
        "1-second look), at most quiet_wait_s; None: never wait (core.machine)",
    )
    max_unserved_s: float | None = Field(
        None,
        ge=0,
        le=86_400,
        description="longest the stable endpoint may be projected to go unserved by an "
        "exclusive-mode plan outside a maintenance window: a plan projected over it waits for "
        "the window (refused where the window mode is never or always); None: no limit",
    )


class Policy(Contract):
    name: Annotated[str, Field(pattern=ID_PATTERN)]
    trusted_namespaces: list[str] = Field(default_factory=list)
    allowed_classes: list[CandidateClass]
    allowed_templates: list[TemplateName]
    thresholds: Thresholds
    protocol: Protocol = Field(default_factory=Protocol)
    auto_promote: dict[CandidateClass, bool] = Field(
        default_factory=lambda: dict(DEFAULT_AUTO_PROMOTE),
        description="per class: may a qualified candidate be promoted without a person? Classes "
        "left out take DEFAULT_AUTO_PROMOTE (drafters and server tuning yes, the rest no)",
    )
    window: Window = Field(default_factory=Window)
    budgets: Budgets = Field(default_factory=Budgets)
    watch: Watch = Field(default_factory=Watch)
    service: ServicePolicy = Field(default_factory=ServicePolicy)

    @field_validator("auto_promote")
    @classmethod
    def _every_class(cls, value: dict[CandidateClass, bool]) -> dict[CandidateClass, bool]:
        return {
            klass: bool(value.get(klass, DEFAULT_AUTO_PROMOTE[klass])) for klass in CandidateClass
        }

    @model_validator(mode="after")
    def _drift_below_speedup(self) -> Policy:
        """A machine that drifts by less than the tolerance can still fake the required gain
        unless the tolerance is below it: refuse such a policy when it is loaded."""
        tolerance = self.protocol.drift_tolerance_pct
        required = self.thresholds.min_speedup_pct.default
        if self.protocol.drift_check and tolerance >= required:
            raise ValueError(
                f"protocol.drift_tolerance_pct ({tolerance:g}%) must be below "
                f"thresholds.min_speedup_pct.default ({required:g}%): a baseline that drifted "
                "by less than the tolerance could make a candidate with no real gain qualify"
            )
        return self


DEFAULT_AUTO_PROMOTE: dict[CandidateClass, bool] = {
    CandidateClass.ACCELERATION_PLUGIN: True,
    CandidateClass.SERVER_TUNING: True,
    CandidateClass.KV_CACHE: False,
    CandidateClass.QUANTIZATION: False,
    CandidateClass.RUNTIME_UPGRADE: False,
    CandidateClass.MODEL_CHANGE: False,
}


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# Characters refused in free text that people and models read later: C0 controls (a multi-line
# field keeps \n and \t), DEL, C1 controls (NEL included), bidi embeddings, overrides, isolates
# and marks, the Unicode line and paragraph separators, zero-width and invisible formatting
# characters (they hide text from a reader), interlinear annotations and tag characters.
_INVISIBLE = (
    "\u061c\u180e\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\U000e0000-\U000e007f"
)
_UNSAFE_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
_UNSAFE_MULTI_LINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why free text is refused (the caller names the field), never repeating the text; None if
    it is fine."""
    if (_UNSAFE_MULTI_LINE if multiline else _UNSAFE_ONE_LINE).search(value):
        return (
            "must be plain text: control, bidi, zero-width, tag and line-separator characters "
            "are not allowed" + ("" if multiline else " (one line)")
        )
    return None


class Acceptance(Part):
    """Numbers only (not "5", not true) and finite. A value outside the policy's range is
    clamped to it, with a reason; a plan can only tighten the policy's thresholds."""

    min_speedup_pct: float | None = Field(None, strict=True)
    max_peak_memory_gb: float | None = Field(None, strict=True)

    _check_finite = field_validator("min_speedup_pct", "max_peak_memory_gb")(_finite)


class Plan(Part):
    """What an agent may send. Nothing else is accepted."""

    hypothesis: str = Field(min_length=1, max_length=300)
    # The pattern is advertised in the schema; an id that misses it is refused by sanitize, with
    # a reason, like any other id that is not a runnable candidate.
    candidates: list[
        Annotated[
            str,
            Field(
                min_length=1, max_length=130, json_schema_extra={"pattern": CANDIDATE_ID_PATTERN}
            ),
        ]
    ] = Field(min_length=1, max_length=3)
    acceptance: Acceptance | None = None
    notes: str = Field("", max_length=2000)

    @field_validator("candidates")
    @classmethod
    def _plain_ids(cls, value: list[str]) -> list[str]:
        """An id with a control, bidi or invisible character is refused here, before sanitize
        could keep it (as proposed text) in the frozen plan, the queue or the cycle's files."""
        for index, item in enumerate(value):
            if text_problem(item):
                raise ValueError(
                    f"candidate #{index + 1} " + str(text_problem(item)).replace(" (one line)", "")
                )
        return value

    @field_validator("hypothesis")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or "\r" in value:
            raise ValueError("hypothesis must be one line")
        if problem := text_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("notes")
    @classmethod
    def _plain_notes(cls, value: str) -> str:
        if problem := text_problem(value, multiline=True):
            raise ValueError(problem)
        return value


class PlanChange(Part):
    field: str
    action: Literal["added", "removed", "clamped", "tightened", "kept", "defaulted", "refused"]
    value: Any = None
    reason: str


class RefusedCandidate(Part):
    id: str
    reason: str


class EffectiveThresholds(Part):
    min_speedup_pct: float
    max_peak_memory_gb: float
    max_error_rate: float
    worst_prompt_tolerance_pct: float
    tie_tolerance_pct: float
    lossy_min_identical_fraction: float


class FrozenPlan(Contract):
    """A sanitized plan, frozen on disk before the service is touched."""

    plan_id: str
    created_at: datetime
    proposed_by: str = Field(max_length=200)
    proposed: Plan
    candidates: list[str]
    thresholds: EffectiveThresholds
    protocol: Protocol
    auto_promote: dict[CandidateClass, bool]
    changes: list[PlanChange]
    refused: list[RefusedCandidate]
    registry_hash: str
    policy_hash: str
    content_hash: str = ""


# --------------------------------------------------------------------------------------------
# Recipes, processes, service config
# --------------------------------------------------------------------------------------------


class RecipeRuntime(Part):
    """The pinned environment a recipe runs from: which one, its interpreter and the digests
    of its lock and files, checked again before each start (``state.runtimes``)."""

    env_hash: Annotated[str, Field(pattern=SHA256_PATTERN)]
    python: str = Field(max_length=1000, description="the environment's interpreter")
    lock_digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    files_digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    label: str = Field("", max_length=200, description="e.g. mlx-lm 0.32.1 (shared site)")


class Recipe(Contract):
    """Exactly what runs on a port: template, knobs and resolved artifact paths with hashes."""

    candidate_id: str
    template: TemplateName
    model_path: str
    draft_path: str | None = None
    knobs: Knobs = Field(default_factory=Knobs)
    artifact_hashes: dict[str, str] = Field(default_factory=dict)
    semantics: Semantics = Semantics.LOSSLESS
    candidate_class: CandidateClass | None = None
    manifest_hash: str | None = None
    runtime: RecipeRuntime | None = Field(
        None, description="its own pinned environment; None: the control plane's interpreter"
    )

    def key(self) -> str:
        """Identity of a recipe for comparisons (ignores the hashes' order)."""
        fields = {"template", "model_path", "draft_path", "knobs"}
        return self.model_dump_json(include=fields | ({"runtime"} if self.runtime else set()))


LOCAL_HOST = "127.0.0.1"
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$"


class ClusterHost(Part):
    """One machine that may run ranks of a split recipe (config.yaml ``distributed.hosts``).
    Hosts exist only in the home's own configuration: a plan or a manifest names a distributed
    candidate (how many ranks, which backend and split), never a host."""

    name: Annotated[str, Field(pattern=ID_PATTERN)]
    ssh: Annotated[str, Field(pattern=HOSTNAME_PATTERN)] = Field(
        LOCAL_HOST,
        description="what mlx.launch reaches it by: 127.0.0.1 is this machine (no ssh); any "
        "other name or address is reached over ssh (user, port and keys from ~/.ssh/config)",
    )
    ssh_port: int = Field(22, ge=1, le=65535, description="checked for reachability by preflight")
    ips: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="addresses the ring backend connects over (default: ssh, if an address)",
    )
    rdma: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None] = Field(
        default_factory=list,
        max_length=16,
        description="jaccl: the RDMA device towards each host in order (null for itself)",
    )
    slots: int = Field(1, ge=1, le=16, description="ranks this host may run")

    @field_validator("ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            ipaddress.ip_address(item)  # ValueError names the bad one
        return value

    @property
    def local(self) -> bool:
        return self.ssh == LOCAL_HOST

    def ring_ips(self) -> list[str]:
        """Addresses the ring backend uses: ``ips``, else ``ssh`` when it is an address."""
        import ipaddress

        if self.ips:
            return list(self.ips)
        try:
            ipaddress.ip_address(self.ssh)
        except ValueError:
            return []
        return [self.ssh]


def _local_only() -> list[ClusterHost]:
    return [ClusterHost(name="local", ssh=LOCAL_HOST, slots=2)]


class DistributedConfig(Part):
    """config.yaml ``distributed:``: the machines split recipes may use, in rank order."""

    hosts: list[ClusterHost] = Field(default_factory=_local_only, min_length=1, max_length=16)
    reach_timeout_s: float = Field(
        3.0, gt=0, le=60, description="preflight: the longest wait for a host to answer"
    )

    @model_validator(mode="after")
    def _unique(self) -> DistributedConfig:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("distributed host names must be unique")
        return self


class HostProbe(Part):
    """What preflight found on one configured host: reachable as configured, its packages, the
    fingerprints of the model folders a split recipe loads there, its memory."""

    name: str
    ssh: str
    reachable: bool
    detail: str = ""
    packages: dict[str, str] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict, description="path -> fingerprint")
    memory_gb: float | None = None
    python: str | None = None


class RankRecord(Part):
    """One rank of a split server: where it runs and, on this machine, its process."""

    rank: int = Field(ge=0)
    host: str = Field(description="the configured host's name")
    pid: int | None = Field(None, description="local ranks only")
    create_time: float | None = None
    log_path: str | None = None
    env: dict[str, str] = Field(
        default_factory=dict, description="the rank's MLX_* environment as it started"
    )


class LaunchRecord(Part):
    """How a split server was launched: mlx.launch's backend and split, its hosts and ranks."""

    backend: Literal["ring", "jaccl", "mpi"]
    split: Literal["tensor", "pipeline"]
    hosts: list[str]
    ring_port: int | None = Field(None, description="mlx.launch --starting-port")
    hostfile: str = Field(description="the JSON hostfile given to mlx.launch")
    log_dir: str = Field(description="where each local rank writes rank-<n>.log")
    ranks: list[RankRecord] = Field(default_factory=list)


class LaunchEvidence(Part):
    """One split server start measured in a cycle: the configuration, start, port and launch."""

    candidate: str
    start: int = Field(ge=0)
    round: int = Field(ge=0)
    port: int
    launch: LaunchRecord


class DistributedEvidence(Contract):
    """cycles/<id>/distributed.json: the hosts a cycle's split recipes ran on, as preflight
    found them, and every split start with its backend, split mode and ranks' environment."""

    hosts: list[HostProbe] = Field(default_factory=list)
    launches: list[LaunchEvidence] = Field(default_factory=list)


class ProcessRecord(Contract):
    """A server the project started: enough to find it again, never confused with a stranger."""

    role: Literal["stable", "candidate", "front", "backend"]
    pid: int
    pgid: int
    create_time: float = Field(description="process start time (epoch seconds, from the OS)")
    argv: list[str]
    host: str
    port: int
    log_path: str
    candidate_id: str
    cycle_id: str | None = None
    started_at: datetime
    ready_s: float | None = Field(None, description="seconds from start until it answered")
    launch: LaunchRecord | None = Field(
        None, description="a split server: pid and pgid are mlx.launch's; its ranks are here"
    )


class FrontConfig(Part):
    """config.yaml ``front:``: how the front guards the stable port. Every wait and every size
    is bounded, so no client, slow or hostile, can hold the front's memory or descriptors."""

    max_per_backend: int = Field(
        16, ge=1, le=1024, description="requests sent to one backend at once; the rest wait"
    )
    max_queue: int = Field(
        512, ge=0, le=100_000, description="requests waiting at once; past it: 503 Retry-After"
    )
    max_connections: int = Field(
        1024,
        ge=8,
        le=100_000,
        description="open client connections; at the cap an idle or "
        "still-unsent one is closed for a new one",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=600, description="longest a new connection may take to send its headers"
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest a kept-alive connection may wait between requests"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest wait for the next piece of a request body"
    )
    send_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="longest a client may leave answer bytes unread"
    )
    max_header_bytes: int = Field(16_384, ge=1024, le=1 << 20)
    max_body_bytes: int = Field(32 << 20, ge=1024, le=1 << 31)
    max_connect_attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="connection attempts to a backend per request; a request is retried only "
        "when no byte of it reached the backend",
    )
    allow_origins: list[str] = Field(
        default_factory=list,
        description="web origins allowed to read answers (CORS); none by default, '*' for any",
    )
    token_file: str | None = Field(
        None, description="file holding a bearer token that every client must send"
    )
    ipv6: bool = Field(True, description="also hold [::1] on the stable port")
    heal: bool = Field(True, description="restart a live backend that died")
    heal_max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="restarts allowed within heal_window_s; one more death raises needs-operator",
    )
    heal_window_s: float = Field(600.0, gt=0, le=86_400)
    heal_max_failures: int = Field(
        3, ge=1, le=100, description="failed restart attempts in a row before needs-operator"
    )


class ServiceConfig(Contract):
    """config.yaml: the managed service."""

    host: Literal["127.0.0.1"] = "127.0.0.1"
    port: int = Field(8080, ge=1024, le=65535)
    scratch_port: int = Field(8090, ge=1024, le=65535)
    policy: Annotated[str, Field(pattern=ID_PATTERN)] = "default"
    baseline: Recipe
    front: FrontConfig = Field(default_factory=FrontConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)


class FrontRoute(Contract):
    """state/route.json: where the front sends requests. Written only by the supervisor side
    (atomically); the front polls it and echoes the generation it adopted in FrontStatus."""

    generation: int = Field(ge=0)
    mode: Literal["serve", "hold"]
    backend_url: str | None = None
    candidate_id: str | None = None
    max_hold_s: float = Field(120.0, gt=0, le=3600)
    scope: str | None = Field(None, description="the cycle whose impact is being counted")
    reason: str = Field("", max_length=300)
    updated_at: datetime


class BackendHealth(Part):
    url: str | None = None
    healthy: bool | None = None
    checked_at: datetime | None = Field(
        None, description="when the probe last saw this health change (probes run every 2 s)"
    )
    detail: str = ""


class FrontCounters(Part):
    live_requests: int = Field(0, description="requests received (served or in flight)")
    served: int = 0
    held: int = 0
    longest_hold_s: float = 0.0
    rejected_503: int = Field(
        0, description="every 503 the front answered (hold bound, full queue, backend down)"
    )
    upstream_errors: int = 0
    unserved_s: float = Field(0.0, description="seconds with no backend able to serve")
    queued: int = Field(0, description="requests that waited for a free slot on their backend")
    rejected_queue_full: int = 0
    refused: int = Field(
        0,
        description="requests the front answered itself with 4xx: path, method, size, token, body",
    )
    failed_streams: int = Field(
        0, description="answers the backend ended before they were complete"
    )
    client_gone: int = Field(0, description="clients that left before their answer was complete")
    connect_retries: int = Field(
        0, description="attempts repeated because no byte reached the backend"
    )
    dropped_connections: int = Field(
        0, description="connections closed by a limit: header time, idle time, the connection cap"
    )


class TaskHealth(Part):
    """One of the front's background tasks, supervised: a failure is logged and it restarts."""

    state: Literal["running", "restarting"] = "running"
    failures: int = 0
    last_error: str = ""
    last_error_at: datetime | None = None


class HealState(Part):
    """What the front did about a live backend that died (``core.frontrules`` decides)."""

    state: Literal["ok", "restarting", "backing_off", "waiting", "needs_operator", "off"] = "ok"
    deaths: int = 0
    recent_deaths: list[datetime] = Field(default_factory=list)
    restarts: int = 0
    failures: int = Field(0, description="failed restart attempts in a row")
    last_death_at: datetime | None = None
    last_restart_at: datetime | None = None
    restored_in_s: float | None = Field(None, description="death to serving again, last time")
    next_attempt_at: datetime | None = None
    note: str = Field("", max_length=600)


class FrontStatus(Contract):
    """state/front_status.json: written by the front when its content changed (at most every
    0.2 s), never otherwise, so a reader that watches it sees changes only. The supervisor side
    asks the front itself (``GET /health``) when it needs the figures of this instant."""

    pid: int
    generation: int
    mode: Literal["serve", "hold"]
    backend_url: str | None = None
    in_flight: int = 0
    in_flight_by_backend: dict[str, int] = Field(default_factory=dict)
    held_now: int = 0
    queued_now: int = 0
    total: FrontCounters = Field(default_factory=FrontCounters)
    scope: str | None = None
    scoped: FrontCounters = Field(default_factory=FrontCounters)
    backend: BackendHealth = Field(default_factory=BackendHealth)
    unserved_since: datetime | None = None
    listening: list[str] = Field(default_factory=list)
    tasks: dict[str, TaskHealth] = Field(default_factory=dict)
    healing: HealState = Field(default_factory=HealState)
    updated_at: datetime


class ServiceImpact(Contract):
    """cycles/<id>/service_impact.json: what the stable endpoint's clients saw during a cycle."""

    mode: Literal["concurrent", "exclusive"]
    mode_reason: str = Field("", max_length=500)
    promotion_mode: Literal["concurrent", "exclusive"] | None = Field(
        None, description="how a winner was swapped in, if the cycle got that far"
    )
    expected_downtime_s: float = Field(ge=0)
    unserved_s: float | None = None
    requests_held: int | None = None
    longest_hold_s: float | None = None
    rejected_503: int | None = None
    upstream_errors: int | None = None
    live_requests: int | None = None
    front_restarted: bool = False
    note: str = Field("", max_length=500)


class SupervisorRecord(Contract):
    pid: int
    create_time: float
    started_at: datetime
    cycle_id: str | None = None


# --------------------------------------------------------------------------------------------
# Measurements, gates, verdicts
# --------------------------------------------------------------------------------------------


class Sample(Contract):
    """One measured request."""

    candidate: str
    phase: Literal["warmup", "measure", "verify", "drift", "quality", "heldout"] = "measure"
    prompt_id: str
    repeat: int
    order: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    decode_tps: float | None = None
    e2e_s: float | None = None
    e2e_tps: float | None = None
    finish_reason: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    error: str | None = None
    start: int = Field(
        0,
        ge=0,
        description="index of the fresh server process this sample was "
        "measured in (per configuration, counted from 0)",
    )
    round: int = Field(0, ge=0, description="measurement round the sample belongs to")
    started_at: datetime | None = Field(
        None, description="UTC wall-clock time the request was sent"
    )
    t_mono: float | None = Field(None, description="time.monotonic() when the request was sent")
    timing_source: Literal["client", "server"] = Field(
        "client", description="who timed it: the client (streamed tokens) or the server's timings"
    )
    request_class: Literal["short", "long_prefill"] = "short"
    concurrency: int = Field(
        1, ge=1, le=64, description="requests in flight at once, this included"
    )


class Comparison(Part):
    """Greedy output of one prompt compared with the baseline's."""

    prompt_id: str
    identical: bool
    compared: Literal["token_ids", "text"]
    first_divergence: int | None = None
    baseline_context: str = ""
    candidate_context: str = ""


class GateResult(Part):
    gate: str
    passed: bool
    detail: str
    comparisons: list[Comparison] = Field(default_factory=list)


class PromptStat(Part):
    prompt_id: str
    baseline_tps: float
    candidate_tps: float
    speedup: float
    ci_low: float | None = Field(None, description="lower bound of this prompt's speedup interval")
    ci_high: float | None = Field(None, description="upper bound of this prompt's speedup interval")


class Decision(StrEnum):
    QUALIFIED = "qualified"
    REJECTED = "rejected"
    INCONCLUSIVE = "inconclusive"


class CellVerdict(Part):
    """How a candidate did in one workload cell (request class x concurrency), both sides'
    figures and the ratio. Ratios are candidate / baseline; intervals are at ``interval_level``."""

    request_class: Literal["short", "long_prefill"]
    concurrency: int = Field(ge=1, le=64)
    role: Literal["decisive", "guard", "reported"] = "decisive"
    headline: bool = Field(False, description="the cell the headline speedup is computed on")
    status: Literal["ok", "regressed", "unclear", "unmeasured", "unjudged"] = "ok"
    detail: str = Field("", description="the cell's outcome in words")
    baseline_requests: int = 0
    candidate_requests: int = 0
    baseline_ttft_p50_s: float | None = None
    baseline_ttft_p99_s: float | None = None
    candidate_ttft_p50_s: float | None = None
    candidate_ttft_p99_s: float | None = None
    baseline_decode_tps: float | None = None
    candidate_decode_tps: float | None = None
    decode_speedup: float | None = None
    decode_ci_low: float | None = None
    decode_ci_high: float | None = None
    baseline_output_tps: float | None = Field(
        None,
        description="aggregate output tok/s: completion tokens / wall span of the cell's "
        "requests, per start, geometric mean over starts",
    )
    candidate_output_tps: float | None = None
    output_ratio: float | None = None
    output_ci_low: float | None = None
    output_ci_high: float | None = None


class CandidateVerdict(Part):
    candidate: str
    decision: Decision
    reasons: list[str]
    per_prompt: list[PromptStat] = Field(default_factory=list)
    speedup_estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    worst_prompt: str | None = None
    worst_speedup: float | None = None
    mean_speedup: float | None = None
    median_speedup: float | None = None
    token_weighted_speedup: float | None = None
    baseline_tps: float | None = None
    candidate_tps: float | None = None
    peak_memory_gb: float | None = None
    gates: list[GateResult] = Field(default_factory=list)
    auto_promote: bool = True
    repeats_to_decide: int | None = None
    noise_floor: float | None = Field(
        None,
        description="A/A noise floor: the speedup the baseline shows against itself at the "
        "protocol's confidence; ci_low must clear it as well as the threshold",
    )
    noise_floor_assumed: bool = Field(
        False,
        description="the baseline had one start: the floor comes from an assumed "
        "start-to-start spread (stats.ASSUMED_START_NOISE)",
    )
    interval_level: float | None = Field(
        None,
        description="confidence of ci_low/ci_high: the protocol's, adjusted for the "
        "number of looks early stopping may take",
    )
    baseline_starts: int = Field(0, ge=0, description="baseline server starts compared with")
    starts_used: int = Field(0, ge=0, description="server starts the candidate was measured in")
    rounds_used: int = Field(0, ge=0, description="measurement rounds the candidate took part in")
    requests_used: int = Field(
        0, ge=0, description="the candidate's measured requests, all cells, failed ones included"
    )
    cells: list[CellVerdict] = Field(default_factory=list)


class Verdict(Contract):
    candidates: list[CandidateVerdict]
    selected: str | None
    reason: str
    method: int = Field(
        1,
        ge=1,
        description="the decision method that reached it (selector.DECISION_METHOD); absent in "
        "verdicts from before methods were numbered (1)",
    )
    baseline_drift: float | None = Field(
        None, description="baseline speed re-measured after the experiments / before (geo-mean)"
    )


class MachineLoad(Part):
    """What the rest of the machine did while one server start ran (core.machine, from two
    psutil readings): a busy machine slows starts unevenly and widens the intervals, so each
    round says how busy it was."""

    window_s: float = Field(ge=0, description="seconds between the two readings")
    cpus: int = Field(ge=1, description="logical CPUs of the machine")
    other_cpu_s: float = Field(
        ge=0,
        description="CPU seconds of every process other than this supervisor (with the servers "
        "it started and reaped, the measured one included) and the front",
    )
    other_cpu_fraction: float = Field(
        ge=0, description="other_cpu_s over the window's CPU capacity (window_s x cpus)"
    )
    own_cpu_s: float | None = Field(
        None,
        ge=0,
        description="CPU seconds the left-out processes took: the measurement's own (the "
        "measured server, the requests this supervisor sent, the front)",
    )
    steal_s: float | None = Field(
        None, description="CPU seconds a hypervisor gave to other machines (Linux guests)"
    )
    load_avg_1m: float | None = Field(
        None, description="the higher 1-minute load average of the two readings (ours included)"
    )
    available_memory_fraction: float | None = Field(
        None, ge=0, le=1, description="the lower available/total memory of the two readings"
    )
    swap_in_bytes: int | None = Field(None, ge=0)
    swap_out_bytes: int | None = Field(None, ge=0)
    waited_s: float | None = Field(
        None,
        ge=0,
        description="seconds the start waited for a quiet machine first (service."
        "quiet_cpu_fraction); None when the policy does not wait",
    )
    quiet: bool | None = Field(
        None, description="whether the machine was quiet when the wait ended; None: no wait"
    )


class RoundRecord(Part):
    """One fresh server process of one configuration in one measurement round (flows.measure)."""

    config: str = Field(description="the configuration measured: baseline or a candidate id")
    start: int = Field(ge=0, description="index of this configuration's fresh process, from 0")
    round: int = Field(ge=0)
    position: int = Field(0, ge=0, description="its place in the round's interleaved order")
    started_at: datetime
    ended_at: datetime
    port: int | None = None
    live_requests: int | None = Field(
        None,
        description="live requests the stable endpoint served while this round ran "
        "(co-tenant load); None when no counter was available",
    )
    error: str | None = None
    machine: MachineLoad | None = Field(
        None, description="the rest of the machine's load while it ran; None: not read"
    )


class CellFigures(Part):
    """One configuration's figures in one workload cell, and how they compare with the baseline's
    in the same cell (reported in words by the cycle; the selector decides on the samples)."""

    request_class: Literal["short", "long_prefill"]
    concurrency: int = Field(ge=1, le=64)
    role: Literal["decisive", "guard", "reported"] = "decisive"
    requests: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    decode_tps: float | None = Field(None, description="median per-request decode tok/s")
    aggregate_tps: float | None = Field(
        None, description="output tokens of all requests / wall time their batches took"
    )
    aggregate_vs_baseline: float | None = None
    decode_vs_baseline: float | None = None


class CandidateRun(Contract):
    """Everything measured for one candidate: the input to selection, kept raw in evidence."""

    candidate: str
    candidate_class: CandidateClass | None = None
    semantics: Semantics = Semantics.LOSSLESS
    knobs: Knobs = Field(default_factory=Knobs)
    started: bool = True
    start_error: str | None = None
    peak_memory_gb: float | None = None
    memory_source: str | None = None
    samples: list[Sample] = Field(default_factory=list)
    greedy: list[Sample] = Field(default_factory=list)
    cache_note: str = ""
    purpose: Literal["selection", "heldout", "live"] = Field(
        "selection",
        description="selection runs feed the selector; held-out runs are the final "
        "check of the winner; the live run is the live service's sanity measurement",
    )
    starts: int = Field(0, ge=0, description="fresh server processes this configuration ran in")
    rounds: list[RoundRecord] = Field(default_factory=list)
    stopped: str = Field("", description="why measuring this configuration stopped")
    cells: list[CellFigures] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Projection: what a plan would cost on a target (flows.projection, benchmarks/cycle_cost.py)
# --------------------------------------------------------------------------------------------


class ConfigTruth(Part):
    """How one configuration serves on a target, as a projection assumes it."""

    decode_tps: float = Field(gt=0, description="decode tok/s of one request at a time")
    batch_tps: dict[int, float] = Field(
        default_factory=dict,
        description="aggregate output tok/s with n requests in flight; a concurrency left out "
        "is served one request after another (mlx_lm.server does not batch with a drafter)",
    )
    prefill_tps: float = Field(gt=0)
    load_s: float = Field(ge=0, description="fresh start until the first request is answered")
    peak_gb: float | None = Field(None, ge=0)
    diverges: bool = Field(False, description="greedy tokens differ from the baseline's")


class TargetProfile(Contract):
    """A machine and model a projection prices a plan on, with every assumption said."""

    name: str
    description: str = ""
    assumptions: list[str] = Field(default_factory=list)
    memory_gb: float = Field(gt=0)
    baseline: ConfigTruth
    candidates: dict[str, ConfigTruth] = Field(
        default_factory=dict, description="named candidate truths plans can refer to"
    )
    start_spread: float = Field(0.05, ge=0, description="sd of log speed between fresh starts")
    request_spread: float = Field(0.05, ge=0, description="sd of log speed between requests")
    chars_per_token: float = Field(4.0, gt=0)


class PlanCost(Contract):
    """What a plan is projected to cost on this machine before it runs (``flows.projection.
    plan_cost``): the product's own round loop priced from this home's measured timings. Kept
    beside a queued plan (``plans/<plan id>.cost.json``) so `status` can set it against the
    elapsed time, and in the home's projection cache."""

    basis: Literal["this-home", "unknown", "pending"] = Field(
        description="this-home: from this home's sealed cycles; unknown: nothing to price it "
        "from (why says what is missing); pending: being computed, ask again"
    )
    why: str = Field("", max_length=1000)
    minutes: float | None = Field(None, description="median over the projected seeds")
    minutes_high: float | None = Field(None, description="the longest projected seed")
    rounds: int | None = None
    requests: int | None = None
    unserved_s: float | None = Field(
        None, description="seconds the stable endpoint is projected not to serve (exclusive mode)"
    )
    mode: Literal["concurrent", "exclusive"] = "concurrent"
    seeds: int = Field(0, ge=0)
    outcomes: dict[str, int] = Field(default_factory=dict)
    configurations: list[str] = Field(default_factory=list)
    source: list[str] = Field(default_factory=list, description="the sealed cycles priced from")
    assumptions: list[str] = Field(default_factory=list)
    held: str | None = Field(
        None, description="why the plan waits for the maintenance window (service.max_unserved_s)"
    )


# --------------------------------------------------------------------------------------------
# Cycle, journal, evidence
# --------------------------------------------------------------------------------------------


class CycleState(StrEnum):
    QUEUED = "QUEUED"
    PREFLIGHT = "PREFLIGHT"
    PREPARE = "PREPARE"
    BASELINE = "BASELINE"
    MAINTENANCE = "MAINTENANCE"
    EXPERIMENT = "EXPERIMENT"
    SELECT = "SELECT"
    PROMOTE = "PROMOTE"
    VERIFY = "VERIFY"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    RECOVER = "RECOVER"
    SEALED = "SEALED"


class JournalStep(StrEnum):
    """Where inside a state a journal line stands (``Event.fields["step"]``). Recovery, the cost
    record and the verifier read these; a line without one is its state's entry."""

    ENTER = "enter"
    MEASURING = "measuring"  # EXPERIMENT: a fresh server is ready and being measured
    JUDGED = "judged"  # EXPERIMENT: the selector's look after a round
    QUIET = "quiet"  # EXPERIMENT: a start waits for a quiet machine (fields: waiting, figures)
    DRIFT = "drift"  # SELECT: the baseline re-measured for drift
    WORKLOAD = "workload"  # SELECT: a decisive workload cell kept the baseline
    HELDOUT = "heldout"  # SELECT: the winner's held-out confirmation begins
    HELDOUT_PASSED = "heldout-passed"
    HELDOUT_FAILED = "heldout-failed"
    PASSED = "passed"  # VERIFY: the winner reproduced its measured outputs online
    FAILED = "failed"  # VERIFY, ROLLBACK, SEALED: that state's work failed
    SWITCHED = "switched"  # COMMIT: the front serves the winner
    DONE = "done"  # ROLLBACK: the previous recipe serves again; SEALED: evidence sealed
    NOTE = "note"  # SEALED: something not recorded, never a failure of the cycle


class Outcome(StrEnum):
    PROMOTED = "promoted"
    KEPT_BASELINE = "kept_baseline"
    ROLLED_BACK = "rolled_back"
    REFUSED = "refused"
    RESTORED_AFTER_ERROR = "restored_after_error"
    NEEDS_OPERATOR = "needs_operator"


class Event(Contract):
    """One journal line."""

    ts: datetime
    cycle_id: str
    state: CycleState
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)  # JSON from the journal: any shape

    @property
    def step(self) -> JournalStep:
        """The line's step; a line without one (or with one this version does not know, from an
        older or newer writer) counts as its state's entry only when it has none."""
        raw = self.fields.get("step")
        if raw is None:
            return JournalStep.ENTER
        try:
            return JournalStep(raw)
        except ValueError:
            return JournalStep.NOTE


class EnvironmentFingerprint(Contract):
    platform: str
    machine: str
    cpu: str
    cpu_count: int
    memory_gb: float
    python: str
    packages: dict[str, str]
    blas: str = ""
    accelerator: str = Field(
        "", description="what MLX computes on: 'metal: <GPU name>' or 'cpu'; empty in old bundles"
    )
    models: dict[str, str] = Field(default_factory=dict)

    def key(self) -> str:
        """What must stay equal for a remembered outcome to still apply."""
        return self.model_dump_json(include={"platform", "machine", "cpu", "packages", "models"})


class CycleSummary(Contract):
    """evidence/<id>/summary.json: the cycle's headline, for listings and `status`."""

    cycle_id: str
    plan_id: str
    started_at: datetime
    ended_at: datetime
    outcome: Outcome
    selected: str | None = None
    speedup_pct: float | None = None
    reason: str
    active_recipe: str
    interrupted: bool = False
    recovery: str | None = None


class EvidenceManifest(Contract):
    """evidence/<id>/MANIFEST.json: sha256 of every other file of the bundle."""

    cycle_id: str
    files: dict[str, str]


class CurrentCycle(Contract):
    """state/current.json: the cycle in progress, as its journal last said (for ``status``)."""

    cycle_id: str
    state: CycleState
    message: str
    candidate: str | None = None
    index: int | None = None
    total: int | None = None


class NeedsOperatorRecord(Contract):
    """state/needs_operator.json: the service could not be restored; no cycle runs until a
    person runs `mcp-infra recover`."""

    cycle_id: str
    reason: str
    ts: datetime


class AuditRecord(Contract):
    ts: datetime
    client: str
    plan_hash: str
    accepted: bool
    plan_id: str | None = None
    detail: str = ""


# --------------------------------------------------------------------------------------------
# Recipe memory (mcp_infra.state.memory) and prepared artifacts (mcp_infra.state.artifacts)
# --------------------------------------------------------------------------------------------


class RememberedGate(Part):
    gate: str
    passed: bool
    detail: str = ""


class RememberedOutcome(Part):
    """What one cycle learned about one candidate, with what it was judged under."""

    candidate: str
    cycle_id: str
    sealed_at: datetime
    manifest_hash: str | None = None
    environment_key: str
    policy_hash: str | None = None
    decision: Decision
    reasons: list[str] = Field(default_factory=list)
    gates: list[RememberedGate] = Field(default_factory=list)
    started: bool = True
    speedup_estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    baseline_tps: float | None = None
    candidate_tps: float | None = None
    peak_memory_gb: float | None = None
    max_peak_memory_gb: float | None = Field(None, description="the memory cap it was judged by")
    selected: bool = False


class CycleMemory(Contract):
    """memory/<cycle_id>.json: every candidate outcome of one sealed cycle."""

    cycle_id: str
    outcome: Outcome
    recorded_at: datetime
    environment: dict[str, str]
    outcomes: list[RememberedOutcome] = Field(default_factory=list)


class RecheckAttempt(Part):
    count: int = Field(0, ge=0)
    last: float = Field(0.0, description="epoch seconds of the latest attempt")


class WatchState(Contract):
    """state/watch.json: re-checks `supervise --watch` proposed, per (candidate, conditions)."""

    rechecks: dict[str, RecheckAttempt] = Field(default_factory=dict)


class InventoryFile(Part):
    path: str
    size: int
    sha256: str


class ArtifactInventory(Contract):
    """The sha256 of every file of a prepared hub snapshot, checked before each use."""

    repo: str
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)]
    snapshot: str
    allow_patterns: list[str] = Field(default_factory=list)
    prepared_at: datetime
    files: list[InventoryFile]
    digest: str = Field(description="sha256 over the sorted (path, size, sha256) list")


class LockedPackage(Part):
    """One distribution the environment's interpreter sees, where it is found first."""

    name: str = Field(max_length=100)
    version: str = Field(max_length=100)
    location: Literal["environment", "shared"]


class RuntimeLock(Contract):
    """A built runtime environment's full resolved lock: every package and version it sees,
    the flags its servers accept (from their ``--help`` at build time) and the sha256 of every
    file in it. Hashed like a model artifact and re-checked before each use."""

    env_hash: Annotated[str, Field(pattern=SHA256_PATTERN)]
    spec: RuntimeEnvSpec
    python: str = Field(description="the environment's interpreter (a path)")
    python_version: str
    platform: str
    shared_site: str | None = Field(
        None, description="the control plane's site-packages the environment sees (site: shared)"
    )
    packages: list[LockedPackage]
    lock_digest: str = Field(description="sha256 over the sorted (name, version, location) list")
    accepted_flags: dict[str, list[str]] = Field(
        default_factory=dict, description="launch template → the flags its server's --help lists"
    )
    help_sha256: dict[str, str] = Field(default_factory=dict)
    files: list[InventoryFile]
    files_digest: str = Field(description="sha256 over the sorted (path, size, sha256) list")
    size_bytes: int = 0
    built_at: datetime
    build_s: float | None = None
    builder: str = Field("", max_length=200, description="how it was built (uv, or venv + pip)")


# --------------------------------------------------------------------------------------------
# Signed evidence, verification checks and the cost of a cycle (issue 12)
# --------------------------------------------------------------------------------------------


class DsseSignature(Part):
    keyid: str = Field(description="sha256 of the raw Ed25519 public key (its fingerprint)")
    sig: str = Field(
        description="base64 Ed25519 signature over the DSSE pre-authentication "
        "encoding of payloadType and payload"
    )


class DsseEnvelope(Part):
    """evidence/<id>/SIGNATURE.dsse.json: a DSSE envelope (secure-systems-lab/dsse v1) whose
    payload is an in-toto Statement v1. Standard field names, so other tools can read it."""

    payload_type: str = Field(alias="payloadType")
    payload: str = Field(description="base64 of the Statement's bytes")
    signatures: list[DsseSignature] = Field(min_length=1)


class StatementSubject(Part):
    name: str
    digest: dict[str, str]


class PreviousBundle(Part):
    cycle_id: str
    digest: str = Field(description="sha256 of the previous bundle's Statement (its payload)")


class EvidencePredicate(Part):
    """What the sealer vouches for beyond the file list: the chain link and digests that the
    verifier recomputes (plan content hash, every sample of every phase, the verdict)."""

    cycle_id: str
    sealed_at: datetime
    manifest_sha256: str
    previous: PreviousBundle | None = None
    plan_content_hash: str
    samples_sha256: str = Field(
        description="sha256 over the canonical JSON of every sample of "
        "every run (warm-up, measure, drift, quality, greedy, held-out) "
        "and of the online verification"
    )
    sample_counts: dict[str, int] = Field(default_factory=dict)
    verdict_sha256: str | None = None
    key_fingerprint: str
    mcp_infra_version: str = ""
    mcp_infra_commit: str | None = None


class InTotoStatement(Part):
    type_: Literal["https://in-toto.io/Statement/v1"] = Field(
        "https://in-toto.io/Statement/v1", alias="_type"
    )
    subject: list[StatementSubject]
    predicate_type: Literal["urn:mcp-infra:evidence-bundle:v1"] = Field(
        "urn:mcp-infra:evidence-bundle:v1", alias="predicateType"
    )
    predicate: EvidencePredicate


class ChainHead(Contract):
    """<home>/keys/chain.json: the newest bundle sealed by this home, so that deleting the
    latest bundle (the one no later bundle names) shows too."""

    cycle_id: str
    digest: str
    count: int = Field(ge=1)


class CheckResult(Part):
    """One named verification check of an evidence bundle."""

    name: str
    status: Literal["ok", "failed", "skipped"]
    detail: str = ""


class ProcessUsage(Contract):
    """CPU and memory of one server process (tree), sampled while it ran and before it stopped."""

    pid: int
    create_time: float
    role: str
    label: str
    first_at: datetime
    first_cpu_s: float
    last_at: datetime
    last_cpu_s: float
    peak_rss_gb: float | None = None
    peak_source: str = ""


class UsageStart(Contract):
    """<cycle>/usage-start.json: counters read when the cycle began."""

    at: datetime
    monotonic: float
    supervisor_cpu_s: float
    energy_uj: dict[str, int] = Field(default_factory=dict)


class ServerCost(Part):
    label: str
    role: str
    pid: int
    cpu_s: float
    peak_rss_gb: float | None = None
    note: str = ""


class CycleCost(Contract):
    """evidence/<id>/cost.json: what the cycle cost, measured, with where each figure came from."""

    cycle_id: str
    wall_s: float
    phases_s: dict[str, float]
    servers: list[ServerCost] = Field(default_factory=list)
    supervisor_cpu_s: float | None = None
    downtime_s: float | None = None
    downtime_source: str = ""
    bytes_downloaded: int = 0
    bytes_note: str = ""
    energy_j: float | None = None
    energy_note: str = "not available"
    measurement_s: float = 0.0
    speedup_pct: float | None = None
    measurement_s_per_speedup_pct: float | None = None
    gain_note: str = ""
