"""Recipe memory: outcomes remembered per manifest hash and environment; a gate failure is
skipped deterministically until something changes; the registry shows what was learned."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import CandidateRun, Decision
from mcp_infra.core.sanitize import PlanRefused
from mcp_infra.flows import api as app
from mcp_infra.state import memory
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.store import Home
from tests.helpers.synthetic_bundle import (
    baseline_run,
    freeze,
    greedy_ids,
    prompts,
    seal,
    timing,
    write_manifest,
)

BAD, SLOW = "mytiny:draft-k4-cache", "mytiny:draft-k2"


def failed_cycle(home: Home) -> str:
    """A sealed cycle: BAD is fast but diverges from the baseline's greedy output (lossless gate
    fails); SLOW is lossless but slower (rejected for speed, no gate failed)."""
    plan = freeze(home, [BAD, SLOW])
    ids = {pid: list(range(1, 17)) for pid in prompts(plan)}
    first = prompts(plan)[0]
    diverged = {**ids, first: [*ids[first][:5], 99, *ids[first][6:]]}
    base = baseline_run(plan, greedy_ids("baseline", plan, ids))
    runs = [
        CandidateRun(
            candidate=BAD,
            samples=timing(BAD, plan, 14.0),
            greedy=greedy_ids(BAD, plan, diverged),
            peak_memory_gb=0.3,
        ),
        CandidateRun(
            candidate=SLOW,
            samples=timing(SLOW, plan, 8.0),
            greedy=greedy_ids(SLOW, plan, ids),
            peak_memory_gb=0.3,
        ),
    ]
    return seal(home, plan, base, runs).cycle_id


def test_failure_is_remembered_skipped_and_reset_by_a_manifest_change(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_manifest(home)
    cycle_id = failed_cycle(home)

    # remembered at sealing, per manifest hash and environment
    remembered = {o.candidate: o for o in memory.outcomes(home)}
    assert (home.memory / f"{cycle_id}.json").is_file()
    bad, slow = remembered[BAD], remembered[SLOW]
    assert bad.decision == Decision.REJECTED and slow.decision == Decision.REJECTED
    assert [g.gate for g in bad.gates if not g.passed] == ["lossless"]
    assert bad.manifest_hash and bad.environment_key and bad.policy_hash
    assert bad.speedup_estimate and bad.speedup_estimate > 1.3  # fast, yet not lossless
    assert not [g for g in slow.gates if not g.passed]

    # the gate failure is skipped, deterministically, and the plan says why
    views = [
        app.propose(
            home,
            {"hypothesis": "again", "candidates": [BAD, SLOW]},
            proposed_by="test",
            dry_run=True,
        )
        for _ in range(2)
    ]
    volatile = {"plan_id", "plan_hash"}  # they include the time of freezing
    assert views[0].model_dump(exclude=volatile) == views[1].model_dump(exclude=volatile)
    view = views[0]
    assert view.accepted and view.candidates == ["baseline", SLOW]  # slow is measured again
    (refused,) = view.refused
    assert refused.id == BAD
    assert refused.reason.startswith(
        f"skipped by recipe memory: it failed the lossless gate in cycle {cycle_id} ("
    )
    assert any(
        c.action == "removed" and c.value == BAD and c.reason == refused.reason
        for c in view.changes
    )
    only_bad = app.propose(
        home, {"hypothesis": "again", "candidates": [BAD]}, proposed_by="test", dry_run=True
    )
    assert not only_bad.accepted and "skipped by recipe memory" in only_bad.problems[0]

    # the registry (and so the MCP tool) shows what was learned and why it would be skipped
    registry = {c.id: c for c in app.registry_view(home).candidates}
    assert registry[BAD].skip == refused.reason
    (learned,) = registry[BAD].learned
    assert learned.cycle_id == cycle_id and learned.current
    assert learned.failed_gates[0].startswith("lossless: ")
    assert registry[SLOW].skip is None and registry[SLOW].learned[0].decision == "rejected"

    # another environment (here: another mlx-vlm) is a change: it may run again.
    # Stand-in, and why: installing a second mlx-vlm version inside a test is not possible
    # offline; the detected environment is the real one with one version changed.
    real = memory.environment()
    monkeypatch.setattr(memory, "environment", lambda: {**real, "mlx-vlm": "99.0"})
    assert memory.skips(home, {BAD: registry_recipe(home, BAD)}, *policy_and_hash(home)) == {}
    monkeypatch.setattr(memory, "environment", lambda: real)

    # editing the manifest changes its hash: the skip is reset
    write_manifest(home, description="a copy of demo-tiny, with a fixed drafter")
    again = app.propose(
        home, {"hypothesis": "fixed", "candidates": [BAD]}, proposed_by="test", dry_run=True
    )
    assert again.accepted and again.candidates == ["baseline", BAD], again
    registry = {c.id: c for c in app.registry_view(home).candidates}
    assert registry[BAD].skip is None and not registry[BAD].learned[0].current


def test_a_bundle_sealed_without_memory_is_read_from_the_bundle(home: Home) -> None:
    write_manifest(home)
    cycle_id = failed_cycle(home)
    recorded = {o.candidate: o.model_dump() for o in memory.outcomes(home)}
    (home.memory / f"{cycle_id}.json").unlink()  # a crash between sealing and recording
    assert {o.candidate: o.model_dump() for o in memory.outcomes(home)}.keys() == recorded.keys()
    assert not app.propose(
        home, {"hypothesis": "x", "candidates": [BAD]}, proposed_by="test", dry_run=True
    ).accepted
    first = memory.record(home, cycle_id)  # recording later is idempotent
    assert first is not None
    written = (home.memory / f"{cycle_id}.json").read_bytes()
    assert {o.candidate: o.model_dump() for o in memory.outcomes(home)} == recorded
    again = memory.record(home, cycle_id)
    assert again == first and (home.memory / f"{cycle_id}.json").read_bytes() == written


def test_a_policy_without_recipe_memory_judges_a_failed_candidate_again(home: Home) -> None:
    """The demo's policy: every demo judges every candidate afresh, though its home keeps the
    earlier demos' bundles (for the start-to-start spread they teach)."""
    write_manifest(home)
    cycle_id = failed_cycle(home)
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "recipe_memory": False}))
    policy, digest = policy_and_hash(home)
    assert policy.recipe_memory is False
    assert memory.skips(home, {BAD: registry_recipe(home, BAD)}, policy, digest) == {}
    view = app.propose(
        home, {"hypothesis": "again", "candidates": [BAD]}, proposed_by="test", dry_run=True
    )
    assert view.accepted and view.candidates == ["baseline", BAD], view
    assert [o.cycle_id for o in memory.outcomes(home, BAD)] == [cycle_id]  # still remembered
    path.write_text(yaml.safe_dump(data))  # on again: skipped again
    assert BAD in memory.skips(home, {BAD: registry_recipe(home, BAD)}, *policy_and_hash(home))


def registry_recipe(home: Home, cid: str):
    from mcp_infra.core.preflight import find_candidate
    from mcp_infra.state.artifacts import resolve_recipe
    from mcp_infra.state.catalog import load_registry

    manifest, variant = find_candidate(load_registry(extra=home.user_registry), cid)
    return resolve_recipe(manifest, variant, home.models, home.hf_cache)


def policy_and_hash(home: Home):
    from mcp_infra.core.sanitize import policy_hash
    from mcp_infra.state.catalog import load_policy

    policy = load_policy("test", extra=home.user_policy)
    return policy, policy_hash(policy)


def test_freeze_refuses_when_every_candidate_is_skipped(home: Home, tmp_path: Path) -> None:
    write_manifest(home)
    failed_cycle(home)
    with pytest.raises(PlanRefused, match="no runnable candidate remains"):
        freeze(home, [BAD])


def test_the_watcher_lets_queued_plans_wait_for_the_window(home: Home) -> None:
    """Queued plans wait for the window: the watcher sleeps its interval, then stops when told."""
    from mcp_infra.flows.watch import watch

    write_manifest(home)
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["window"] = {"mode": "never"}
    path.write_text(yaml.safe_dump(data))
    app.propose(
        home, {"hypothesis": "h", "candidates": [SLOW]}, proposed_by="test", start_supervisor=False
    )
    slept: list[float] = []
    lines: list[str] = []
    assert watch(home, interval_s=60, max_looks=2, sleep=slept.append, log=lines.append) == []
    assert slept == [60] and len(home.queued()) == 1
    assert any("queued plans wait: the policy's window is 'never'" in line for line in lines)


def test_a_gate_failed_beside_unanswered_requests_is_not_held_against_the_recipe(
    home: Home,
) -> None:
    """A candidate whose server died mid-run (an OOM kill, a dead rank) fails the lossless gate
    by the requests it never answered: recipe memory records how many, and does not skip it."""
    write_manifest(home)
    plan = freeze(home, [BAD])
    ids = {pid: list(range(1, 17)) for pid in prompts(plan)}
    greedy = greedy_ids(BAD, plan, ids)
    dead = "server process exited with code -9 before answering"
    greedy = [greedy[0].model_copy(update={"error": dead, "token_ids": None}), *greedy[1:]]
    run = CandidateRun(
        candidate=BAD, samples=timing(BAD, plan, 14.0), greedy=greedy, peak_memory_gb=0.3
    )
    base = baseline_run(plan, greedy_ids("baseline", plan, ids))
    seal(home, plan, base, [run])
    (bad,) = memory.outcomes(home, BAD)
    assert [g.gate for g in bad.gates if not g.passed] == ["lossless"]
    assert "candidate request failed" in next(g.detail for g in bad.gates if g.gate == "lossless")
    assert bad.failed_requests == 1
    assert memory.skip_reason(bad, load_policy("default")) is None
    # the same gate failed on answers that were given and differ: held against the recipe
    judged = bad.model_copy(update={"failed_requests": 0})
    assert "failed the lossless gate" in (memory.skip_reason(judged, load_policy("default")) or "")
    view = app.propose(home, {"hypothesis": "again", "candidates": [BAD]}, dry_run=True)
    assert view.accepted, view
