"""Projection: what a plan would cost on a target (flows.projection, benchmarks/cycle_cost.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mcp_infra.contracts.base import Contract, Part, unset


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
    diverges: bool = Field(
        False,
        description="greedy outputs (greedy passes and quality answers) differ from the baseline's",
    )


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

    basis: Literal["this-home", "live-service", "unknown", "pending"] = Field(
        description="this-home: from this home's sealed cycles; live-service: from the live "
        "service as the running cycle's BASELINE step measured it (a home's first cycle, every "
        "configuration priced as the live recipe); unknown: nothing to price it from (why says "
        "what is missing); pending: being computed, ask again"
    )
    why: str = Field("", max_length=1000)
    minutes: float | None = Field(None, description="median over the projected seeds")
    minutes_high: float | None = Field(None, description="the longest projected seed")
    screening_minutes: float | None = Field(
        None,
        description="median minutes of the screening round (a plan of many candidates: every "
        "gate and one short start each); None: the plan is not screened",
    )
    deciding_minutes: float | None = Field(
        None, description="median minutes of everything after screening (or of the whole cycle)"
    )
    screened_out: dict[str, int] = Field(
        default_factory=dict, description="candidate -> seeds in which screening dropped it"
    )
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
    answers_kept: bool = Field(
        False,
        exclude_if=unset,
        description="priced with the live configuration's greedy outputs kept from an earlier "
        "cycle (not asked again: docs/cycle.md, answers kept between cycles)",
    )
