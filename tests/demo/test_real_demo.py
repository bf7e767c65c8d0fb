"""`mcp-infra demo --real`: what it proposes from the catalog generated for the live model, and
the quality table it prints (fast: pure functions over the catalog and a verdict; the whole demo
runs in tests/e2e/test_real_demo.py)."""

from __future__ import annotations

import pytest

from mcp_infra.contracts import (
    Decision,
    GateResult,
    Interval,
    QualityBudget,
    QualityBudgets,
    QualityMeasure,
    TaskOutcome,
    Verdict,
)
from mcp_infra.contracts.verdicts import CandidateVerdict
from mcp_infra.core import catalog
from mcp_infra.demo.real import DemoRefused, plan_candidates, quality_lines
from tests.core.test_catalog import facts, folder

UNQUANTIZED = folder(
    "/models/mine", 1_000_000, hidden_size=64, intermediate_size=128, dtype="bfloat16"
)


def test_the_plan_is_an_8_bit_a_4_bit_an_mxfp4_build_and_a_server_setting() -> None:
    manifests, _ = catalog.generate(facts(target=UNQUANTIZED, compute_dtype="float32"))
    assert plan_candidates(manifests) == [
        "own-builds:q8-g64-affine-f32",
        "own-builds:q4-g64-affine-f32",
        "own-builds:q4-g32-mxfp4-f32",
        "own-settings:pcache-off",
    ]


def test_a_catalog_without_builds_is_refused_naming_what_is_missing() -> None:
    four_bit = folder(
        "/models/q4", 300_000, hidden_size=64, intermediate_size=128, quantized={"bits": 4}
    )
    manifests, _ = catalog.generate(facts(target=four_bit, others=[]))  # no source: no builds
    with pytest.raises(DemoRefused, match="no q8, q4, mxfp4 candidate"):
        plan_candidates(manifests)


def _measure(identical: float, kl: float) -> QualityMeasure:
    return QualityMeasure(
        pairs=40,
        prompts=39,
        unit="tokens",
        identical_share=Interval(value=identical, low=identical - 0.1, high=identical + 0.05),
        prefix_length=Interval(value=20.0, low=17.5, high=22.5),
        mean_kl=Interval(value=kl, low=kl / 2, high=kl * 2),
        top_agreement=Interval(value=0.98, low=0.96, high=0.99),
        positions=800,
        top_k=10,
        level=0.95,
        resamples=1000,
    )


def _candidate(
    cid: str, decision: Decision, measure: QualityMeasure, lost: bool
) -> CandidateVerdict:
    path = "quality_budget.classes.quantization"
    tasks = [
        TaskOutcome(task="word-japan", baseline=True, candidate=not lost, detail="Kyoto: wrong"),
        TaskOutcome(task="word-france", baseline=True, candidate=not lost, detail="Istanbul"),
        TaskOutcome(task="num-hard", baseline=False, candidate=False, detail="312"),
    ]
    return CandidateVerdict(
        candidate=cid,
        decision=decision,
        reasons=[],
        gates=[
            GateResult(gate="agreement", passed=True, detail="", budget=path, measure=measure),
            GateResult(gate="quality", passed=not lost, detail="", budget=path, tasks=tasks),
        ],
    )


def test_the_quality_table_shows_each_measure_the_budget_and_the_first_wrong_answer() -> None:
    verdict = Verdict(
        candidates=[
            _candidate("own-builds:q8", Decision.QUALIFIED, _measure(0.9, 0.004), lost=False),
            _candidate("own-builds:mxfp4", Decision.REJECTED, _measure(0.1, 0.9), lost=True),
            CandidateVerdict(
                candidate="own-settings:pcache-off",
                decision=Decision.REJECTED,
                reasons=[],
                gates=[GateResult(gate="lossless", passed=True, detail="identical")],
            ),
        ],
        selected=None,
        reason="",
    )
    budgets = QualityBudgets(
        classes={
            "quantization": QualityBudget(
                min_identical_share=0.5, min_top_agreement=0.9, max_mean_kl=0.05
            )
        }
    )
    order = {"word-france": 0, "word-japan": 1, "num-hard": 2}
    text = "\n".join(quality_lines(verdict, budgets, order))
    q8, mx = (line for line in text.splitlines() if line.startswith("own-builds:"))
    assert "0.90 [0.80, 0.95]" in q8 and "0.004 [0.002, 0.008]" in q8
    assert q8.endswith("2/2 of 3  qualified")
    assert "0.10 [0.00, 0.15]" in mx and mx.endswith("0/2 of 3  rejected")
    # the suite's first task lost, not the alphabetically first; the server setting has no row
    assert "first wrong answer: word-france: Istanbul" in text
    assert "pcache-off" not in text
    # a build whose start stopped at its quality gate: the tasks never asked are said apart,
    # and the first wrong answer is one it gave
    stopped = _candidate("own-builds:q3", Decision.REJECTED, _measure(0.1, 0.9), lost=True)
    gate = stopped.gates[1]
    unasked = TaskOutcome(task="word-france", baseline=True, candidate=None, detail="no answer")
    tasks = gate.tasks or []
    gate = gate.model_copy(update={"tasks": [tasks[0], unasked, tasks[2]]})
    stopped = stopped.model_copy(update={"gates": [stopped.gates[0], gate]})
    lines = quality_lines(Verdict(candidates=[stopped], selected=None, reason=""), budgets, order)
    (q3,) = (line for line in lines if line.startswith("own-builds:q3"))
    assert q3.endswith("0/1 asked, 1 not, of 2  rejected")
    assert "first wrong answer: word-japan: Kyoto: wrong" in "\n".join(lines)
    assert (
        "budget quality_budget.classes.quantization: identical share >= 0.50, top-1 agreement "
        ">= 0.90, mean KL <= 0.05, at most 0 task(s) the baseline passes lost" in text
    )
