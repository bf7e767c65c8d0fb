"""The measurement protocol in whole cycles on real parts: fresh server starts per configuration
in interleaved rounds, workload cells at 1 and 4 concurrent requests, the held-out check of the
winner, a policy where 4 concurrent requests decide, and an A/A cycle with the drift check on.

Promotion, where a test needs it, comes from the policy (any measured gain qualifies), not from
the machine's speed.
"""

from __future__ import annotations

import pytest
import yaml

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CycleSummary,
    DsseEnvelope,
    InTotoStatement,
    Outcome,
    Verdict,
)
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, write_test_policy
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence, signing
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home, read_model
from tests.helpers.faultkit import until_not_kept
from tests.helpers.paths import DATA

pytestmark = pytest.mark.slow

SHORT_1 = {"request_class": "short", "concurrency": 1, "role": "decisive"}
SHORT_4 = {"request_class": "short", "concurrency": 4, "role": "reported"}

AA_MANIFEST = (DATA / "demo-aa.yaml").read_text()


def policy(home: Home, **protocol: object) -> None:
    """The demo policy, small enough for a 2-core machine, as the home's `test` policy."""
    write_test_policy(
        home,
        thresholds={"min_speedup_pct": {"default": 0.0, "low": 0.0, "high": 200.0}},
        lean=False,
        **{
            # two short prompts and one held-out (the test homes' suite): what these cycles
            # assert is how they measure, not a figure that needs demo-speed's four
            "suite": "test-speed",
            "repeats": 1,
            "warmup": 1,
            "max_tokens": 32,
            "bootstrap_resamples": 500,
            "ready_timeout_s": 120,
            "request_timeout_s": 60,
            # three starts at 60% confidence: two starts cannot decide (see conftest)
            "min_starts": 3,
            "max_starts": 3,
            "confidence": 0.6,
            "workload": [SHORT_1, SHORT_4],
            **protocol,
        },
    )


def run_cycle(home: Home, candidates: list[str]) -> tuple[CycleSummary, Verdict, dict]:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    view = app.propose(
        home,
        {"hypothesis": "measured as the user's workload", "candidates": candidates},
        start_supervisor=False,
    )
    assert view.accepted, view
    (summary,) = supervise(home)
    bundle = evidence.bundle_path(home, summary.cycle_id)
    assert evidence.verify(bundle).ok, evidence.verify(bundle).problems
    runs = {p.name: read_model(p, CandidateRun) for p in (bundle / "runs").glob("*.json")}
    return summary, read_model(bundle / "verdict.json", Verdict), runs


def test_every_configuration_runs_in_fresh_interleaved_starts_and_the_winner_holds_out(
    home: Home,
) -> None:
    # One timed request per held-out prompt: the check still runs in a fresh start per side on
    # prompts selection never saw, and is judged (the derived default here is 6).
    policy(home, heldout_repeats=1)
    path = home.user_policy / "test.yaml"  # a winner by policy: any measured gain qualifies
    data = yaml.safe_load(path.read_text())
    data["thresholds"].update(PROMOTE_ANY_GAIN)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # The promotion and held-out check below need a winner (the demo drafter was once left
    # inconclusive over three starts, on a machine its own load reading called quiet).
    summary, verdict, runs = until_not_kept(lambda: run_cycle(home, ["demo-tiny:draft-k2"]))
    baseline, cand = runs["baseline.json"], runs["demo-tiny__draft-k2.json"]
    # At least two fresh processes per configuration, the baseline recipe included.
    assert baseline.starts >= 2 and cand.starts >= 2
    assert {s.start for s in baseline.samples if s.phase == "measure"} == {0, 1, 2}
    assert {s.start for s in cand.samples if s.phase == "measure"} == {0, 1, 2}
    # Interleaved: the baseline opens round 0 and closes round 1.
    order = {(r.round, r.config): r.position for r in baseline.rounds + cand.rounds}
    assert order[(0, BASELINE_ID)] == 0 and order[(1, BASELINE_ID)] == 1
    assert order[(0, "demo-tiny:draft-k2")] == 1 and order[(1, "demo-tiny:draft-k2")] == 0
    ports = {r.port for r in baseline.rounds + cand.rounds}
    assert len(baseline.rounds) == 3 and all(r.ended_at >= r.started_at for r in baseline.rounds)
    assert load_config(home).port not in ports  # measured beside the live service, not on it
    # the live service is served through the front: each round records its live traffic
    assert all(r.live_requests is not None and r.live_requests >= 0 for r in baseline.rounds)
    assert cand.stopped  # why measuring it ended is recorded
    # Samples carry their cell, start, round and send time.
    timed = [s for s in cand.samples if s.phase == "measure"]
    assert {(s.request_class, s.concurrency) for s in timed} == {("short", 1), ("short", 4)}
    assert all(s.started_at is not None and s.t_mono is not None for s in timed)
    assert all(s.timing_source == "client" for s in timed)
    assert all(s.concurrency == 1 for s in cand.greedy)
    # The first start opens with the greedy passes (they warm it up); later starts warm up with
    # one request per request class; the reported cell runs in the first min_starts starts.
    warm = [s for s in cand.samples if s.phase == "warmup"]
    assert sorted(s.start for s in warm) == [1, 2] and all(s.error is None for s in warm)
    assert min(s.order for s in timed if s.start == 0) == 0
    assert {s.start for s in timed if s.concurrency == 4} == {0, 1, 2}  # min_starts is 3 here
    # Four requests really were in flight together: their sends lie within one request's time.
    batch = [
        s
        for s in timed
        if s.concurrency == 4
        and s.start == 0
        and s.order == max(x.order for x in timed if x.concurrency == 4 and x.start == 0)
    ]
    assert len(batch) == 4
    assert max(s.t_mono for s in batch) - min(s.t_mono for s in batch) < min(s.e2e_s for s in batch)
    # Per-cell figures against the baseline; the reported cell is said in words.
    cells = {(c.concurrency, c.role) for c in cand.cells}
    assert cells == {(1, "decisive"), (4, "reported")}
    assert all(c.aggregate_vs_baseline is not None for c in cand.cells)
    # The live service was measured once, recorded, and kept out of the verdict.
    live = runs["live--baseline.json"]
    assert live.purpose == "live" and live.samples
    events, _ = home.read_journal(summary.cycle_id)
    steps = [(e.state.value, e.fields.get("step")) for e in events]
    assert ("EXPERIMENT", "judged") in steps
    assert sum(1 for s in steps if s == ("EXPERIMENT", "enter")) >= 4
    assert summary.outcome == Outcome.PROMOTED, summary.reason
    assert "4 concurrent requests" in summary.reason and "reported" in summary.reason
    # The held-out check ran in fresh starts on prompts selection never saw, and passed.
    held_base, held_win = runs["heldout--baseline.json"], runs["heldout--demo-tiny__draft-k2.json"]
    assert held_base.purpose == held_win.purpose == "heldout"
    held_ids = {s.prompt_id for s in held_win.samples if s.phase == "heldout"}
    assert held_ids and not held_ids & {s.prompt_id for s in timed}
    assert [g.token_ids for g in held_win.greedy] == [g.token_ids for g in held_base.greedy]
    assert ("SELECT", "heldout-passed") in steps
    assert not any(v.candidate.startswith("heldout") for v in verdict.candidates)
    record = service_record(home)
    assert record is not None and "--draft-model" in record.argv


def test_when_four_concurrent_requests_decide_the_drafter_is_refused_with_the_reason(
    home: Home,
) -> None:
    # 64-token answers, as the demo's: measured on this machine (aggregate output tok/s, the
    # target vs the k4 drafter), at 32 tokens the target's batching of 4 does not yet pay (63 vs
    # 77: the drafter wins) and at 64 it does (95 vs 75: the drafter serves 0.79x); two starts
    # each keep the longer answers' cost down. Timed requests ask the whole 64 whatever the
    # demo policy times (at 32 the loss vanishes: the drafters served 1.0-1.13x in 2026-12-02's
    # demos timed at 32).
    policy(
        home,
        workload=[SHORT_1, {**SHORT_4, "role": "decisive"}],
        suite="demo-speed",  # the loss at 4 is aggregate throughput: every short prompt counts
        max_tokens=64,
        timed_max_tokens=None,
        min_starts=2,
        max_starts=2,
    )
    summary, verdict, runs = run_cycle(home, ["demo-tiny:draft-k4"])
    base = {c.concurrency: c for c in runs["baseline.json"].cells}
    (four,) = [c for c in runs["demo-tiny__draft-k4.json"].cells if c.concurrency == 4]
    assert four.role == "decisive" and four.aggregate_vs_baseline is not None
    batching = (base[4].aggregate_tps or 0) / (base[1].aggregate_tps or 1)
    if four.aggregate_vs_baseline >= 0.9:
        # Whether the drafter loses at 4 is the machine's, measured in this same cycle: on a quiet
        # 2-core machine the target batches 4 requests of 64 tokens (~2.2x its own rate) and the
        # drafter serves ~0.8x of it; on a CPU saturated by other processes the drafter's
        # single-request gain grows and the loss can vanish. Then there is no loss to refuse, and
        # nothing here is tested (cell_regressions is tested directly in
        # tests/flows/test_measure.py).
        pytest.skip(
            f"the drafter served {four.aggregate_vs_baseline:.2f}x the target at 4 concurrent "
            f"requests on this machine now (the target's own batching gain: {batching:.2f}x)"
        )
    assert summary.outcome == Outcome.KEPT_BASELINE, summary.reason
    assert "4 concurrent requests" in summary.reason, summary.reason
    record = service_record(home)
    assert record is not None and "--draft-model" not in record.argv


def test_the_baseline_recipe_under_another_id_never_qualifies(home: Home) -> None:
    # Decided on one request at a time over two starts each (the reported 4-request cell is
    # the test above's): the bound on a false qualification, (1 - confidence) / 2, holds at any
    # number of starts (MeasureProtocol.confidence, core.stats).
    # The drift check on, as in the shipped default policy: the baseline is re-measured in one
    # more fresh start after the rounds, and those samples are sealed with the rest.
    policy(
        home,
        workload=[SHORT_1],
        min_starts=2,
        max_starts=2,
        drift_check=True,
        drift_tolerance_pct=4.0,
    )
    data = yaml.safe_load((home.user_policy / "test.yaml").read_text())
    data["thresholds"]["min_speedup_pct"] = {"default": 5.0, "low": 0.0, "high": 200.0}
    (home.user_policy / "test.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "demo-aa.yaml").write_text(AA_MANIFEST)
    summary, verdict, runs = run_cycle(home, ["demo-aa:same"])
    (judged,) = verdict.candidates
    assert judged.decision.value != "qualified", judged.reasons
    assert summary.outcome == Outcome.KEPT_BASELINE
    assert runs["demo-aa__same.json"].starts >= 2
    drift = [s for s in runs["baseline.json"].samples if s.phase == "drift"]
    assert drift and all(s.error is None and s.decode_tps for s in drift)
    statement = InTotoStatement.model_validate_json(
        signing.payload_of(
            read_model(
                evidence.bundle_path(home, summary.cycle_id) / evidence.SIGNATURE, DsseEnvelope
            )
        )
    )
    assert statement.predicate.sample_counts.get("drift") == len(drift)
