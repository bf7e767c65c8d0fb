"""Policy loading and plan sanitization: untrusted plan in, frozen plan (or a refusal) out.

``sanitize`` is pure. A plan can only tighten what the policy allows, never loosen it; every change
made to the proposal is recorded with its reason; nothing in the plan ever reaches a command line
(candidate ids are looked up in the registry, and only the registry's typed knobs are used).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from mcp_infra.contracts import (
    BASELINE_ID,
    CANDIDATE_ID_PATTERN,
    Bounded,
    EffectiveThresholds,
    FrozenPlan,
    JSONValue,
    LearnedSpread,
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


LATER_OPTIONAL_FIELDS = frozenset(
    {
        "timed_max_tokens",
        "learned_spread",
        "futility_confidence",
        "heldout_repeats",
        "max_unserved_s",
        "quiet_cpu_fraction",
    }
)
"""Protocol and policy fields added after plans were first sealed: unset, they hash as absent."""


RETIRED_FIELDS: dict[str, dict[str, object]] = {
    "service": {"max_live_requests_per_round": 2, "max_round_repeats": 2},
}
"""Policy fields removed unread (no code ever acted on them), hashed at the defaults every
policy carried, so a plan frozen while they existed keeps its hash: {section: {field: value}}."""


def policy_hash(policy: Policy) -> str:
    body = policy.model_dump(mode="json")
    for section, fields in RETIRED_FIELDS.items():
        body[section] = {**fields, **body[section]}
    return sha256_bytes(canonical_json(body, LATER_OPTIONAL_FIELDS))


def shown_name(key: object) -> str:
    """A field or argument name shown back only if it looks like one (names are untrusted text:
    anything else is named by its kind)."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,39}", key):
        return key
    return "<a field whose name is not a plain word>"


def limit_words(kind: str, ctx: dict[str, Any]) -> str | None:  # pydantic's error ctx type
    """The limit a value broke, in plain words ("at most 3 items, got 10"), from a pydantic
    error's type and context; None for an error that is not about a limit."""
    got = ctx.get("actual_length")
    tail = f", got {got}" if got is not None else ""
    words = {
        "too_long": f"at most {ctx.get('max_length')} items{tail}",
        "too_short": f"at least {ctx.get('min_length')} item(s){tail}",
        "string_too_long": f"text is too long (at most {ctx.get('max_length')} characters)",
        "string_too_short": "text is empty (at least 1 character)",
        "less_than_equal": f"at most {ctx.get('le')}",
        "greater_than_equal": f"at least {ctx.get('ge')}",
        "literal_error": f"must be one of {ctx.get('expected', 'the allowed values')}",
    }
    return words.get(kind)


def _describe_errors(exc: ValidationError) -> list[str]:
    """Validation problems by field name, kind and limit; values are never repeated."""
    problems = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) if isinstance(p, int) else shown_name(p) for p in err["loc"])
        kind = err["type"]
        ctx = err.get("ctx") or {}
        message = limit_words(kind, ctx) or {
            "extra_forbidden": "unknown field (allowed: "
            + ", ".join(_ALLOWED.get(_parent(err["loc"]), ()))
            + ")",
            "missing": "required field is missing",
            "finite_number": "must be a finite number",
            "float_type": "must be a number (not text, not true/false)",
            "string_type": "must be a string",
            "list_type": "must be a list of candidate ids",
            "dict_type": "must be a JSON object",
            "model_type": "must be a JSON object",
        }.get(kind)
        if message is None:
            bound = {k: v for k, v in ctx.items() if k in {"ge", "le", "gt", "lt", "max_length"}}
            message = f"invalid value ({kind}{', ' + str(bound) if bound else ''})"
            if kind == "value_error":
                message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")[:160]
        problems.append(f"{loc or '(plan)'}: {message}")
    return problems


_ALLOWED: dict[str, tuple[str, ...]] = {
    "": ("hypothesis", "candidates", "acceptance", "notes"),
    "acceptance": ("min_speedup_pct", "max_peak_memory_gb"),
}


def _parent(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc[:-1])


MAX_PLAN_DEPTH = 8  # a plan nests two levels (acceptance, candidates); a margin, never more


def nesting_depth(raw: JSONValue, stop: int = MAX_PLAN_DEPTH + 1) -> int:
    """How deeply a JSON text or a JSON-like value nests (objects and lists), counted without
    recursion and without parsing, up to ``stop`` (a string of 8,000 ``[`` must not reach a
    recursive parser)."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        return _text_depth(raw, stop)
    return _value_depth(raw, stop)


def _text_depth(raw: str, stop: int) -> int:
    """The depth of brackets outside JSON strings, read character by character."""
    depth = deepest = 0
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest >= stop:
                return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _value_depth(raw: JSONValue, stop: int) -> int:
    """The depth of nested mappings, lists and tuples, walked with a stack."""
    deepest = 0
    stack: list[tuple[JSONValue, int]] = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Iterable[JSONValue] = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest >= stop:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_shape(raw: JSONValue) -> None:
    """Size and nesting of an untrusted plan, checked before anything parses or walks it."""
    if isinstance(raw, str | bytes) and len(raw) > MAX_PLAN_BYTES:
        raise PlanRefused(
            f"plan refused: larger than 16 KiB (at most {MAX_PLAN_BYTES} bytes)",
            [f"(plan): at most {MAX_PLAN_BYTES} bytes"],
        )
    if nesting_depth(raw) > MAX_PLAN_DEPTH:
        raise PlanRefused(
            f"plan refused: nested too deeply (at most {MAX_PLAN_DEPTH} levels of objects and "
            "lists; a plan needs 2)",
            [f"(plan): nested more than {MAX_PLAN_DEPTH} levels"],
        )


def has_non_finite(value: JSONValue, depth: int = 0) -> bool:
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


def parse_plan(raw: JSONValue) -> Plan:
    """Validate untrusted input (an object, or a JSON string of one) into a ``Plan``."""
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    check_shape(raw)
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            where = (
                f" (line {exc.lineno} column {exc.colno}: {exc.msg})"
                if isinstance(exc, json.JSONDecodeError)
                else ""
            )
            raise PlanRefused(
                f"plan refused: not valid JSON{where}", [f"(plan): not valid JSON{where}"]
            ) from exc
    if not isinstance(raw, dict):
        raise PlanRefused("plan refused: a plan is a JSON object with hypothesis and candidates")
    if len(canonical_json(raw)) > MAX_PLAN_BYTES:
        raise PlanRefused(
            f"plan refused: larger than 16 KiB (at most {MAX_PLAN_BYTES} bytes)",
            [f"(plan): at most {MAX_PLAN_BYTES} bytes"],
        )
    if has_non_finite(raw):
        raise PlanRefused("plan refused: numbers must be finite", ["(plan): NaN or infinity"])
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        problems = _describe_errors(exc)
        raise PlanRefused("plan refused: " + "; ".join(problems), problems) from exc


def nearest(word: str, choices: list[str], n: int = 3) -> list[str]:
    """The valid ids closest to a mistyped one (difflib's ratio), best first."""
    return difflib.get_close_matches(word, choices, n=n, cutoff=0.75)


def nearest_text(word: str, choices: list[str]) -> str:
    """`` (nearest: a, b)`` for a message, or nothing when no id is close."""
    close = nearest(word, choices)
    return f" (nearest: {', '.join(close)})" if close else ""


def _display_id(candidate: str, index: int) -> str:
    """Show an id back only if it is a well-formed id; otherwise name it by position."""
    if re.fullmatch(CANDIDATE_ID_PATTERN, candidate):
        return candidate
    return f"<candidate #{index + 1}: not a well-formed id>"


def _clamped(field: str, asked: float, bounds: Bounded, changes: list[PlanChange]) -> float:
    """An acceptance value moved into the policy's range, the move recorded with its reason."""
    value = min(max(asked, bounds.low), bounds.high)
    if value != asked:
        changes.append(
            PlanChange(
                field=f"acceptance.{field}",
                action="clamped",
                value=value,
                reason=f"clamped to the policy's range [{bounds.low}, {bounds.high}]",
            )
        )
    return value


def sanitize(  # noqa: PLR0913  keyword-only inputs of one pure decision, each named at its call
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
    learned_spread: LearnedSpread | None = None,
) -> FrozenPlan:
    """Turn a validated plan into a frozen plan, or raise ``PlanRefused`` if nothing remains.

    ``skip`` maps candidate ids to a reason they must not run again (recipe memory).
    ``learned_spread``: this home's start-to-start spread, frozen into the protocol where the
    policy asks to learn it.
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
            ids = [f"{m.id}:{v.id}" for m in manifests.values() for v in m.variants]
            why = "not a candidate of the registry" + nearest_text(candidate, ids)
            refused.append(RefusedCandidate(id=shown, reason=why))
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
        problems = [f"{r.id}: {r.reason}" for r in refused]
        problems += [
            f"{c.value}: {c.reason}"
            for c in changes
            if c.action == "removed" and all(r.id != c.value for r in refused)
        ]
        raise PlanRefused(
            "plan refused: no runnable candidate remains: " + "; ".join(problems), problems, refused
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
        protocol=(
            policy.protocol.model_copy(update={"learned_spread": learned_spread})
            if policy.protocol.learn_spread and learned_spread is not None
            else policy.protocol
        ),
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
        value = _clamped("min_speedup_pct", asked.min_speedup_pct, bounds.min_speedup_pct, changes)
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
        value = _clamped(
            "max_peak_memory_gb", asked.max_peak_memory_gb, bounds.max_peak_memory_gb, changes
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
        lossy_min_identical_fraction=bounds.lossy_min_identical_fraction,
    )
