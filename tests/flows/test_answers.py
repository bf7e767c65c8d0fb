"""What a cycle keeps of its runs' answers and what a plan's projection learns from it
(``flows.answers``), on a home's own ``references/`` folder."""

from __future__ import annotations

from pathlib import Path

from mcp_infra.contracts import BASELINE_ID, CandidateRun, Sample
from mcp_infra.flows import answers
from mcp_infra.flows.measure import greedy_prompts, prompts_by_class
from mcp_infra.flows.projection import simulated_plan
from mcp_infra.state import references
from mcp_infra.state.catalog import load_policy, load_suite
from mcp_infra.state.store import Home
from tests.state.test_references import model, recipe


def first_pass(pids: list[str]) -> CandidateRun:
    greedy = [
        Sample(candidate=BASELINE_ID, prompt_id=pid, repeat=0, order=i, token_ids=[i, 7])
        for i, pid in enumerate(pids)
    ]
    return CandidateRun(candidate=BASELINE_ID, greedy=greedy)


def test_a_kept_pass_is_found_for_the_same_configuration_and_plan_only(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    live = recipe(model(tmp_path))
    plan = simulated_plan(load_policy("single-user"), ["sim:a"])
    protocol = plan.protocol
    every = greedy_prompts(protocol, prompts_by_class(load_suite(protocol.suite), "selection"))
    assert not answers.kept_for(home, live, protocol)
    answers.keep(home, plan, "c-1", live, first_pass([p.id for p in every[:-1]]), "selection")
    assert not answers.kept_for(home, live, protocol)  # a pass is kept whole or not at all
    answers.keep(home, plan, "c-2", live, first_pass([p.id for p in every]), "selection")
    assert answers.kept_for(home, live, protocol)
    shorter = protocol.model_copy(update={"max_tokens": 64})
    assert not answers.kept_for(home, live, shorter)  # other budgets: other requests
    (tmp_path / "other").mkdir()
    other = recipe(model(tmp_path / "other"))
    assert not answers.kept_for(home, other, protocol)
    kept = references.load(home, live)
    assert kept is not None and {a.cycle_id for a in kept.answers} == {"c-2"}  # the newest


def test_a_home_that_cannot_be_written_only_asks_again(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    home.references.write_text("a file where the folder belongs")
    live = recipe(model(tmp_path))
    plan = simulated_plan(load_policy("single-user"), ["sim:a"])
    answers.keep(home, plan, "c-1", live, first_pass(["code-lru-cache"]), "selection")
    assert not answers.kept_for(home, live, plan.protocol)
