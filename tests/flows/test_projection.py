"""The cost said before it is spent: the ``this-home`` profile derived from a sealed bundle's own
measured timings, the product's round loop replaying the bundle's plan on it, the projected
cost in ``propose_plan`` (dry runs too), ``registry`` and ``status``, and the policy's
``service.max_unserved_s``.

The fast tests read the shipped bundle in ``evidence/`` (a real demo cycle, sealed by today's
decision method): the projection of its own plan on its own measured timings must land within
a quarter of its wall time and requests. The slow test runs a fresh cycle and checks the same
bound on it.
"""

from __future__ import annotations

import json
import shutil
import statistics
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import yaml

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    ConfigTruth,
    CycleState,
    CycleSummary,
    Event,
    MachineLoad,
    Outcome,
    PlanCost,
    TargetProfile,
    Verdict,
    Window,
)
from mcp_infra.core.admission import unserved_limit
from mcp_infra.demo.homes import write_test_policy
from mcp_infra.faces.render.words import cost_line
from mcp_infra.flows import api as app
from mcp_infra.flows import projection as pj
from mcp_infra.flows import projection_jobs
from mcp_infra.flows.cycle import begin_cycle
from mcp_infra.flows.promotion import CycleResult, conclude
from mcp_infra.flows.status import cost_sidecar, projection_progress
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.catalog import load_policy, policy_dir
from mcp_infra.state.context import load_config
from mcp_infra.state.store import CycleFiles, Home, read_model, write_model
from tests.helpers import paths

SHIPPED = paths.SHIPPED[0]
LIVE = "demo-tiny:target"
SERVED = pj.LiveRecipe(LIVE)


def within(projected: float, measured: float, share: float = 0.25) -> bool:
    return abs(projected / measured - 1) <= share


def copy_bundle(home: Home) -> Path:
    """The shipped bundle placed in a home's evidence folder, as its own seal would leave it."""
    target = home.evidence / SHIPPED.name
    shutil.copytree(SHIPPED, target)
    return target


def test_the_profile_is_the_bundles_own_measured_timings() -> None:
    found = pj.profile_from_bundle(SHIPPED)
    profile, truths = found.profile, found.truths
    assert profile.name == "this-home" and profile.memory_gb > 0
    assert set(truths) == set(found.plan.candidates[1:])
    assert profile.candidates[LIVE] == profile.baseline  # the live recipe, by its id
    # The prompt-cache drafter failed its lossless gate; the others passed it.
    assert truths["demo-tiny:draft-k4-cache"].diverges
    assert not truths["demo-tiny:draft-k4"].diverges
    # The target batches four requests; a drafter in mlx_lm.server serves them one by one.
    assert 4 in profile.baseline.batch_tps and not truths["demo-tiny:draft-k4"].batch_tps
    assert truths["demo-tiny:draft-k4"].decode_tps > profile.baseline.decode_tps
    assert all(t.load_s > 0 and t.peak_gb for t in [profile.baseline, *truths.values()])
    assert 0 < profile.start_spread < 1 and 0 < profile.request_spread < 1  # measured
    assert not any("assumed" in a for a in profile.assumptions)
    # Greedy passes follow today's rule from the recipes' knobs.
    assert found.recipes["demo-tiny:draft-k4"].knobs.prompt_cache_size == 0
    assert found.recipes["demo-tiny:draft-k4-cache"].knobs.prompt_cache_size is None
    assert found.exclusive is False and found.policy is not None


def test_a_starts_wait_for_a_quiet_machine_is_priced_in_its_load() -> None:
    """The demo policy waits before each start (service.quiet_cpu_fraction); that wait lies
    outside a start's span, so the profile adds it: a home whose starts waited is priced so."""
    found = pj.profile_from_bundle(SHIPPED)
    files = CycleFiles(SHIPPED)
    runs = [read_model(p, CandidateRun) for p in sorted(files.runs.glob("*.json"))]
    verdict = read_model(files.verdict, Verdict)

    def waiting(seconds: float) -> tuple[TargetProfile, dict[str, ConfigTruth]]:
        load = MachineLoad(
            window_s=1, cpus=2, other_cpu_s=0, other_cpu_fraction=0, waited_s=seconds
        )
        runs_waiting = [
            run.model_copy(
                update={"rounds": [r.model_copy(update={"machine": load}) for r in run.rounds]}
            )
            for run in runs
        ]
        return pj.profile_from_runs(found.plan, runs_waiting, verdict, found.profile.memory_gb)

    unwaited, unwaited_truths = waiting(0.0)
    profile, truths = waiting(12.5)
    assert profile.baseline.load_s == pytest.approx(unwaited.baseline.load_s + 12.5, abs=1e-3)
    k4 = "demo-tiny:draft-k4"
    assert truths[k4].load_s == pytest.approx(unwaited_truths[k4].load_s + 12.5, abs=1e-3)
    assert any("quiet" in a for a in profile.assumptions)


def test_the_shipped_bundle_is_projected_within_a_quarter_of_what_it_measured() -> None:
    found = pj.profile_from_bundle(SHIPPED)
    measured = found.measured
    summary = read_model(SHIPPED / "summary.json", CycleSummary)
    assert measured.wall_s == (summary.ended_at - summary.started_at).total_seconds()
    runs = list(SHIPPED.glob("runs/*.json"))
    counted = sum(len(r.samples) + len(r.greedy) for r in map(load_run, runs))
    assert measured.requests == counted + len(load_run(SHIPPED / "online.json").samples)
    assert found.policy is not None
    cost = pj.project_cost(
        [SHIPPED], found.plan, found.policy, LIVE, "concurrent", found.recipes, seeds=3
    )
    assert cost.basis == "this-home" and cost.minutes is not None and cost.requests is not None
    assert within(cost.minutes * 60, measured.wall_s), (cost.minutes * 60, measured.wall_s)
    assert within(cost.requests, measured.requests), (cost.requests, measured.requests)
    assert cost.outcomes.get("promoted", 0) >= 2  # the bundle promoted; so does its replay
    assert cost.unserved_s == 0.0 and cost.rounds == 4


def test_cycle_cost_prints_the_this_home_row(capsys: pytest.CaptureFixture[str]) -> None:
    cycle_cost = paths.load_benchmark("cycle_cost")
    code = cycle_cost.main(
        ["--profile", "this-home", "--bundle", str(SHIPPED), "--smoke", "--json"]
    )
    assert code == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert row["profile"] == "this-home" and row["plan"] == SHIPPED.name and row["seeds"] == 2
    assert row["measured_requests"] == 171 and abs(row["minutes_vs_measured"] - 1) <= 0.25
    assert abs(row["requests_vs_measured"] - 1) <= 0.25 and row["derived"]["name"] == "this-home"


def test_cycle_cost_projects_a_policy_file_beside_a_shipped_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A person weighs a change to their policy before making it: shorter greedy answers (the
    gates compare fewer tokens) cost fewer minutes on the same seeds."""
    cycle_cost = paths.load_benchmark("cycle_cost")
    data = yaml.safe_load((policy_dir() / "single-user.yaml").read_text())
    data["protocol"]["max_tokens"] = 128
    mine = tmp_path / "shorter-answers.yaml"
    mine.write_text(yaml.safe_dump(data))
    argv = ["--plans", "drafters", "--seeds", "2", "--json"]
    assert cycle_cost.main(["--policies", f"single-user,{mine}", *argv]) == 0
    shipped, short = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert (shipped["policy"], short["policy"]) == ("single-user", "shorter-answers")
    assert short["median_minutes"] < shipped["median_minutes"]
    assert short["median_requests"] == shipped["median_requests"]  # the same requests, shorter
    mine.write_text("protocol: [not, a, mapping]\n")
    with pytest.raises(SystemExit, match="shorter-answers.yaml"):
        cycle_cost.main(["--policies", str(mine), *argv])


def load_run(path: Path) -> CandidateRun:
    return read_model(path, CandidateRun)


def test_a_first_cycle_is_priced_on_the_live_service_it_measured() -> None:
    """No sealed cycle to price from: the plan on the live service's own rates as BASELINE
    measured them (every configuration as the live recipe), its readiness time as each start's
    load; without a readiness time nothing is projected, and the answer says why."""
    found = pj.profile_from_bundle(SHIPPED)
    live_run = load_run(SHIPPED / "runs" / "live--baseline.json")
    live = pj.LiveService(live_run, ready_s=3.0, memory_gb=found.profile.memory_gb)
    policy = load_policy("demo")

    def cost(service: pj.LiveService) -> PlanCost:
        return pj.live_cost(found.plan, service, policy, "concurrent", found.recipes)

    first = cost(live)
    assert first.basis == "live-service" and first.minutes is not None, first.why
    assert first.minutes_high is not None and first.minutes_high >= first.minutes
    assert first.configurations == found.plan.candidates and first.seeds == pj.COST_SEEDS
    assert "priced as the live recipe" in first.assumptions[0]
    assert "3 s to readiness" in first.assumptions[1]
    slower = cost(live._replace(ready_s=60.0))
    assert slower.minutes is not None and slower.minutes > first.minutes + 1, "each start loads"
    unready = cost(live._replace(ready_s=None))
    assert unready.basis == "unknown" and unready.minutes is None
    assert "no readiness time" in unready.why
    silent = cost(live._replace(run=live_run.model_copy(update={"samples": []})))
    assert silent.basis == "unknown" and "no timed answer" in silent.why


def test_an_unmeasured_candidate_is_priced_as_the_live_recipe() -> None:
    profile = pj.profile_from_bundle(SHIPPED).profile
    got = pj.priced(profile, ["demo-tiny:kv8"], "demo-tiny:draft-k4")
    assert not isinstance(got, str)
    priced, truths, notes = got
    assert priced.baseline == profile.candidates["demo-tiny:draft-k4"]
    assert truths["demo-tiny:kv8"].decode_tps == priced.baseline.decode_tps
    assert notes == ["demo-tiny:kv8 was never measured here: priced as the live recipe (no gain)"]
    why = pj.priced(profile, ["demo-tiny:kv8"], "other:recipe")
    assert why == "the live recipe other:recipe was not measured in this home's sealed cycles"


@pytest.mark.parametrize(
    ("mode", "unserved", "limit", "window", "action", "words"),
    [
        ("concurrent", 900.0, 60.0, Window(), "run", ""),
        ("exclusive", 900.0, None, Window(), "run", ""),
        ("exclusive", 50.0, 60.0, Window(), "run", "within service.max_unserved_s"),
        (
            "exclusive",
            900.0,
            60.0,
            Window(mode="window", start="02:00", end="04:00", timezone="UTC"),
            "hold",
            "runs only inside the maintenance window 02:00-04:00 UTC",
        ),
        ("exclusive", 900.0, 60.0, Window(mode="never"), "refuse", "window is 'never'"),
        ("exclusive", 900.0, 60.0, Window(), "refuse", "no maintenance window to wait for"),
        (
            "exclusive",
            None,
            60.0,
            Window(mode="window", start="02:00", end="04:00"),
            "hold",
            "cannot be projected",
        ),
    ],
)
def test_the_unserved_limit(
    mode: str, unserved: float | None, limit: float | None, window: Window, action: str, words: str
) -> None:
    got, why = unserved_limit(mode, unserved, limit, window)  # type: ignore[arg-type]
    assert got == action and words in why
    if action != "run":
        assert f"service.max_unserved_s ({limit:.0f} s)" in why


def test_a_cost_is_cached_and_a_fast_read_never_waits(bare_home: Home) -> None:
    found = pj.profile_from_bundle(SHIPPED)
    policy = load_policy("demo")
    plan = pj.simulated_plan(policy, ["demo-tiny:draft-k4"])
    recipes = {"demo-tiny:draft-k4": found.recipes["demo-tiny:draft-k4"]}
    none = pj.plan_cost(bare_home, plan, policy, SERVED, "concurrent", recipes)
    assert none.basis == "unknown" and none.why == pj.NO_FIGURES
    copy_bundle(bare_home)
    pending = pj.plan_cost(bare_home, plan, policy, SERVED, "exclusive", recipes, wait=False)
    assert pending.basis == "pending" and SHIPPED.name in pending.why
    assert pj.BACKGROUND.drain(timeout=120)
    (kept,) = bare_home.projections.glob("*.json")
    done = pj.plan_cost(bare_home, plan, policy, SERVED, "exclusive", recipes, wait=False)
    assert done == read_model(kept, PlanCost) and done.basis == "this-home"
    assert done.mode == "exclusive" and done.unserved_s and done.unserved_s > 0
    assert done.source == [SHIPPED.name] and done.seeds == pj.COST_SEEDS
    waited = pj.plan_cost(bare_home, plan, policy, SERVED, "concurrent", recipes)
    assert waited.basis == "this-home" and waited.unserved_s == 0.0
    assert len(list(bare_home.projections.glob("*.json"))) == 2  # one per mode
    # A later cycle on the same live configuration keeps its greedy pass (core.reference):
    # another projection, shorter, that says so.
    kept = pj.plan_cost(
        bare_home, plan, policy, SERVED._replace(answers_kept=True), "concurrent", recipes
    )
    assert kept.basis == "this-home" and kept.answers_kept and pj.KEPT in kept.assumptions
    assert "kept from an earlier cycle: not asked again" in (cost_line(kept) or "")
    assert pj.KEPT not in waited.assumptions
    assert kept.minutes is not None and waited.minutes is not None
    assert kept.minutes < waited.minutes and kept.requests < waited.requests
    assert len(list(bare_home.projections.glob("*.json"))) == 3


def test_a_cycle_refused_before_any_start_is_no_source_of_timings(bare_home: Home) -> None:
    """Found trying it: a cycle refused at once (a stranger held the stable port) is sealed with
    nothing measured, and the cost of every later plan said "this home's newest sealed cycle
    could not be read". The cost comes from the newest cycle that measured something."""
    policy = load_policy("demo")
    plan = pj.simulated_plan(policy, ["demo-tiny:draft-k4"])

    def refused() -> CycleSummary:  # what run_cycle seals when its first step refuses
        begun = begin_cycle(bare_home, plan)
        why = "port 59998 on 127.0.0.1 is held by a process mcp-infra did not start"
        result = CycleResult(Outcome.REFUSED, None, why)
        return conclude(bare_home, plan, begun.cycle_id, begun.journal, begun.started, result)

    assert refused().outcome == Outcome.REFUSED
    assert pj.sealed_bundles(bare_home) == []
    copy_bundle(bare_home)
    newest = refused()
    assert evidence.list_cycles(bare_home)[0].cycle_id == newest.cycle_id
    assert [b.name for b in pj.sealed_bundles(bare_home)] == [SHIPPED.name]
    found = pj.profile_from_bundle(SHIPPED)
    recipes = {"demo-tiny:draft-k4": found.recipes["demo-tiny:draft-k4"]}
    cost = pj.plan_cost(bare_home, plan, policy, SERVED, "concurrent", recipes)
    assert cost.basis == "this-home" and cost.source == [SHIPPED.name], cost.why


def test_status_sets_the_projection_against_the_elapsed_time(bare_home: Home) -> None:
    cost = PlanCost(
        basis="this-home",
        minutes=4.0,
        minutes_high=5.0,
        rounds=3,
        requests=90,
        unserved_s=0.0,
        seeds=3,
        configurations=[BASELINE_ID, "demo-tiny:draft-k4"],
        source=[SHIPPED.name],
    )
    write_model(cost_sidecar(bare_home, "p-1"), cost)
    maintenance = Event(
        ts=datetime.now(UTC),
        cycle_id="c-1",
        state=CycleState.MAINTENANCE,
        message="none expected",
        fields={"configurations": [BASELINE_ID, "demo-tiny:draft-k4"], "mode": "concurrent"},
    )
    got = projection_progress(bare_home, "p-1", [maintenance], 120.0)
    assert got["projected"] == cost
    assert got["projection"] == (
        "projected 4.0 min (up to 5.0 over 3 seeds), 3 round(s); 2.0 min elapsed "
        "(50% of the projection)"
    )
    fewer = maintenance.model_copy(update={"fields": {"configurations": [BASELINE_ID]}})
    said = projection_progress(bare_home, "p-1", [fewer], 60.0)["projection"]
    assert "the cycle measures baseline" in said
    assert projection_progress(bare_home, "p-2", [], 1.0) == {
        "projection": "no projection was made when this plan was proposed"
    }
    write_model(cost_sidecar(bare_home, "p-1"), cost.model_copy(update={"basis": "live-service"}))
    first = projection_progress(bare_home, "p-1", [maintenance], 120.0)["projection"]
    assert first.startswith(
        "projected 4.0 min (up to 5.0 over 3 seeds), 3 round(s) (first projection: the live "
        "service as BASELINE measured it, no gain assumed); 2.0 min elapsed"
    ), first


# ---------------------------------------------------------------------------------------------
# Slow: a home with the demo models (preflight passes), proposals through the product's API
# ---------------------------------------------------------------------------------------------

PLAN = {"hypothesis": "a 4-token drafter speeds up decoding", "candidates": ["demo-tiny:draft-k4"]}
UNMEASURED = {
    "hypothesis": "a 6-token drafter speeds up decoding",
    "candidates": ["demo-tiny:draft-k6"],
}


def set_service(home: Home, window: dict[str, str], **service: object) -> None:
    """The home's test policy with these service limits and this window (a person's edit)."""
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data.setdefault("service", {}).update(service)
    data["window"] = {"timezone": "UTC", **window}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_dry_run_on_a_home_with_a_sealed_cycle_says_its_cost(home: Home) -> None:
    copy_bundle(home)
    view = app.propose(home, PLAN, proposed_by="test", dry_run=True, start_supervisor=False)
    assert view.accepted and view.dry_run and view.cost is not None, view
    cost = view.cost
    assert cost.basis == "this-home" and cost.source == [SHIPPED.name]
    assert cost.minutes and cost.minutes > 0 and cost.rounds and cost.requests
    assert cost.configurations == [BASELINE_ID, "demo-tiny:draft-k4"]
    assert cost.mode == "concurrent" and cost.unserved_s == 0.0 and cost.held is None
    assert not home.queued()
    listed = app.registry_view(home, "demo-tiny:draft-k4")
    (candidate,) = listed.candidates
    assert candidate.cost is not None and candidate.cost.basis == "this-home"


def test_an_exclusive_plan_over_the_unserved_limit_is_held_for_the_window(home: Home) -> None:
    copy_bundle(home)
    # A budget of 0.6 GiB holds one tiny demo server (estimated 0.31 GiB) but not the 1 GB peak
    # the manifest declares for a drafter no cycle here measured: exclusive mode.
    fraction = round(0.6 / (psutil.virtual_memory().total / 2**30), 5)
    window = {"mode": "window", "start": "02:00", "end": "04:00"}
    set_service(home, window, memory_budget_fraction=fraction, max_unserved_s=5)
    view = app.propose(home, UNMEASURED, proposed_by="test", start_supervisor=False)
    assert view.accepted and view.memory_mode == "exclusive", view.memory_mode_reason
    assert view.cost is not None and view.cost.unserved_s and view.cost.unserved_s > 5
    assert view.cost.held and "maintenance window 02:00-04:00 UTC" in view.cost.held
    assert "held for the maintenance window" in view.message and len(home.queued()) == 1
    kept = read_model(cost_sidecar(home, str(view.plan_id)), PlanCost)
    assert kept == view.cost  # what `status` sets against the elapsed time
    set_service(home, {"mode": "never"}, memory_budget_fraction=fraction, max_unserved_s=5)
    refused = app.propose(home, UNMEASURED, proposed_by="test", start_supervisor=False)
    assert not refused.accepted and "window is 'never'" in refused.message
    assert len(home.queued()) == 1  # nothing more queued
    set_service(home, window, memory_budget_fraction=fraction, max_unserved_s=None)
    unlimited = app.propose(
        home, UNMEASURED, proposed_by="test", dry_run=True, start_supervisor=False
    )
    assert unlimited.accepted and unlimited.cost is not None and unlimited.cost.held is None


# A gain of 900% is far beyond the demo drafter (about 1.8x-3x here): the cycle ends after its
# two rounds keeping the baseline, with no held-out check or promotion, in reality and in every
# projected seed alike, so the test compares the pricing of the same work. Short answers keep
# the cycle short on a loaded 2-core machine.
OUT_OF_REACH = {"min_speedup_pct": {"default": 900.0, "low": 0.0, "high": 1000.0}}


def test_a_fresh_demo_cycle_is_projected_within_a_quarter(home: Home) -> None:
    write_test_policy(home, thresholds=OUT_OF_REACH, repeats=1, max_tokens=8)
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    first = app.propose(home, PLAN, proposed_by="test", start_supervisor=False)
    assert first.accepted and first.cost is not None and first.cost.basis == "unknown"
    assert first.cost.why == pj.NO_FIGURES
    (summary,) = supervise(home)
    assert summary.outcome == Outcome.KEPT_BASELINE
    bundle = evidence.bundle_path(home, summary.cycle_id)
    found = pj.profile_from_bundle(bundle)
    runs = [pj.replay(found, seed) for seed in range(3)]
    assert {r.outcome for r in runs} <= {"kept_baseline", "rejected"} and {
        r.rounds for r in runs
    } == {2}
    minutes = statistics.median(r.minutes for r in runs)
    requests = statistics.median(r.requests for r in runs)
    assert within(60 * minutes, found.measured.wall_s), (60 * minutes, found.measured)
    assert within(requests, found.measured.requests), (requests, found.measured)
    dry = app.propose(home, PLAN, proposed_by="test", dry_run=True, start_supervisor=False)
    assert dry.accepted and dry.cost is not None and dry.cost.basis == "this-home", dry
    assert dry.cost.source == [summary.cycle_id] and dry.cost.rounds == 2
    assert within(dry.cost.minutes * 60, found.measured.wall_s)


def test_a_projection_whose_process_fails_is_kept_as_failed_with_the_reason(
    bare_home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child that computes a fast read's projection exits without an answer: the read is
    answered with the failure and its reason, never left pending."""
    found = pj.profile_from_bundle(SHIPPED)
    policy = load_policy("demo")
    plan = pj.simulated_plan(policy, ["demo-tiny:draft-k4"])
    recipes = {"demo-tiny:draft-k4": found.recipes["demo-tiny:draft-k4"]}
    copy_bundle(bare_home)
    monkeypatch.setattr(projection_jobs.sys, "executable", "/bin/false")
    pending = pj.plan_cost(bare_home, plan, policy, SERVED, "concurrent", recipes, wait=False)
    assert pending.basis == "pending"
    assert pj.BACKGROUND.drain(timeout=60)
    done = pj.plan_cost(bare_home, plan, policy, SERVED, "concurrent", recipes, wait=False)
    assert done.basis == "unknown"
    assert done.why and "its process exited with code 1" in done.why
