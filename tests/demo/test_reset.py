"""A demo home between demos: recipe memory and the last cycle's state go, the newest sealed
bundles stay and teach the next demo this machine's start-to-start spread."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import CycleSummary, FrozenPlan
from mcp_infra.demo import run as demo_run
from mcp_infra.state import evidence
from mcp_infra.state.catalog import load_policy, policy_dir
from mcp_infra.state.spread import learned_spread
from mcp_infra.state.store import Home, read_model, write_model
from tests.helpers.paths import SHIPPED, shipped_key


def _older_copy(home: Home, bundle: Path, cycle_id: str) -> None:
    """The shipped bundle again, as a cycle that started a day earlier."""
    shutil.copytree(bundle, home.evidence / cycle_id)
    path = home.bundle_files(cycle_id).summary
    summary = read_model(path, CycleSummary)
    write_model(
        path,
        summary.model_copy(
            update={
                "cycle_id": cycle_id,
                "started_at": summary.started_at - timedelta(days=1),
                "ended_at": summary.ended_at - timedelta(days=1),
            }
        ),
    )


def test_a_demo_home_keeps_its_newest_bundles_and_forgets_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = SHIPPED[0]
    home = Home(tmp_path / "demo").ensure()
    shutil.copytree(shipped, home.evidence / shipped.name)
    _older_copy(home, shipped, "c-older")
    (home.evidence / ".c-half.tmp").mkdir()  # a seal that never finished
    (home.memory / "recipes.json").write_text("{}")
    (home.plans / "p-old.json").write_text("{}")
    home.references.mkdir()
    (home.references / f"{'0' * 64}.json").write_text("{}")  # a configuration's kept answers

    kept = demo_run.reset(home)
    assert kept == [shipped.name, "c-older"]  # newest first
    assert not (home.memory / "recipes.json").exists(), "recipe memory is a first cycle's"
    assert not (home.plans / "p-old.json").exists()
    assert list(home.references.iterdir()), "kept answers stay beside the bundles they came from"
    assert sorted(p.name for p in home.evidence.iterdir()) == sorted(["c-older", shipped.name])
    assert evidence.verify(evidence.bundle_path(home, shipped.name), shipped_key(shipped)).ok

    # What the kept bundles are for: the next demo's plan learns the spread from them.
    protocol = read_model(home.bundle_files(shipped.name).plan, FrozenPlan).protocol
    ended = read_model(home.bundle_files(shipped.name).summary, CycleSummary).ended_at
    spread = learned_spread(home, protocol, ended + timedelta(hours=1))
    assert spread is not None and shipped.name in spread.source and "c-older" in spread.source

    monkeypatch.setattr(demo_run, "KEPT_BUNDLES", 1)
    assert demo_run.reset(home) == [shipped.name]
    assert [p.name for p in home.evidence.iterdir()] == [shipped.name]

    assert demo_run.reset(home, fresh=True) == []
    assert list(home.evidence.iterdir()) == []
    assert not home.references.exists(), "and go with them"
    assert learned_spread(home, protocol, ended) is None


def test_the_demo_policy_learns_its_spread_and_a_test_home_does_not(tmp_path: Path) -> None:
    from mcp_infra.demo.homes import TEST_POLICY, write_test_policy

    demo = load_policy("demo").protocol
    assert demo.learn_spread and demo.futility_confidence is not None
    assert load_policy("demo").recipe_memory is False
    home = Home(tmp_path / "home").ensure()
    write_test_policy(home)
    test = load_policy(TEST_POLICY, home.user_policy).protocol
    assert not test.learn_spread and test.futility_confidence is None
    assert load_policy(TEST_POLICY, home.user_policy).recipe_memory is True
    write_test_policy(home, learn_spread=True)
    assert load_policy(TEST_POLICY, home.user_policy).protocol.learn_spread


def test_the_demo_says_what_its_plan_was_projected_to_cost() -> None:
    from mcp_infra.contracts.projection import PlanCost

    known = PlanCost(
        basis="this-home", why="", minutes=2.5, rounds=3, source=["c-new", "c-old"]
    ).model_dump(mode="json")
    assert demo_run.cost_line(known) == (
        "projected on this machine: about 150 s of cycle, 3 round(s), 0 s unserved "
        "(concurrent), from the timings measured in c-new"
    )
    down = PlanCost(basis="this-home", minutes=20.0, rounds=2, unserved_s=582, mode="exclusive")
    assert "582 s unserved (exclusive)" in demo_run.cost_line(down.model_dump(mode="json"))
    unknown = PlanCost(basis="unknown", why="no sealed cycle yet").model_dump(mode="json")
    assert demo_run.cost_line(unknown) == (
        "projected cost: unknown (no sealed cycle yet; 0 s unserved, concurrent)"
    )
    blind = PlanCost(basis="unknown", why="no sealed cycle yet", mode="exclusive")
    assert "unserved time unknown, exclusive" in demo_run.cost_line(blind.model_dump(mode="json"))
    assert demo_run.cost_line(None) == "projected cost: none was returned"


def test_every_plan_answer_names_the_time_the_service_is_down() -> None:
    """The dry run and the plan answer say the projected unserved time, or that the service is
    down for a time that cannot be projected yet (service.max_unserved_s, docs/cycle.md)."""
    from mcp_infra.contracts.projection import PlanCost
    from mcp_infra.faces.render import cost_line

    known = PlanCost(basis="this-home", minutes=20.0, minutes_high=24.0, seeds=8, rounds=2)
    assert "9.7 min unserved (exclusive)" in str(
        cost_line(known.model_copy(update={"unserved_s": 582, "mode": "exclusive"}))
    )
    screened = known.model_copy(
        update={"screening_minutes": 12.5, "deciding_minutes": 7.5, "screened_out": {"m:q8": 8}}
    )
    line = str(cost_line(screened))
    assert "20.0 min: screening 12.5 min, deciding 7.5" in line
    assert "screening drops m:q8 in at least one seed" in line
    blind = PlanCost(basis="unknown", why="no sealed cycle yet", mode="exclusive")
    assert "the service is down while candidates run (exclusive)" in str(cost_line(blind))
    assert "0 s unserved (concurrent)" in str(
        cost_line(blind.model_copy(update={"mode": "concurrent"}))
    )


def test_the_demo_follows_its_cycle_past_the_policys_budget(tmp_path: Path) -> None:
    """The demo follows its cycle for the demo policy's whole budget and a margin: stopping
    sooner would stop the service under a cycle still running on a loaded machine."""
    home = Home(tmp_path / "demo").ensure()
    budget = load_policy("demo").budgets.cycle_minutes * 60
    assert demo_run.follow_timeout_s(home) == budget + demo_run.FOLLOW_MARGIN_S
    data = yaml.safe_load((policy_dir() / "demo.yaml").read_text())
    data["budgets"]["cycle_minutes"] = 45
    home.user_policy.mkdir(parents=True, exist_ok=True)
    (home.user_policy / "demo.yaml").write_text(yaml.safe_dump(data))
    assert demo_run.follow_timeout_s(home) == 45 * 60 + demo_run.FOLLOW_MARGIN_S
