"""Policy loading and plan sanitization: untrusted plan in, frozen plan (or a refusal) out.

``sanitize`` is pure. A plan can only tighten what the policy allows, never loosen it; every change
made to the proposal is recorded with its reason; nothing in the plan ever reaches a command line
(candidate ids are looked up in the registry, and only the registry's typed knobs are used).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    EffectiveThresholds,
    FrozenPlan,
    Manifest,
    Plan,
    PlanChange,
    Policy,
    Recipe,
    RefusedCandidate,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.preflight import Preflight, find_candidate
from mcp_infra.errors import McpInfraError

MAX_PLAN_BYTES = 16_384


class PlanRefused(McpInfraError, ValueError):
    """The plan cannot be accepted; the message is ours and never echoes raw input."""

    def __init__(
        self,
        message: str,
        problems: list[str] | None = None,
        refused: list[RefusedCandidate] | None = None,
    ) -> None:
        super().__init__(message)
        self.problems = problems or []
        self.refused = refused or []


LATER_OPTIONAL_FIELDS = frozenset({"timed_max_tokens", "learned_spread", "futility_confidence"})
"""Protocol fields added after plans were first sealed: unset, they hash as absent."""


def policy_hash(policy: Policy) -> str:
    return sha256_bytes(canonical_json(policy.model_dump(mode="json"), LATER_OPTIONAL_FIELDS))


def _describe_errors(exc: ValidationError) -> list[str]:
    """Validation problems by location and kind only: the offending values are not repeated."""
    known = {
        "hypothesis",
        "candidates",
        "acceptance",
        "notes",
        "min_speedup_pct",
        "max_peak_memory_gb",
    }
    problems = []
    for err in exc.errors()[:10]:
        parts = [
            str(p) if isinstance(p, int) or p in known else "<unknown field>" for p in err["loc"]
        ]  # field names are untrusted text too: never echo them
        loc = ".".join(parts) or "(plan)"
        kind = err["type"]
        message = {
            "extra_forbidden": "unknown field (not allowed)",
            "missing": "required field is missing",
            "string_too_long": "text is too long",
            "string_too_short": "text is empty",
            "too_long": "too many items",
            "too_short": "too few items",
            "finite_number": "must be a finite number",
            "float_type": "must be a number (not text, not true/false)",
        }.get(kind)
        if message is None:
            ctx = err.get("ctx") or {}
            bound = {k: v for k, v in ctx.items() if k in {"ge", "le", "gt", "lt", "max_length"}}
            message = f"invalid value ({kind}{', ' + str(bound) if bound else ''})"
            if kind == "value_error":
                message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")[:120]
        problems.append(f"{loc}: {message}")
    return problems


def has_non_finite(value: Any, depth: int = 0) -> bool:
    """Is there a NaN or an infinity anywhere in this JSON-like value? (A raw JSON-RPC peer can
    send them; Python's json accepts them.) Bounded in depth, never recursing forever."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 20:
        return False
    if isinstance(value, Mapping):
        return any(has_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v, depth + 1) for v in value)
    return False


def parse_plan(raw: Any) -> Plan:
    """Validate untrusted input (an object, or a JSON string of one) into a ``Plan``."""
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if isinstance(raw, str | bytes):
        if len(raw) > MAX_PLAN_BYTES:
            raise PlanRefused("plan refused: larger than 16 KiB")
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise PlanRefused("plan refused: not valid JSON") from exc
    if not isinstance(raw, dict):
        raise PlanRefused("plan refused: a plan is a JSON object with hypothesis and candidates")
    if len(canonical_json(raw)) > MAX_PLAN_BYTES:
        raise PlanRefused("plan refused: larger than 16 KiB")
    if has_non_finite(raw):
        raise PlanRefused("plan refused: numbers must be finite", ["(plan): NaN or infinity"])
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        problems = _describe_errors(exc)
        raise PlanRefused("plan refused: " + "; ".join(problems), problems) from exc


def _display_id(candidate: str, index: int) -> str:
    """Show an id back only if it is a well-formed id; otherwise name it by position."""
    if re.fullmatch(CANDIDATE_ID_PATTERN, candidate):
        return candidate
    return f"<candidate #{index + 1}: not a well-formed id>"


def sanitize(
    plan: Plan,
    *,
    manifests: dict[str, Manifest],
    policy: Policy,
    preflights: dict[str, Preflight],
    live_recipe: Recipe,
    live_peak_memory_gb: float | None,
    registry_hash: str,
    policy_hash: str,
    proposed_by: str,
    now: datetime,
    candidate_recipes: dict[str, Recipe] | None = None,
    skip: dict[str, str] | None = None,
) -> FrozenPlan:
    """Turn a validated plan into a frozen plan, or raise ``PlanRefused`` if nothing remains.

    ``skip`` maps candidate ids to a reason they must not run again (recipe memory).
    """
    changes: list[PlanChange] = []
    refused: list[RefusedCandidate] = []
    kept: list[str] = []
    for index, candidate in enumerate(plan.candidates):
        shown = _display_id(candidate, index)
        if candidate == BASELINE_ID:
            changes.append(
                PlanChange(
                    field="candidates",
                    action="removed",
                    value=BASELINE_ID,
                    reason="the baseline is always measured first",
                )
            )
            continue
        if candidate in kept:
            changes.append(
                PlanChange(
                    field="candidates",
                    action="removed",
                    value=candidate,
                    reason="duplicate candidate dropped",
                )
            )
            continue
        found = find_candidate(manifests, candidate)
        if found is None:
            refused.append(RefusedCandidate(id=shown, reason="not a candidate of the registry"))
            continue
        check = preflights.get(candidate)
        if check is None or not check.passed:
            why = "; ".join(check.failures()) if check else "no preflight result"
            refused.append(RefusedCandidate(id=candidate, reason=f"preflight failed: {why}"))
            continue
        if skip and candidate in skip:
            refused.append(RefusedCandidate(id=candidate, reason=skip[candidate]))
            changes.append(
                PlanChange(
                    field="candidates", action="removed", value=candidate, reason=skip[candidate]
                )
            )
            continue
        recipe = (candidate_recipes or {}).get(candidate)
        if recipe is not None and recipe.key() == live_recipe.key():
            changes.append(
                PlanChange(
                    field="candidates",
                    action="removed",
                    value=candidate,
                    reason="identical to the recipe already serving",
                )
            )
            continue
        kept.append(candidate)
    if not kept:
        raise PlanRefused(
            "plan refused: no runnable candidate remains",
            [f"{r.id}: {r.reason}" for r in refused],
            refused,
        )
    changes.insert(
        0,
        PlanChange(
            field="candidates",
            action="added",
            value=BASELINE_ID,
            reason="the live recipe is measured first as the baseline",
        ),
    )

    thresholds = combined_thresholds(
        plan,
        policy,
        [find_candidate(manifests, c)[0] for c in kept],  # type: ignore[index]
        live_peak_memory_gb,
        changes,
    )
    auto = {cls: bool(policy.auto_promote.get(cls, False)) for cls in policy.auto_promote}
    frozen = FrozenPlan(
        plan_id="",
        created_at=now,
        proposed_by=proposed_by[:200],
        proposed=plan,
        candidates=[BASELINE_ID, *kept],
        thresholds=thresholds,
        protocol=policy.protocol,
        auto_promote=auto,
        changes=changes,
        refused=refused,
        registry_hash=registry_hash,
        policy_hash=policy_hash,
    )
    return seal_plan(frozen)


def seal_plan(frozen: FrozenPlan) -> FrozenPlan:
    """Give the plan its content hash and an id derived from it and its time."""
    digest = plan_content_hash(frozen)
    stamp = frozen.created_at.strftime("%Y%m%d-%H%M%S")
    return frozen.model_copy(update={"plan_id": f"p-{stamp}-{digest[:8]}", "content_hash": digest})


def plan_content_hash(frozen: FrozenPlan) -> str:
    body = frozen.model_dump(mode="json", exclude={"plan_id", "content_hash"})
    return sha256_bytes(canonical_json(body, LATER_OPTIONAL_FIELDS))


def combined_thresholds(
    plan: Plan,
    policy: Policy,
    manifests: list[Manifest],
    live_peak: float | None,
    changes: list[PlanChange],
) -> EffectiveThresholds:
    bounds = policy.thresholds
    speed = bounds.min_speedup_pct.default
    memory = bounds.max_peak_memory_gb.default
    asked = plan.acceptance
    if asked and asked.min_speedup_pct is not None:
        value = min(
            max(asked.min_speedup_pct, bounds.min_speedup_pct.low), bounds.min_speedup_pct.high
        )
        if value != asked.min_speedup_pct:
            changes.append(
                PlanChange(
                    field="acceptance.min_speedup_pct",
                    action="clamped",
                    value=value,
                    reason="clamped to the policy's range "
                    f"[{bounds.min_speedup_pct.low}, "
                    f"{bounds.min_speedup_pct.high}]",
                )
            )
        if value >= speed:
            if value > speed:
                changes.append(
                    PlanChange(
                        field="acceptance.min_speedup_pct",
                        action="tightened",
                        value=value,
                        reason="the plan asks for a stricter speedup",
                    )
                )
            speed = value
        else:
            changes.append(
                PlanChange(
                    field="acceptance.min_speedup_pct",
                    action="kept",
                    value=speed,
                    reason=f"a plan can only tighten the policy's minimum speedup of {speed}%",
                )
            )
    if asked and asked.max_peak_memory_gb is not None:
        value = min(
            max(asked.max_peak_memory_gb, bounds.max_peak_memory_gb.low),
            bounds.max_peak_memory_gb.high,
        )
        if value != asked.max_peak_memory_gb:
            changes.append(
                PlanChange(
                    field="acceptance.max_peak_memory_gb",
                    action="clamped",
                    value=value,
                    reason="clamped to the policy's range "
                    f"[{bounds.max_peak_memory_gb.low}, "
                    f"{bounds.max_peak_memory_gb.high}]",
                )
            )
        if live_peak is not None and value < live_peak:
            changes.append(
                PlanChange(
                    field="acceptance.max_peak_memory_gb",
                    action="refused",
                    value=value,
                    reason=f"a cap below the running baseline's "
                    f"measured peak ({live_peak:.2f} GB) would disqualify it",
                )
            )
        elif value <= memory:
            if value < memory:
                changes.append(
                    PlanChange(
                        field="acceptance.max_peak_memory_gb",
                        action="tightened",
                        value=value,
                        reason="the plan asks for a stricter memory cap",
                    )
                )
            memory = value
        else:
            changes.append(
                PlanChange(
                    field="acceptance.max_peak_memory_gb",
                    action="kept",
                    value=memory,
                    reason=f"a plan can only tighten the policy's memory cap of {memory} GB",
                )
            )
    for manifest in manifests:
        if manifest.min_speedup_pct is not None and manifest.min_speedup_pct > speed:
            speed = manifest.min_speedup_pct
            changes.append(
                PlanChange(
                    field="thresholds.min_speedup_pct",
                    action="tightened",
                    value=speed,
                    reason=f"manifest {manifest.id} requires it",
                )
            )
        if manifest.max_peak_memory_gb is not None and manifest.max_peak_memory_gb < memory:
            memory = manifest.max_peak_memory_gb
            changes.append(
                PlanChange(
                    field="thresholds.max_peak_memory_gb",
                    action="tightened",
                    value=memory,
                    reason=f"manifest {manifest.id} caps it",
                )
            )
    return EffectiveThresholds(
        min_speedup_pct=speed,
        max_peak_memory_gb=memory,
        max_error_rate=bounds.max_error_rate,
        worst_prompt_tolerance_pct=bounds.worst_prompt_tolerance_pct,
        tie_tolerance_pct=bounds.tie_tolerance_pct,
        lossy_min_identical_fraction=bounds.lossy_min_identical_fraction,
    )
