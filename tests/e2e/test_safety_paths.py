"""The cycle's safety paths on real processes: a winner that cannot start on the stable port, a
promotion that fails its online verification, the time budget running out, and a cycle that
fails by error retried with backoff, a bounded number of times.

Each fault is a real one, made at the moment the journal says the cycle reached a state (a thread
watches the journal the supervisor writes): a model folder broken or changed on disk, a real
server killed with SIGKILL, a policy's budget. Promotions come from the policy (PROMOTE_ANY_GAIN),
not from how fast the machine is: the drafter only has to be measured faster than the baseline.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_infra.contracts import CycleState, CycleSummary, Event, Outcome, Verdict
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, make_home
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state import evidence
from mcp_infra.state.context import active_recipe, service_record
from mcp_infra.state.store import Home, read_model
from tests.helpers.faultkit import FAST, WINNING, inspect, queue_plan, start_live, until_not_kept
from tests.helpers.journal import on_journal

BASELINE, WINNER = "demo-tiny:target", "demo-tiny:draft-k4"


def promoting(event: Event) -> bool:
    return event.state == CycleState.PROMOTE and event.fields.get("step") == "enter"


def own_models(home: Home, demo_models: dict[str, Path], *copies: str) -> None:
    """This home's own model folder: `copies` copied (to be changed), the rest linked."""
    home.models.unlink()
    home.models.mkdir()
    for role in ("target", "draft"):
        if role in copies:
            shutil.copytree(demo_models[role], home.models / role)
        else:
            (home.models / role).symlink_to(demo_models[role], target_is_directory=True)


def states(home: Home, summary: CycleSummary) -> list[str]:
    events, problems = home.read_journal(summary.cycle_id)
    assert problems == []
    return [e.state.value for e in events]


def to_promotion(home: Home, fault: Callable[[], None]) -> tuple[CycleSummary, list[str]]:
    """Queue the drafter's plan and supervise it, ``fault`` made as PROMOTE is journaled; the
    summary and the cycles the fault was made in (``until_not_kept``: the path under test
    starts at a promotion, so a cycle that kept the baseline is run once more)."""

    def cycle() -> tuple[CycleSummary, list[str]]:
        queue_plan(home, {"hypothesis": "a drafter speeds up decoding", "candidates": [WINNER]})
        with on_journal(home, promoting, fault) as acted:
            (summary,) = supervise(home)
        return summary, acted

    summary, acted = until_not_kept(cycle)
    if summary.outcome == Outcome.KEPT_BASELINE:
        pytest.fail(
            "the drafter was not measured faster than the baseline in two cycles, so nothing "
            f"was promoted and this path was not reached: {summary.reason}"
        )
    return summary, acted


def test_a_winner_that_cannot_start_on_the_stable_port_is_rolled_back(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    home = make_home(tmp_path / "home", demo_models, thresholds=PROMOTE_ANY_GAIN, **WINNING)
    own_models(home, demo_models, "draft")
    start_live(home)

    def break_the_draft() -> None:  # after it was measured, before the stable port loads it
        (home.models / "draft" / "config.json").write_text("{ not json")

    summary, acted = to_promotion(home, break_the_draft)
    assert acted, "the fault was made when PROMOTE was journaled"
    assert summary.outcome == Outcome.ROLLED_BACK, summary.reason
    assert summary.reason.startswith(
        "the winner did not start"
    )  # on its own port, behind the front
    seen = states(home, summary)
    assert seen.index("PROMOTE") < seen.index("ROLLBACK") and "VERIFY" not in seen
    assert "COMMIT" not in seen
    assert active_recipe(home).candidate_id == BASELINE
    after = inspect(home)
    assert after.serving == BASELINE and after.healthy and after.orphans == []
    assert after.verified and after.outcome == "rolled_back"


def test_a_promotion_that_fails_online_verification_is_rolled_back(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    """The target's weights change on disk between measurement and promotion (the final norm
    negated: every logit flips sign), so the stable port's greedy output is not the measured one."""
    home = make_home(tmp_path / "home", demo_models, thresholds=PROMOTE_ANY_GAIN, **WINNING)
    own_models(home, demo_models, "target")
    start_live(home)  # the live baseline holds the original weights in memory

    def change_the_weights() -> None:
        import mlx.core as mx

        path = home.models / "target" / "model.safetensors"
        arrays = mx.load(str(path))
        arrays["model.norm.weight"] = -arrays["model.norm.weight"]
        tmp = path.with_name("changed.safetensors")
        mx.save_safetensors(str(tmp), arrays, metadata={"format": "mlx"})
        os.replace(tmp, path)

    summary, acted = to_promotion(home, change_the_weights)
    assert acted
    assert summary.outcome == Outcome.ROLLED_BACK, summary.reason
    assert summary.reason.startswith("online greedy output differs from the measured one")
    events, _ = home.read_journal(summary.cycle_id)
    steps = [(e.state.value, e.fields.get("step")) for e in events]
    assert ("VERIFY", "failed") in steps and ("VERIFY", "passed") not in steps
    assert steps.index(("VERIFY", "failed")) < steps.index(("ROLLBACK", "enter"))
    assert ("ROLLBACK", "done") in steps and "COMMIT" not in [s for s, _ in steps]
    assert active_recipe(home).candidate_id == BASELINE
    after = inspect(home)
    assert after.serving == BASELINE and after.healthy and after.orphans == []
    assert after.verified and after.outcome == "rolled_back"


def test_the_cycle_time_budget_running_out(tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """A policy budget of 0.06 s: spent by the baseline's measurement, so no candidate starts."""
    home = make_home(tmp_path / "home", demo_models, budgets={"cycle_minutes": 0.001}, **FAST)
    start_live(home)
    queue_plan(home, {"hypothesis": "h", "candidates": [WINNER, "demo-tiny:draft-k2"]})
    (summary,) = supervise(home)
    assert summary.outcome == Outcome.KEPT_BASELINE
    verdict = read_model(evidence.bundle_path(home, summary.cycle_id) / "verdict.json", Verdict)
    assert [c.candidate for c in verdict.candidates] == [WINNER, "demo-tiny:draft-k2"]
    for candidate in verdict.candidates:
        assert candidate.decision.value == "rejected"
        assert any("time budget ran out" in r for r in candidate.reasons), candidate.reasons
    assert "EXPERIMENT" not in states(home, summary), "no candidate server was started"
    after = inspect(home)
    assert after.serving == BASELINE and after.healthy and after.orphans == []
    assert after.verified


def test_a_cycle_failed_by_error_is_retried_with_backoff_a_bounded_number_of_times(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    """The live server is SIGKILLed while each attempt measures it: the cycle fails by error,
    is restored, and re-queued once (retries: 1) after the backoff; then no more."""
    home = make_home(
        tmp_path / "home", demo_models, budgets={"retries": 1, "retry_backoff_s": 2.0}, **FAST
    )
    start_live(home)
    plan_id = queue_plan(home, {"hypothesis": "h", "candidates": [WINNER]})
    killed: list[int] = []

    def kill_the_live_server() -> None:
        record = service_record(home)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        killed.append(record.pid)

    baseline = lambda e: e.state == CycleState.BASELINE  # noqa: E731
    with on_journal(home, baseline, kill_the_live_server, every_cycle=True) as acted:
        summaries = supervise(home)
    assert len(acted) == 2 and len(set(killed)) == 2, "a fresh live server in each attempt"
    assert [s.plan_id for s in summaries] == [plan_id, plan_id], "one retry, no more"
    first, second = sorted(summaries, key=lambda s: s.started_at)
    for summary in (first, second):
        assert summary.outcome == Outcome.RESTORED_AFTER_ERROR
        assert summary.reason.startswith(
            "cycle failed: RuntimeError: the live service failed while its baseline was measured"
        )
    waited = (second.started_at - first.ended_at).total_seconds()
    assert waited >= 2.0, f"the retry waited the policy's backoff (2 s), not {waited:.2f} s"
    assert home.queued() == [], "not re-queued after the last allowed attempt"
    after = inspect(home)
    assert after.serving == BASELINE and after.healthy and after.orphans == []
