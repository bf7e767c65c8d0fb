"""Verdicts: gates, per-prompt and per-cell figures, each candidate's decision."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from mcp_infra.contracts.base import Contract, Part, unset


class Comparison(Part):
    """Greedy output of one prompt compared with the baseline's."""

    prompt_id: str
    identical: bool
    compared: Literal["token_ids", "text"]
    first_divergence: int | None = None
    baseline_context: str = ""
    candidate_context: str = ""


class Interval(Part):
    """A measured value and its interval (``QualityMeasure.level``)."""

    value: float
    low: float
    high: float


class QualityMeasure(Part):
    """How closely a lossy candidate's greedy outputs follow the baseline's on the same prompts
    (core.fidelity; the definitions are in docs/cycle.md). Intervals come from a seeded
    bootstrap over prompts."""

    pairs: int = Field(ge=0, description="greedy outputs compared (a prompt asked twice: two)")
    prompts: int = Field(ge=0, description="distinct prompts, the bootstrap's unit")
    unit: Literal["tokens", "characters"] = Field(
        description="what prefix_length counts: tokens where both sides gave token ids"
    )
    identical_share: Interval = Field(description="share of outputs identical to the baseline's")
    prefix_length: Interval = Field(description="mean length of the prefix shared with it")
    mean_kl: Interval | None = Field(
        None,
        description="mean KL divergence, baseline to candidate, of the next-token distributions "
        "up to and including the first differing token, from the runtime's top-k "
        "log-probabilities; None: the runtime gave none",
    )
    top_agreement: Interval | None = Field(
        None, description="share of those positions whose most likely token is the same"
    )
    positions: int = Field(0, ge=0, description="next-token distributions compared")
    top_k: int | None = Field(None, description="log-probabilities per position, least of sides")
    level: float = Field(description="two-sided confidence of every interval")
    resamples: int = Field(ge=0)


class TaskOutcome(Part):
    """One quality task, judged on both sides' answers."""

    task: str
    baseline: bool | None = Field(description="None: the baseline gave no answer")
    candidate: bool | None = Field(description="None: the candidate gave no answer")
    detail: str = Field(description="the candidate's answer, as its checker judged it")


class GateResult(Part):
    gate: str
    passed: bool
    detail: str
    comparisons: list[Comparison] = Field(default_factory=list)
    budget: str | None = Field(
        None, exclude_if=unset, description="the quality budget judged against, by its policy path"
    )
    measure: QualityMeasure | None = Field(
        None, exclude_if=unset, description="the agreement gate's continuous measure"
    )
    tasks: list[TaskOutcome] | None = Field(
        None, exclude_if=unset, description="the quality gate's tasks, baseline and candidate"
    )


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
    gates_pending: bool = Field(
        False,
        description="its speed qualifies it and its gates are not taken yet (a screened plan "
        "takes a candidate's gates once its speed qualifies it): not qualified until they pass",
    )
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
        "start-to-start spread (intervals.ASSUMED_START_NOISE)",
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


class Screening(Part):
    """What screening decided in a plan of many candidates (``core.screening``): after one short
    start each, the candidates it judged, those it dropped with the reason
    in words, and those it left to the full decision unjudged because a start ran on a busy
    machine. It can only drop, never qualify."""

    confidence: float = Field(gt=0.5, lt=1, description="two-sided confidence of its interval")
    judged: list[str] = Field(default_factory=list, description="candidates it judged")
    dropped: dict[str, str] = Field(
        default_factory=dict, description="candidate -> why screening dropped it"
    )
    held: list[str] = Field(
        default_factory=list,
        description="left unjudged: its screening start or the baseline's ran on a busy machine",
    )


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
    screening: Screening | None = Field(
        None, description="a plan of many candidates: what its screening round dropped"
    )
