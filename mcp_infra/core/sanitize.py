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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

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
    MeasureProtocol,
    Plan,
    PlanChange,
    Policy,
    Recipe,
    RefusedCandidate,
)
from mcp_infra.core.budget import legacy_fraction
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.preflight import Preflight, all_candidates, find_candidate
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
        "gates_first",
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
    if (fraction := legacy_fraction(policy.thresholds.quality_budget)) is not None:
        body["thresholds"] = {**body["thresholds"], "lossy_min_identical_fraction": fraction}
        del body["thresholds"]["quality_budget"]  # hashed as the one field it replaced
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


def _clamped(asked: float, bounds: Bounded) -> tuple[float, str]:
    """An acceptance value moved into the policy's range, and the words that say so ('' when
    it was inside): the field's one change carries them with what came of the value."""
    value = min(max(asked, bounds.low), bounds.high)
    return value, (
        f"clamped to the policy's range [{bounds.low}, {bounds.high}]; " if value != asked else ""
    )


def _change(
    field: str, action: Literal["tightened", "kept"], value: float, reason: str, clamp: str
) -> PlanChange:
    """The one change of an acceptance field: clamped (saying what followed) or as is."""
    return PlanChange(
        field=f"acceptance.{field}",
        action="clamped" if clamp else action,
        value=value,
        reason=clamp + reason,
    )


@dataclass(frozen=True)
class PlanContext:
    """What a plan is judged against, read from the home once: the registry and each
    candidate's preflight on this machine, the policy, the live recipe and its last measured
    peak, the hashes a frozen plan records, what recipe memory refuses, and this home's learned
    start-to-start spread."""

    manifests: dict[str, Manifest]
    policy: Policy
    preflights: dict[str, Preflight]
    live_recipe: Recipe
    registry_hash: str
    policy_hash: str
    live_peak_memory_gb: float | None = None
    candidate_recipes: Mapping[str, Recipe] = field(default_factory=dict)
    skip: Mapping[str, str] = field(default_factory=dict)  # candidate id -> why not again
    learned_spread: LearnedSpread | None = None

    def manifest_of(self, candidate: str) -> Manifest:
        """The manifest of a candidate the screen kept (so one the registry has)."""
        found = find_candidate(self.manifests, candidate)
        assert found is not None, f"{candidate} was screened, so it is in the registry"
        return found[0]


def sanitize(plan: Plan, context: PlanContext, *, proposed_by: str, now: datetime) -> FrozenPlan:
    """Turn a validated plan into a frozen plan, or raise ``PlanRefused`` if nothing remains:
    the candidates screened, the baseline put first, the thresholds combined strictest-of, the
    protocol frozen (with the learned spread where the policy asks to learn it), then sealed."""
    changes, refused, kept = screen_candidates(plan.candidates, context)
    if not kept:
        raise _nothing_runnable(changes, refused)
    changes.insert(
        0,
        PlanChange(
            field="candidates",
            action="added",
            value=BASELINE_ID,
            reason="the live recipe is measured first as the baseline",
        ),
    )
    policy = context.policy
    thresholds = combined_thresholds(
        plan,
        policy,
        [context.manifest_of(c) for c in kept],
        context.live_peak_memory_gb,
        changes,
    )
    frozen = FrozenPlan(
        plan_id="",
        created_at=now,
        proposed_by=proposed_by[:200],
        proposed=plan,
        candidates=[BASELINE_ID, *kept],
        thresholds=thresholds,
        protocol=frozen_protocol(policy, context.learned_spread),
        auto_promote={
            cls: bool(policy.auto_promote.get(cls, False)) for cls in policy.auto_promote
        },
        changes=changes,
        refused=refused,
        registry_hash=context.registry_hash,
        policy_hash=context.policy_hash,
    )
    return seal_plan(frozen)


def screen_candidates(
    candidates: list[str], context: PlanContext
) -> tuple[list[PlanChange], list[RefusedCandidate], list[str]]:
    """Each proposed candidate kept, removed (with why) or refused (with why), in order."""
    changes: list[PlanChange] = []
    refused: list[RefusedCandidate] = []
    kept: list[str] = []
    for index, candidate in enumerate(candidates):
        change, refusal = screen(candidate, index, kept, context)
        changes += [change] if change else []
        refused += [refusal] if refusal else []
        if change is None and refusal is None:
            kept.append(candidate)
    return changes, refused, kept


def screen(
    candidate: str, index: int, kept: list[str], context: PlanContext
) -> tuple[PlanChange | None, RefusedCandidate | None]:
    """One proposed candidate's screen, checks in order: the baseline and duplicates are removed,
    an unknown id or a failed preflight is refused, and recipe memory's skip and the live recipe
    itself are both. (None, None): it is kept."""
    if candidate == BASELINE_ID:
        return _removed(BASELINE_ID, "the baseline is always measured first"), None
    if candidate in kept:
        return _removed(candidate, "duplicate candidate dropped"), None
    if find_candidate(context.manifests, candidate) is None:
        why = "not a candidate of the registry" + nearest_text(
            candidate, all_candidates(context.manifests)
        )
        return None, RefusedCandidate(id=_display_id(candidate, index), reason=why)
    check = context.preflights.get(candidate)
    if check is None or not check.passed:
        why = "; ".join(check.failures()) if check else "no preflight result"
        return None, RefusedCandidate(id=candidate, reason=f"preflight failed: {why}")
    if candidate in context.skip:
        why = context.skip[candidate]
        return _removed(candidate, why), RefusedCandidate(id=candidate, reason=why)
    recipe = context.candidate_recipes.get(candidate)
    if recipe is not None and recipe.key() == context.live_recipe.key():
        why = "it is the live recipe (it serves now and is measured first, as the baseline)"
        return _removed(candidate, why), RefusedCandidate(id=candidate, reason=why)
    return None, None


def _removed(candidate: str, reason: str) -> PlanChange:
    return PlanChange(field="candidates", action="removed", value=candidate, reason=reason)


def _nothing_runnable(changes: list[PlanChange], refused: list[RefusedCandidate]) -> PlanRefused:
    """The refusal of a plan none of whose candidates can run, every reason named once."""
    problems = [f"{r.id}: {r.reason}" for r in refused]
    problems += [
        f"{c.value}: {c.reason}"
        for c in changes
        if c.action == "removed" and all(r.id != c.value for r in refused)
    ]
    return PlanRefused(
        "plan refused: no runnable candidate remains: " + "; ".join(problems), problems, refused
    )


def frozen_protocol(policy: Policy, learned: LearnedSpread | None) -> MeasureProtocol:
    """The policy's protocol as the plan freezes it: with this home's learned spread where the
    policy asks to learn it and one is known."""
    if policy.protocol.learn_spread and learned is not None:
        return policy.protocol.model_copy(update={"learned_spread": learned})
    return policy.protocol


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
    """The thresholds a plan is judged by, strictest-of: the policy's defaults, what the plan
    asks (clamped to the policy's range, and only ever tightening), then each manifest's own
    bar. Every move is appended to ``changes`` with its reason."""
    bounds = policy.thresholds
    asked = plan.acceptance
    speed = bounds.min_speedup_pct.default
    memory = bounds.max_peak_memory_gb.default
    if asked and asked.min_speedup_pct is not None:
        speed = asked_speedup(asked.min_speedup_pct, bounds.min_speedup_pct, changes)
    if asked and asked.max_peak_memory_gb is not None:
        memory = asked_memory(
            asked.max_peak_memory_gb, bounds.max_peak_memory_gb, live_peak, changes
        )
    for manifest in manifests:
        speed, memory = manifest_bars(manifest, speed, memory, changes)
    return EffectiveThresholds(
        min_speedup_pct=speed,
        max_peak_memory_gb=memory,
        max_error_rate=bounds.max_error_rate,
        worst_prompt_tolerance_pct=bounds.worst_prompt_tolerance_pct,
        quality_budget=bounds.quality_budget,
    )


def asked_speedup(asked: float, bounds: Bounded, changes: list[PlanChange]) -> float:
    """The minimum speedup a plan asks for, kept only where it is stricter than the policy's."""
    speed = bounds.default
    value, clamp = _clamped(asked, bounds)
    if value < speed:
        why = f"a plan can only tighten the policy's minimum speedup of {speed}%, which stays"
        changes.append(_change("min_speedup_pct", "kept", speed, why, clamp))
        return speed
    if value > speed or clamp:
        why = "the plan asks for a stricter speedup" if value > speed else "the policy's own"
        changes.append(_change("min_speedup_pct", "tightened", value, why, clamp))
    return value


def asked_memory(
    asked: float, bounds: Bounded, live_peak: float | None, changes: list[PlanChange]
) -> float:
    """The memory cap a plan asks for, kept only where it is stricter than the policy's and
    does not disqualify the running baseline (its measured peak)."""
    memory = bounds.default
    value, clamp = _clamped(asked, bounds)
    if live_peak is not None and value < live_peak:
        why = (
            f"a cap below the running baseline's measured peak ({live_peak:.2f} GB) would "
            f"disqualify it; the policy's {memory} GB stays"
        )
        changes.append(  # refused, clamped or not: the cap would disqualify the baseline
            PlanChange(
                field="acceptance.max_peak_memory_gb",
                action="refused",
                value=value,
                reason=clamp + why,
            )
        )
        return memory
    if value > memory:
        why = f"a plan can only tighten the policy's memory cap of {memory} GB, which stays"
        changes.append(_change("max_peak_memory_gb", "kept", memory, why, clamp))
        return memory
    if value < memory or clamp:
        why = "the plan asks for a stricter memory cap" if value < memory else "the policy's own"
        changes.append(_change("max_peak_memory_gb", "tightened", value, why, clamp))
    return value


def manifest_bars(
    manifest: Manifest, speed: float, memory: float, changes: list[PlanChange]
) -> tuple[float, float]:
    """A manifest's own minimum speedup and memory cap, where stricter than what stands."""
    if manifest.min_speedup_pct is not None and manifest.min_speedup_pct > speed:
        speed = manifest.min_speedup_pct
        why = f"manifest {manifest.id} requires it"
        changes.append(
            PlanChange(
                field="thresholds.min_speedup_pct", action="tightened", value=speed, reason=why
            )
        )
    if manifest.max_peak_memory_gb is not None and manifest.max_peak_memory_gb < memory:
        memory = manifest.max_peak_memory_gb
        why = f"manifest {manifest.id} caps it"
        changes.append(
            PlanChange(
                field="thresholds.max_peak_memory_gb", action="tightened", value=memory, reason=why
            )
        )
    return speed, memory
