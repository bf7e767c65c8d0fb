"""Plans: what an agent may send, and the frozen plan a cycle runs."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from mcp_infra.contracts.base import (
    CANDIDATE_ID_PATTERN,
    Contract,
    JSONValue,
    Part,
    text_problem,
    unset,
)
from mcp_infra.contracts.manifest import CandidateClass
from mcp_infra.contracts.policy import MeasureProtocol, QualityBudgets

MAX_PLAN_CANDIDATES = 16
"""The most candidates one plan may name. A plan of more than a few is screened
(``core.screening``): one short start each, then the full decision for the survivors, each
taking its gates once its speed qualifies it. 16 because the screening round is paid in full,
one fresh start per candidate: on the real target of ``benchmarks/profiles/qwen27b-m5pro.yaml``
a 14-candidate generated catalog is projected at about half an hour under the single-user
policy and an hour (up to 110 minutes in one seed of ten) of the shipped policies' 120-minute
cycle budget under the default one (docs/benchmarks.md); a longer list belongs in two plans."""


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


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
    ] = Field(min_length=1, max_length=MAX_PLAN_CANDIDATES)
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
    value: JSONValue = None  # the value as proposed, clamped or defaulted
    reason: str


class RefusedCandidate(Part):
    id: str
    reason: str


class EffectiveThresholds(Part):
    min_speedup_pct: float
    max_peak_memory_gb: float
    max_error_rate: float
    worst_prompt_tolerance_pct: float
    quality_budget: QualityBudgets | None = Field(
        None, exclude_if=unset, description="the policy's quality budgets (core.budget)"
    )
    lossy_min_identical_fraction: float | None = Field(
        None,
        exclude_if=unset,
        ge=0,
        le=1,
        description="the one lossy bar of plans frozen before quality budgets: evidence verify "
        "judges such a plan's lossy candidates by it, as they were judged",
    )

    @model_validator(mode="after")
    def _one_lossy_bar(self) -> EffectiveThresholds:
        if (self.quality_budget is None) == (self.lossy_min_identical_fraction is None):
            raise ValueError("need exactly one of quality_budget and lossy_min_identical_fraction")
        return self


class FrozenPlan(Contract):
    """A sanitized plan, frozen on disk before the service is touched."""

    plan_id: str
    created_at: datetime
    proposed_by: str = Field(max_length=200)
    proposed: Plan
    candidates: list[str]
    thresholds: EffectiveThresholds
    protocol: MeasureProtocol
    auto_promote: dict[CandidateClass, bool]
    changes: list[PlanChange]
    refused: list[RefusedCandidate]
    registry_hash: str
    policy_hash: str
    content_hash: str = ""
