"""Plan parsing and sanitization: untrusted input in, a frozen plan or a clear refusal out."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from mcp_infra.contracts import BASELINE_ID, MAX_PLAN_CANDIDATES, Plan, Recipe
from mcp_infra.core.preflight import HostFacts, find_candidate, preflight, registry_hash
from mcp_infra.core.sanitize import (
    PlanContext,
    PlanRefused,
    parse_plan,
    plan_content_hash,
    policy_hash,
    sanitize,
)
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_policy, load_registry

MANIFESTS = load_registry()
POLICY = load_policy("demo")
FACTS = HostFacts(
    platform="linux-x86_64",
    packages={"mlx-lm": "0.32.2", "mlx": "0.32.4"},
    memory_gb=23.0,
    free_disk_gb=50.0,
    available_artifacts=["demo:target", "demo:draft"],
)
LIVE = Recipe(candidate_id="demo-tiny:target", template="mlx_lm_server", model_path="/m/target")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _checks(facts: HostFacts = FACTS) -> dict:
    out = {}
    for manifest in MANIFESTS.values():
        for variant in manifest.variants:
            out[f"{manifest.id}:{variant.id}"] = preflight(manifest, variant, POLICY, facts)
    return out


def freeze(
    raw: object,
    *,
    live_peak: float | None = None,
    facts: HostFacts = FACTS,
    live: Recipe = LIVE,
    skip: dict[str, str] | None = None,
):
    plan = parse_plan(raw)
    recipes = {}
    for cid in _checks(facts):
        manifest, variant = find_candidate(MANIFESTS, cid)  # type: ignore[misc]
        from pathlib import Path

        recipes[cid] = resolve_recipe(manifest, variant, Path("/m"))
    context = PlanContext(
        manifests=MANIFESTS,
        policy=POLICY,
        preflights=_checks(facts),
        live_recipe=live,
        registry_hash=registry_hash(MANIFESTS),
        policy_hash=policy_hash(POLICY),
        live_peak_memory_gb=live_peak,
        candidate_recipes=recipes,
        skip=skip or {},
    )
    return sanitize(plan, context, proposed_by="test", now=NOW)


def test_baseline_first_duplicates_dropped_and_every_change_explained() -> None:
    frozen = freeze(
        {
            "hypothesis": "drafts help",
            "candidates": ["demo-tiny:draft-k4", "baseline", "demo-tiny:draft-k4"],
        }
    )
    assert frozen.candidates == [BASELINE_ID, "demo-tiny:draft-k4"]
    reasons = {(c.action, c.value): c.reason for c in frozen.changes}
    assert ("removed", BASELINE_ID) in reasons
    assert reasons[("removed", "demo-tiny:draft-k4")] == "duplicate candidate dropped"
    assert frozen.content_hash == plan_content_hash(frozen)
    assert frozen.plan_id.startswith("p-20261129-120000-")


def test_unknown_and_malformed_ids_are_refused_without_echoing_them() -> None:
    frozen = freeze(
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2", "demo-tiny:nope", "$(rm -rf /); echo pwned"],
        }
    )
    assert frozen.candidates == [BASELINE_ID, "demo-tiny:draft-k2"]
    refused = {r.id: r.reason for r in frozen.refused}
    assert refused["demo-tiny:nope"] == "not a candidate of the registry"
    assert "<candidate #3: not a well-formed id>" in refused
    assert "rm -rf" not in json.dumps(frozen.model_dump(mode="json")["refused"])


def test_a_plan_with_nothing_runnable_is_refused() -> None:
    with pytest.raises(PlanRefused, match="no runnable candidate"):
        freeze({"hypothesis": "x", "candidates": ["nope:nope", "baseline"]})


def test_the_live_recipe_proposed_as_a_candidate_is_refused_with_the_reason() -> None:
    manifest, variant = find_candidate(MANIFESTS, "demo-tiny:draft-k2")  # type: ignore[misc]
    from pathlib import Path

    live = resolve_recipe(manifest, variant, Path("/m"))
    frozen = freeze(
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2", "demo-tiny:draft-k4"]}, live=live
    )
    assert frozen.candidates == [BASELINE_ID, "demo-tiny:draft-k4"]
    assert [(r.id, r.reason) for r in frozen.refused] == [
        (
            "demo-tiny:draft-k2",
            "it is the live recipe (it serves now and is measured first, as the baseline)",
        )
    ]
    with pytest.raises(PlanRefused, match="demo-tiny:draft-k2: it is the live recipe"):
        freeze({"hypothesis": "x", "candidates": ["demo-tiny:draft-k2"]}, live=live)


@pytest.mark.parametrize(
    "acceptance",
    [
        {"min_speedup_pct": 10_000.0},
        {"min_speedup_pct": -50.0},
        {"max_peak_memory_gb": 10_000.0},
        {"max_peak_memory_gb": -3.0},
        {"min_speedup_pct": 1.0, "max_peak_memory_gb": 64.0},
    ],
)
def test_one_change_per_acceptance_field_that_says_it_all(acceptance: dict[str, float]) -> None:
    """A value outside the policy's range gets one change: clamped, and what came of it (taken,
    or the policy's value kept), never two that contradict each other."""
    frozen = freeze(
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2"], "acceptance": acceptance}
    )
    for field in acceptance:
        changes = [c for c in frozen.changes if c.field == f"acceptance.{field}"]
        assert len(changes) == 1, changes
        (change,) = changes
        assert change.value == getattr(frozen.thresholds, field), change
        bounds = getattr(POLICY.thresholds, field)
        if not bounds.low <= acceptance[field] <= bounds.high:
            assert change.action == "clamped" and change.reason.startswith(
                "clamped to the policy's range"
            )


def test_preflight_failure_refuses_the_candidate_with_its_reasons() -> None:
    facts = FACTS.model_copy(update={"available_artifacts": ["demo:target"]})
    frozen = freeze(
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2", "demo-tiny:kv8"]}, facts=facts
    )
    assert frozen.candidates == [BASELINE_ID, "demo-tiny:kv8"]
    (refused,) = frozen.refused
    assert refused.id == "demo-tiny:draft-k2" and "missing locally: demo:draft" in refused.reason


def test_recipe_memory_skip_refuses_with_the_given_reason() -> None:
    frozen = freeze(
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2", "demo-tiny:draft-k4"]},
        skip={"demo-tiny:draft-k2": "failed the lossless gate before"},
    )
    assert [r.reason for r in frozen.refused] == ["failed the lossless gate before"]


@pytest.mark.parametrize(
    ("asked", "expected", "action"),
    [
        (50.0, 50.0, "tightened"),  # stricter than the policy: taken
        (1.0, 5.0, "kept"),  # looser than the policy's 5%: the policy stays
        (-50.0, 5.0, "clamped"),  # outside the policy's range: clamped, then kept
        (10_000.0, 200.0, "clamped"),  # above the range: clamped to its top
    ],
)
def test_speedup_threshold_can_only_tighten(asked: float, expected: float, action: str) -> None:
    frozen = freeze(
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"min_speedup_pct": asked},
        }
    )
    assert frozen.thresholds.min_speedup_pct == expected
    assert action in {c.action for c in frozen.changes if "min_speedup_pct" in c.field}


def test_memory_cap_tightens_but_never_disqualifies_the_running_baseline() -> None:
    tight = freeze(
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"max_peak_memory_gb": 2.0},
        },
        live_peak=0.5,
    )
    assert tight.thresholds.max_peak_memory_gb == 2.0
    below = freeze(
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"max_peak_memory_gb": 0.2},
        },
        live_peak=0.5,
    )
    assert below.thresholds.max_peak_memory_gb == POLICY.thresholds.max_peak_memory_gb.default
    assert any(c.action == "refused" and "disqualify" in c.reason for c in below.changes)
    looser = freeze(
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"max_peak_memory_gb": 15.0},
        }
    )
    assert looser.thresholds.max_peak_memory_gb == POLICY.thresholds.max_peak_memory_gb.default


@pytest.mark.parametrize(
    "raw",
    [
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2"], "command": "rm -rf /"},
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2"], "acceptance": {"argv": ["sh"]}},
        {"hypothesis": "x", "candidates": []},
        {"hypothesis": "x", "candidates": [f"a:b{i}" for i in range(MAX_PLAN_CANDIDATES + 1)]},
        {"hypothesis": "x" * 301, "candidates": ["demo-tiny:draft-k2"]},
        {"hypothesis": "two\nlines", "candidates": ["demo-tiny:draft-k2"]},
        {"hypothesis": "x", "candidates": ["demo-tiny:draft-k2"], "notes": "n" * 2001},
        {"hypothesis": "x", "candidates": "demo-tiny:draft-k2"},
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"min_speedup_pct": math.nan},
        },
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"max_peak_memory_gb": math.inf},
        },
        {
            "hypothesis": "x",
            "candidates": ["demo-tiny:draft-k2"],
            "acceptance": {"min_speedup_pct": "5; reboot"},
        },
        "not json {",
        "[1, 2, 3]",
        "x" * 20_000,
        42,
        None,
    ],
)
def test_malformed_plans_are_refused_with_our_own_message(raw: object) -> None:
    with pytest.raises(PlanRefused) as info:
        parse_plan(raw)
    message = str(info.value)
    assert message.startswith("plan refused")
    for secret in ("rm -rf", "reboot", "nnnnnnnnnn", "xxxxxxxxxx"):
        assert secret not in message


def test_plan_as_json_string_is_accepted() -> None:
    plan = parse_plan(json.dumps({"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"]}))
    assert plan == Plan(hypothesis="h", candidates=["demo-tiny:draft-k2"])


def test_frozen_plan_hash_changes_with_any_field() -> None:
    a = freeze({"hypothesis": "a", "candidates": ["demo-tiny:draft-k2"]})
    b = freeze({"hypothesis": "b", "candidates": ["demo-tiny:draft-k2"]})
    assert a.content_hash != b.content_hash and a.plan_id != b.plan_id


# ------------------------------------------------------------------ issue 10: drift tolerance


def test_shipped_policies_load_with_drift_tolerance_below_the_speedup() -> None:
    from mcp_infra.state.catalog import load_policy

    for name in ("default", "demo"):
        policy = load_policy(name)
        assert policy.protocol.drift_tolerance_pct < policy.thresholds.min_speedup_pct.default


@pytest.mark.parametrize("tolerance", [5.0, 10.0])
def test_policy_with_drift_tolerance_not_below_the_speedup_is_refused(tolerance: float) -> None:
    import yaml
    from pydantic import ValidationError

    from mcp_infra.contracts import Policy
    from mcp_infra.state.catalog import policy_dir

    data = yaml.safe_load((policy_dir() / "default.yaml").read_text(encoding="utf-8"))
    data["protocol"]["drift_check"] = True
    data["protocol"]["drift_tolerance_pct"] = tolerance
    with pytest.raises(ValidationError) as info:
        Policy.model_validate(data)
    assert "drift_tolerance_pct" in str(info.value) and "must be below" in str(info.value)
    data["protocol"]["drift_tolerance_pct"] = 4.9
    assert Policy.model_validate(data).protocol.drift_tolerance_pct == 4.9


def test_default_policy_runs_the_protocol_the_decision_benchmark_validates() -> None:
    """benchmarks/decision_quality.py checks its targets with ``MeasureProtocol()``'s confidence and
    starts; real services run under the default policy, so it must use the same (the demo,
    with large effects and a wall time that matters, keeps fewer starts)."""
    from mcp_infra.contracts import MeasureProtocol
    from mcp_infra.state.catalog import load_policy

    shipped, validated = load_policy("default").protocol, MeasureProtocol()
    assert (shipped.confidence, shipped.min_starts, shipped.max_starts) == (
        validated.confidence,
        validated.min_starts,
        validated.max_starts,
    )
    assert validated.max_starts >= 13
