"""Property-based fuzzing of the plan path: anything an agent sends ends as a valid frozen plan
or a clear refusal — never a crash, a foreign candidate, or a looser threshold.

The default suite runs a few hundred examples; `benchmarks/fuzz_plans.py` runs 10,000+
(`MCP_INFRA_FUZZ_EXAMPLES` sets the count here too).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import BASELINE_ID, FrozenPlan, Recipe
from mcp_infra.core.preflight import (
    HostFacts,
    all_candidates,
    find_candidate,
    preflight,
    registry_hash,
)
from mcp_infra.core.sanitize import (
    PlanContext,
    PlanRefused,
    parse_plan,
    policy_hash,
    sanitize,
    shown_name,
)
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_policy, load_registry

EXAMPLES = int(os.environ.get("MCP_INFRA_FUZZ_EXAMPLES", "300"))
MANIFESTS = load_registry()
POLICY = load_policy("demo")
IDS = all_candidates(MANIFESTS)
FACTS = HostFacts(
    platform="linux-x86_64",
    packages={"mlx-lm": "0.32.2", "mlx": "0.32.4", "mlx-vlm": "0.7.10"},
    memory_gb=23.0,
    free_disk_gb=50.0,
    available_artifacts=["demo:target", "demo:draft"],
)
CHECKS = {
    f"{m.id}:{v.id}": preflight(m, v, POLICY, FACTS) for m in MANIFESTS.values() for v in m.variants
}
RECIPES = {
    cid: resolve_recipe(*find_candidate(MANIFESTS, cid), Path("/m"))  # type: ignore[misc]
    for cid in IDS
}
LIVE = Recipe(candidate_id="demo-tiny:target", template="mlx_lm_server", model_path="/m/target")
NASTY = [
    "",
    "baseline",
    "$(reboot)",
    "; rm -rf /",
    "`id`",
    "../../etc/passwd",
    "a:b",
    "A:B",
    "demo-tiny:",
    ":draft-k2",
    "demo-tiny:draft-k2\n",
    "\x00",
    "é:ü",
    "x" * 200,
    "--trust-remote-code",
    "demo-tiny:draft-k2 --port 1",
]

candidate_ids = st.one_of(st.sampled_from(IDS), st.sampled_from(NASTY), st.text(max_size=140))
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**9), 10**9),
    st.text(max_size=10),
    st.none(),
    st.booleans(),
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=50))
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)

plans = st.fixed_dictionaries(
    {
        "hypothesis": st.one_of(st.text(max_size=400), json_any),
        "candidates": st.one_of(st.lists(candidate_ids, max_size=5), json_any),
    },
    optional={
        "acceptance": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "min_speedup_pct": numbers,
                    "max_peak_memory_gb": numbers,
                    "surprise": json_any,
                },
            ),
            json_any,
        ),
        "notes": st.one_of(st.text(max_size=2100), json_any),
        "argv": json_any,
        "template": st.text(max_size=20),
    },
)
# Plans that are well formed except for what is being probed: most reach sanitization.
one_line = st.text(
    st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=300,
)
bounded = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
near_valid = st.fixed_dictionaries(
    {
        "hypothesis": one_line,
        "candidates": st.lists(
            st.one_of(st.sampled_from(IDS), st.sampled_from(NASTY)), min_size=1, max_size=3
        ),
    },
    optional={
        "acceptance": st.fixed_dictionaries(
            {}, optional={"min_speedup_pct": bounded, "max_peak_memory_gb": bounded}
        ),
        "notes": st.text(max_size=300),
    },
)
inputs = st.one_of(
    near_valid,
    near_valid,
    near_valid.map(json.dumps),
    plans,
    plans.map(json.dumps),
    json_any,
    st.text(max_size=300),
)


def freeze(raw: object) -> FrozenPlan:
    context = PlanContext(
        manifests=MANIFESTS,
        policy=POLICY,
        preflights=CHECKS,
        live_recipe=LIVE,
        registry_hash=registry_hash(MANIFESTS),
        policy_hash=policy_hash(POLICY),
        live_peak_memory_gb=0.3,
        candidate_recipes=RECIPES,
    )
    now = datetime(2026, 11, 29, tzinfo=UTC)
    return sanitize(parse_plan(raw), context, proposed_by="fuzz", now=now)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(inputs)
def test_any_input_freezes_validly_or_is_refused(raw: object) -> None:
    try:
        frozen = freeze(raw)
    except PlanRefused as exc:
        message = str(exc)
        assert message.startswith("plan refused") and len(message) < 2000
        if isinstance(raw, dict):  # an invented key is named only if it is a plain word
            invented = [
                k
                for k in raw
                if k not in {"hypothesis", "candidates", "acceptance", "notes"}
                and len(k) > 3
                and shown_name(k) != k
            ]
            # A key may only appear where the same refusal for unnamed keys says it anyway
            # (a key "miss" is inside "required field is missing").
            unnamed = {(f"k{i}" if k in invented else k): v for i, (k, v) in enumerate(raw.items())}
            with pytest.raises(PlanRefused) as again:
                freeze(unnamed)
            assert not any(k in message and k not in str(again.value) for k in invented)
        return
    assert frozen.candidates[0] == BASELINE_ID
    rest = frozen.candidates[1:]
    assert 1 <= len(rest) <= 3 and len(set(rest)) == len(rest)
    assert set(rest) <= set(IDS), "no candidate outside the registry"
    limits = POLICY.thresholds
    assert frozen.thresholds.min_speedup_pct >= limits.min_speedup_pct.default
    assert frozen.thresholds.min_speedup_pct <= limits.min_speedup_pct.high
    assert frozen.thresholds.max_peak_memory_gb <= limits.max_peak_memory_gb.default
    assert frozen.thresholds.max_peak_memory_gb >= 0.3, "never a cap below the live baseline"
    assert FrozenPlan.model_validate_json(frozen.model_dump_json()) == frozen
    for refused in frozen.refused:
        assert len(refused.id) <= 130 and "\n" not in refused.id
