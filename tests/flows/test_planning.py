"""The planning prompt a local model can follow (issue 20 item 5): it offers only candidates a
plan may name (not refused by recipe memory, not the live recipe), its figures are the
evidence's own, its reasons are whole, and its example is a plan the product's own
``extract_plan`` finds and ``propose_plan`` accepts.

Fast: the demo models are built (no server starts) and one cycle is sealed synthetically
(tests/helpers/synthetic_bundle.py: invented timings, the product's own selector and sealing).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcp_infra.contracts import CandidateRun, Verdict
from mcp_infra.core.extraction import extract_plan
from mcp_infra.core.menu import fallback_plan
from mcp_infra.core.preflight import find_candidate
from mcp_infra.core.units import fmt_pct
from mcp_infra.demo.homes import make_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.faces.render import menu_prompt, plan_example, planning_prompt
from mcp_infra.flows import api as app
from mcp_infra.flows.planning import build_context, menu_of, whole
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_registry
from mcp_infra.state.store import Home, read_model, write_model
from tests.helpers.synthetic_bundle import baseline_run, freeze, greedy_ids, prompts, seal, timing

DIVERGES, SLOWER = "demo-tiny:draft-k4-cache", "demo-tiny:draft-k2"


@pytest.fixture
def planned_home(tmp_path: Path) -> tuple[Home, str]:
    """A home with built demo models and one sealed cycle: DIVERGES fails the lossless gate
    (recipe memory then refuses it), SLOWER is lossless but slower."""
    home = make_home(tmp_path / "home", build_demo_models(tmp_path / "models"))
    plan = freeze(home, [DIVERGES, SLOWER])
    ids = {pid: list(range(1, 17)) for pid in prompts(plan)}
    first = prompts(plan)[0]
    diverged = {**ids, first: [*ids[first][:5], 99, *ids[first][6:]]}
    runs = [
        CandidateRun(
            candidate=DIVERGES,
            samples=timing(DIVERGES, plan, 14.0),
            greedy=greedy_ids(DIVERGES, plan, diverged),
            peak_memory_gb=0.3,
        ),
        CandidateRun(
            candidate=SLOWER,
            samples=timing(SLOWER, plan, 8.0),
            greedy=greedy_ids(SLOWER, plan, ids),
            peak_memory_gb=0.3,
        ),
    ]
    summary = seal(home, plan, baseline_run(plan, greedy_ids("baseline", plan, ids)), runs)
    return home, summary.cycle_id


def test_only_proposable_candidates_are_offered(planned_home: tuple[Home, str]) -> None:
    home, _ = planned_home
    live = "demo-tiny:draft-k4"  # as after a promotion: the live recipe is a registry variant
    manifest, variant = find_candidate(load_registry(), live)  # type: ignore[misc]
    write_model(home.active_file, resolve_recipe(manifest, variant, home.models, home.hf_cache))
    context = build_context(home)
    offered = [c.id for c in context.runnable]
    refused = {u.id: u.reasons for u in context.unavailable}
    assert DIVERGES not in offered and "recipe memory: " in refused[DIVERGES][0]
    assert live not in offered and refused[live] == ["it is the live recipe"]
    assert offered, "some candidate is still proposable"
    for cid in offered:  # every offered id is accepted by the product itself
        view = app.propose(
            home, {"hypothesis": "h", "candidates": [cid]}, proposed_by="test", dry_run=True
        )
        assert view.accepted and view.candidates == ["baseline", cid], (cid, view.message)
    for cid in refused:
        view = app.propose(
            home, {"hypothesis": "h", "candidates": [cid]}, proposed_by="test", dry_run=True
        )
        assert not view.accepted, cid
    prompt = planning_prompt(context)
    offered_section = prompt.split("## Candidates you may propose", 1)[1].split("\n## ", 1)[0]
    assert f"- {DIVERGES}:" not in offered_section and f"- {live}:" not in offered_section
    assert "it is the live recipe" in prompt and "recipe memory: " in prompt


def test_the_example_is_a_plan_extract_plan_finds_and_propose_accepts(
    planned_home: tuple[Home, str],
) -> None:
    home, _ = planned_home
    context = build_context(home)
    prompt = planning_prompt(context)
    example = plan_example(context)
    assert example is not None and json.dumps(example) in prompt
    found = extract_plan(prompt)  # the product's own extractor, on the prompt as sent
    assert found.plan == example, found.problems
    view = app.propose(home, found.plan, proposed_by="test", dry_run=True)
    assert view.accepted, view.message
    assert "<number>" not in prompt and "mcp-infra://plan-schema" in prompt


def test_figures_are_the_evidence_s_own(planned_home: tuple[Home, str]) -> None:
    home, cycle_id = planned_home
    verdict = read_model(home.bundle_files(cycle_id).verdict, Verdict)
    first = verdict.candidates[0]
    figures = build_context(home).baseline
    assert figures is not None and figures.cycle_id == cycle_id
    assert figures.decode_tps == round(first.baseline_tps or 0, 2)
    assert [(c.request_class, c.concurrency) for c in figures.cells] == [
        (c.request_class, c.concurrency) for c in first.cells
    ]
    for mine, theirs in zip(figures.cells, first.cells, strict=True):
        assert mine.decode_tps == round(theirs.baseline_decode_tps or 0, 2)
        assert mine.ttft_p99_s == round(theirs.baseline_ttft_p99_s or 0, 3)
    assert figures.per_prompt_decode_tps == {
        s.prompt_id: round(s.baseline_tps, 2) for s in first.per_prompt
    }
    prompt = planning_prompt(build_context(home))
    assert f"decode {figures.decode_tps} tok/s" in prompt


def test_reasons_are_never_cut_inside_a_word(planned_home: tuple[Home, str]) -> None:
    home, cycle_id = planned_home
    verdict = read_model(home.bundle_files(cycle_id).verdict, Verdict)
    full = {c.candidate: c.reasons[0] for c in verdict.candidates}
    context = build_context(home)
    shown = [(c.id, h) for c in context.runnable for h in c.history]
    assert shown, "the sealed cycle's candidates carry their history"
    for cid, line in shown:
        reason = line.split(" — ", 1)[1]
        assert reason == whole(full[cid], 240) and full[cid].startswith(reason.removesuffix(" …"))
    text = "Rejected: speedup 0.8x (interval 0.7x to 0.9x) below the required 1.05x; slower."
    for limit in range(3, len(text) + 5):
        short = whole(text, limit)
        assert len(short) <= limit, (limit, short)
        if short != text:
            kept = short.removesuffix("…").rstrip()
            assert text.startswith(kept), (limit, short)
            assert not (kept and kept[-1].isalnum() and text[len(kept)].isalnum()), (limit, short)


def test_the_menu_shows_last_verdicts_and_the_fallback_takes_untried_first(
    planned_home: tuple[Home, str],
) -> None:
    home, cycle_id = planned_home
    verdict = read_model(home.bundle_files(cycle_id).verdict, Verdict)
    decided = {c.candidate: c for c in verdict.candidates}
    menu = menu_of(build_context(home))
    [slower] = [i for i in menu.items if i.id == SLOWER]
    judged = decided[SLOWER]
    assert slower.last_verdict == f"{judged.decision.value} {fmt_pct(judged.speedup_estimate)}"
    untried = [i.id for i in menu.items if i.id not in decided]
    assert untried and all(i.last_verdict is None for i in menu.items if i.id in untried)
    assert f": {slower.title} ({slower.candidate_class}, lossless, last {slower.last_verdict})" in (
        menu_prompt(menu)
    )
    plan = fallback_plan(menu, ["no numbers here"], "why")
    assert plan is not None and plan["candidates"] == [*untried, SLOWER][:3]
