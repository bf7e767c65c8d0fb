"""Class-based promotion: a qualified KV-cache candidate awaits approval; `mcp-infra approve`
promotes it after a fresh online verification on real servers, and refuses stale approvals.

The cycle's greedy outputs are real (read from a real live mlx_lm.server and a real candidate on
its own port); only its timing samples are fixed numbers (see tests/helpers/synthetic_bundle.py),
so that the candidate qualifies on speed deterministically on a busy 2-core machine.
"""

from __future__ import annotations

import json

import pytest

from mcp_infra.contracts import CandidateRun, Decision, Outcome
from mcp_infra.core.preflight import find_candidate
from mcp_infra.faces import cli
from mcp_infra.flows.approve import ApprovalRefused, approve
from mcp_infra.procs.service import ensure_serving, start_candidate, stop_candidate
from mcp_infra.state import evidence, memory
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_registry
from mcp_infra.state.context import active_recipe, load_config
from mcp_infra.state.store import Home
from tests.helpers.synthetic_bundle import baseline_run, freeze, real_greedy, seal, timing

KV8 = "demo-tiny:kv8"


def test_awaiting_approval_then_approve_after_online_verification(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(home)
    ensure_serving(home, active_recipe(home), config, timeout=120)
    plan = freeze(home, [KV8])
    assert plan.auto_promote["kv_cache"] is False
    base_greedy = real_greedy(f"http://127.0.0.1:{config.port}", "baseline", plan)
    manifest, variant = find_candidate(load_registry(), KV8)
    recipe = resolve_recipe(manifest, variant, home.models, home.hf_cache)
    record = start_candidate(home, recipe, config, cycle_id="measure", timeout=120)
    try:
        kv_greedy = real_greedy(f"http://127.0.0.1:{record.port}", KV8, plan)
    finally:
        stop_candidate(home, record)
    assert not [s.error for s in base_greedy + kv_greedy if s.error]
    summary = seal(
        home,
        plan,
        baseline_run(plan, base_greedy),
        [
            CandidateRun(
                candidate=KV8, samples=timing(KV8, plan, 13.0), greedy=kv_greedy, peak_memory_gb=0.2
            )
        ],
    )
    assert summary.outcome == Outcome.KEPT_BASELINE
    assert "qualified, awaiting approval: demo-tiny:kv8" in summary.reason

    # refusals come before anything is touched
    with pytest.raises(ApprovalRefused, match="was not measured"):
        approve(home, summary.cycle_id, "demo-tiny:draft-k2")
    with pytest.raises(ApprovalRefused, match="no sealed evidence"):
        approve(home, "c-20000101-000000-000000")

    assert cli.main(["--home", str(home.root), "approve", summary.cycle_id, "--json"]) == 0
    approved = json.loads(capsys.readouterr().out)
    assert approved["outcome"] == "promoted" and approved["selected"] == KV8
    assert approved["reason"].startswith(f"approved by a person from cycle {summary.cycle_id}")
    assert active_recipe(home).candidate_id == KV8
    bundle = evidence.bundle_path(home, approved["cycle_id"])
    assert evidence.verify(bundle).ok
    journal = [json.loads(line)["state"] for line in (bundle / "journal.ndjson").open()]
    assert [s for s in journal if s in ("PROMOTE", "VERIFY", "COMMIT", "ROLLBACK")] == [
        "PROMOTE",
        "VERIFY",
        "VERIFY",
        "COMMIT",
        "COMMIT",
    ]  # verified on its own port, committed,
    # then the front switched to it
    # remembered as approved and promoted
    last = memory.outcomes(home, KV8)[-1]
    assert last.cycle_id == approved["cycle_id"] and last.selected
    assert last.decision == Decision.QUALIFIED

    # a second approval of the same cycle is stale: the live recipe is no longer its baseline
    with pytest.raises(ApprovalRefused, match="the live recipe is demo-tiny:kv8"):
        approve(home, summary.cycle_id)
