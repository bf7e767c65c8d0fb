"""Policies (policy/*.yaml): thresholds, the measurement protocol, window, budgets, service."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from mcp_infra.contracts.base import ID_PATTERN, Contract, Part
from mcp_infra.contracts.manifest import CandidateClass, TemplateName


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


class QualityBudget(Part):
    """How far a lossy candidate may move from the baseline (core.budget). Each limit is held
    against the worse end of its measure's interval; null turns a limit off (reported, not
    held). The defaults keep an 8-bit build of SmolLM2-135M-Instruct and refuse its 4-bit build
    (docs/benchmarks.md has the figures)."""

    min_identical_share: float = Field(
        0.2, ge=0, le=1, description="greedy outputs identical to the baseline's, at least"
    )
    min_top_agreement: float | None = Field(
        0.9,
        ge=0,
        le=1,
        description="positions up to the first differing token whose most likely next token is "
        "the baseline's, at least",
    )
    max_mean_kl: float | None = Field(
        0.1,
        ge=0,
        description="mean KL divergence (nats) of the next-token distributions up to the first "
        "differing token, at most; a runtime without log-probabilities cannot show it",
    )
    task_allowance: int = Field(
        0,
        ge=0,
        le=1000,
        description="quality tasks the baseline passes that the candidate may fail",
    )


class QualityBudgets(Part):
    """The quality budget per class of lossy candidate (a variant's semantics says whether it is
    lossy); classes not named take ``default``. Only a class named here may promote a lossy
    candidate without a person (``Policy.auto_promote``)."""

    default: QualityBudget = Field(default_factory=QualityBudget)
    classes: dict[CandidateClass, QualityBudget] = Field(default_factory=dict)

    def for_class(self, klass: CandidateClass | None) -> tuple[str, QualityBudget]:
        """(the budget's path in the policy, the budget) for a candidate of ``klass``."""
        if klass is not None and klass in self.classes:
            return f"quality_budget.classes.{klass.value}", self.classes[klass]
        return "quality_budget.default", self.default


class Thresholds(Part):
    min_speedup_pct: Bounded
    max_peak_memory_gb: Bounded
    max_error_rate: float = Field(0.0, ge=0, le=1)
    worst_prompt_tolerance_pct: float = Field(
        10.0, ge=0, le=100, description="largest per-prompt slowdown a qualified candidate may show"
    )
    quality_budget: QualityBudgets = Field(default_factory=QualityBudgets)

    @model_validator(mode="before")
    @classmethod
    def _migrate_identical_fraction(cls, data: object) -> object:
        """A policy written before quality budgets names ``lossy_min_identical_fraction``: it
        becomes the default budget's ``min_identical_share`` (naming both is refused)."""
        if not isinstance(data, dict) or "lossy_min_identical_fraction" not in data:
            return data
        data = dict(data)
        fraction = data.pop("lossy_min_identical_fraction")
        if "quality_budget" in data:
            raise ValueError(
                "lossy_min_identical_fraction is replaced by quality_budget: keep only "
                "quality_budget (its default.min_identical_share)"
            )
        data["quality_budget"] = {"default": {"min_identical_share": fraction}}
        return data


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
        WorkloadCell(request_class=c, concurrency=n)
        for c in ("short", "long_prefill")
        for n in (1, 4)
    ]


class LearnedSpread(Part):
    """This home's start-to-start spread, learned from earlier cycles' baseline starts: the sd
    of a configuration's per-start mean log decode speed, pooled within cycles."""

    sd: float = Field(gt=0, le=1)
    df: int = Field(ge=1, le=1000, description="degrees of freedom: starts minus one per cycle")
    source: str = Field("", max_length=300, description="the cycles it was learned from")


class MeasureProtocol(Part):
    """How candidates are measured: the suites, requests per prompt, starts and rounds, the
    workload cells and the confidence of the decision (``Policy.protocol``, frozen into each
    plan). Named for what it is: ``typing.Protocol`` is another thing."""

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
    learn_spread: bool = Field(
        False,
        description="learn the start-to-start spread from this home's sealed cycles when a "
        "plan is frozen (state.spread)",
    )
    learned_spread: LearnedSpread | None = Field(
        None,
        description="set when the plan is frozen, from this home's history: pooled with each "
        "cycle's own start-to-start spread where the two agree (core.intervals.pooled_variance)",
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
    gates_first: bool | None = Field(
        None,
        description="true: a screened plan's candidates take every gate in their screening "
        "start, before any timing, so each one's outputs are judged whether or not it is "
        "faster; unset: a candidate takes its gates once its speed qualifies it "
        "(core.screening)",
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
        "0.3-second look), at most quiet_wait_s; None: never wait (core.machine)",
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
    protocol: MeasureProtocol = Field(default_factory=MeasureProtocol)
    auto_promote: dict[CandidateClass, bool] = Field(
        default_factory=lambda: dict(DEFAULT_AUTO_PROMOTE),
        description="per class: may a qualified candidate be promoted without a person? Classes "
        "left out take DEFAULT_AUTO_PROMOTE (drafters and server tuning yes, the rest no)",
    )
    window: Window = Field(default_factory=Window)
    budgets: Budgets = Field(default_factory=Budgets)
    service: ServicePolicy = Field(default_factory=ServicePolicy)
    recipe_memory: bool = Field(
        True,
        description="refuse a candidate whose remembered outcome under the same manifest, "
        "policy and environment failed a gate that does not depend on the plan (state.memory). "
        "The demo turns it off: each demo judges every candidate afresh, its earlier bundles "
        "kept only for the start-to-start spread they teach",
    )

    @field_validator("auto_promote")
    @classmethod
    def _every_class(cls, value: dict[CandidateClass, bool]) -> dict[CandidateClass, bool]:
        return {
            klass: bool(value.get(klass, DEFAULT_AUTO_PROMOTE[klass])) for klass in CandidateClass
        }

    @model_validator(mode="after")
    def _lossy_promotes_with_a_budget(self) -> Policy:
        """A class whose candidates change outputs may promote without a person only under a
        quality budget written for it: the default budget is a floor, not a consent."""
        named = self.thresholds.quality_budget.classes
        loose = [
            klass.value
            for klass, on in self.auto_promote.items()
            if on and klass not in LOSSLESS_CLASSES and klass not in named
        ]
        if loose:
            raise ValueError(
                f"auto_promote is on for {', '.join(loose)}, whose candidates change outputs: "
                "name a budget for each in thresholds.quality_budget.classes, or turn it off"
            )
        return self

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


# Classes whose candidates are lossless unless a variant says otherwise (a lossy variant of one
# still needs a person unless its class has a budget of its own: core.budget).
LOSSLESS_CLASSES = frozenset({CandidateClass.ACCELERATION_PLUGIN, CandidateClass.SERVER_TUNING})

DEFAULT_AUTO_PROMOTE: dict[CandidateClass, bool] = {
    CandidateClass.ACCELERATION_PLUGIN: True,
    CandidateClass.SERVER_TUNING: True,
    CandidateClass.KV_CACHE: False,
    CandidateClass.QUANTIZATION: False,
    CandidateClass.RUNTIME_UPGRADE: False,
    CandidateClass.MODEL_CHANGE: False,
}
