"""The lossy budget: its gates against the baseline, its policy rules, and old plans replayed."""

from __future__ import annotations

import math

import pytest
import yaml

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    Decision,
    EffectiveThresholds,
    Policy,
    QualityBudget,
    QualityBudgets,
    Sample,
    Semantics,
)
from mcp_infra.core.budget import (
    QualityOutputs,
    Resampling,
    frozen_as,
    legacy_fraction,
    lossy_gates,
    may_promote_alone,
    task_gate,
)
from mcp_infra.core.gates import lossy_agreement
from mcp_infra.core.sanitize import policy_hash
from mcp_infra.core.screening import gate_stop
from mcp_infra.core.selector import select
from mcp_infra.procs.sandbox import with_code_run
from mcp_infra.state.catalog import load_policy
from tests.helpers.paths import REPO
from tests.helpers.selector_runs import ALL, BASELINE, PROTOCOL, make_run

DRAWS = Resampling(level=0.95, resamples=400, seed=11)
PLAIN = EffectiveThresholds(
    min_speedup_pct=5.0,
    max_peak_memory_gb=16.0,
    max_error_rate=0.0,
    worst_prompt_tolerance_pct=10.0,
    quality_budget=QualityBudgets(),
)


def budget_of(**limits) -> EffectiveThresholds:
    named = QualityBudgets(classes={CandidateClass.QUANTIZATION: QualityBudget(**limits)})
    return PLAIN.model_copy(update={"quality_budget": named})


def lp(*probs: float) -> list[tuple[int, float]]:
    return [(i, math.log(p)) for i, p in enumerate(probs)]


def side(cid: str, n: int, diverging: int, tops: list | None) -> list[Sample]:
    """``n`` prompts of 4 tokens; the first ``diverging`` part ways at token 2."""
    return [
        Sample(
            candidate=cid,
            prompt_id=f"p{i:02}",
            repeat=0,
            text=f"answer {i}",
            token_ids=[0, 0, 1, 1] if i < diverging else [0, 0, 0, 0],
            top_logprobs=tops,
        )
        for i in range(n)
    ]


def runs(
    n: int = 30, diverging: int = 3, base_top=None, cand_top=None
) -> tuple[CandidateRun, CandidateRun]:
    base = CandidateRun(candidate="baseline", greedy=side("baseline", n, 0, base_top))
    cand = CandidateRun(
        candidate="q:int4",
        candidate_class=CandidateClass.QUANTIZATION,
        semantics=Semantics.LOSSY,
        greedy=side("q:int4", n, diverging, cand_top),
    )
    return base, cand


def test_the_agreement_gate_names_the_budget_the_value_and_its_interval() -> None:
    base, cand = runs(base_top=[lp(0.9, 0.1)] * 4, cand_top=[lp(0.8, 0.2)] * 4)
    thresholds = budget_of(min_identical_share=0.7, max_mean_kl=0.1, min_top_agreement=0.9)
    (gate,) = lossy_gates(base, cand, thresholds, DRAWS, None)
    assert gate.gate == "agreement" and gate.passed, gate.detail
    assert gate.budget == "quality_budget.classes.quantization"
    m = gate.measure
    assert m is not None and m.identical_share.value == pytest.approx(0.9)
    assert m.identical_share.low <= 0.9 <= m.identical_share.high
    assert m.mean_kl is not None and m.top_agreement is not None
    assert "27 of 30 output(s) identical 90%" in gate.detail
    assert "within: identical at least 70%, top-token agreement at least 90%" in gate.detail
    assert len(gate.comparisons) == 30
    strict = budget_of(min_identical_share=0.7, max_mean_kl=0.001)
    (tight,) = lossy_gates(base, cand, strict, DRAWS, None)
    assert not tight.passed and "outside: mean KL at most 0.001" in tight.detail


def test_the_worse_end_of_the_interval_is_held_to_the_budget() -> None:
    base, cand = runs(n=30, diverging=9)  # 70% identical, the interval well below it
    (gate,) = lossy_gates(base, cand, budget_of(min_identical_share=0.65), DRAWS, None)
    assert gate.measure is not None and gate.measure.identical_share.value == pytest.approx(0.7)
    assert not gate.passed and "outside: identical at least 65%" in gate.detail


def test_a_kl_limit_fails_where_the_runtime_gave_no_logprobs_and_is_reported_where_unasked():
    base, cand = runs(base_top=[], cand_top=[])  # asked, none given (mlx_vlm.server)
    thresholds = budget_of(min_identical_share=0.5, max_mean_kl=0.1)
    (gate,) = lossy_gates(base, cand, thresholds, DRAWS, None)
    assert not gate.passed and "the runtime gave no log-probabilities" in gate.detail
    base, cand = runs()  # not asked (a held-out start)
    (gate,) = lossy_gates(base, cand, thresholds, DRAWS, None)
    assert gate.passed and "not measured here (log-probabilities not asked)" in gate.detail


def test_a_missing_prompt_fails_the_agreement_gate() -> None:
    base, cand = runs()
    short = cand.model_copy(update={"greedy": cand.greedy[1:]})
    (gate,) = lossy_gates(base, short, budget_of(min_identical_share=0.0), DRAWS, None)
    assert not gate.passed and "p00: missing from the candidate" in gate.detail


def answers(cid: str, replies: dict[str, str]) -> list[Sample]:
    return [
        with_code_run(Sample(candidate=cid, phase="quality", prompt_id=t, repeat=0, text=r))
        for t, r in replies.items()
    ]


BASE_ANSWERS = {
    "num-add-small": "7 plus 5 is 12.",
    "word-france": "The capital of France is Paris.",
    "code-add": "```python\ndef add(a, b):\n    return a + b\n```",
    "num-hard": "17 multiplied by 23 is 401.",  # the baseline fails this one
}


def test_the_candidate_is_held_to_what_the_baseline_passes_less_its_allowance() -> None:
    cand = {
        **BASE_ANSWERS,
        "word-france": "The capital of France is Istanbul.",
        "num-hard": "It is 391.",
    }
    outputs = QualityOutputs(answers("baseline", BASE_ANSWERS), answers("q:int4", cand))
    gate = task_gate(outputs, "quality_budget.default", QualityBudget())
    assert not gate.passed
    assert "holds 2 of the 3 task(s) the baseline passes (may lose 0" in gate.detail
    assert "lost: word-france: states 'Istanbul' (expected Paris)" in gate.detail
    assert "the baseline fails 1 task(s), not held against it (the candidate passes 1" in (
        gate.detail
    )
    rows = {r.task: (r.baseline, r.candidate) for r in gate.tasks or []}
    assert rows == {
        "code-add": (True, True),
        "num-add-small": (True, True),
        "num-hard": (False, True),
        "word-france": (True, False),
    }
    assert task_gate(outputs, "x", QualityBudget(task_allowance=1)).passed


def test_tasks_a_stopped_start_never_answered_count_as_lost_and_are_said_apart() -> None:
    """A screening start that stopped at its quality gate answered only some tasks: the rest
    count against the candidate (the gate cannot pass on answers it never got), and the detail
    says how many it answered and lost, not a list of "no answer"."""
    cand = {"word-france": "The capital of France is Istanbul."}
    outputs = QualityOutputs(answers("baseline", BASE_ANSWERS), answers("q:int4", cand))
    gate = task_gate(outputs, "quality_budget.default", QualityBudget(task_allowance=1))
    assert not gate.passed
    assert "holds 0 of the 3 task(s) the baseline passes (may lose 1" in gate.detail
    assert "answered 1 of them and lost 1; 2 without an answer count as lost" in gate.detail
    assert "lost: word-france: states 'Istanbul'" in gate.detail
    assert "no answer" not in gate.detail


def test_the_baseline_failing_everything_holds_nothing_but_is_reported() -> None:
    gibberish = {t: "glorp vank" for t in BASE_ANSWERS}
    outputs = QualityOutputs(answers("baseline", gibberish), answers("q:int4", gibberish))
    gate = task_gate(outputs, "quality_budget.default", QualityBudget())
    assert gate.passed and "holds 0 of the 0 task(s)" in gate.detail
    none = task_gate(QualityOutputs([], answers("q:int4", gibberish)), "x", QualityBudget())
    assert not none.passed and "the baseline has no quality answers" in none.detail


def test_a_lossy_candidate_promotes_alone_only_under_a_budget_of_its_own_class() -> None:
    run = make_run("m:q4", 1.5, klass=CandidateClass.QUANTIZATION, semantics=Semantics.LOSSY)
    assert not may_promote_alone(run, PLAIN)
    assert may_promote_alone(run, budget_of(min_identical_share=0.5))
    lossless = make_run("m:d", 1.5, klass=CandidateClass.ACCELERATION_PLUGIN)
    assert may_promote_alone(lossless, PLAIN)
    legacy = PLAIN.model_copy(update={"quality_budget": None, "lossy_min_identical_fraction": 0.5})
    assert may_promote_alone(run, legacy), "old plans: by class alone, as then"
    for thresholds, alone in ((PLAIN, False), (budget_of(min_identical_share=0.5), True)):
        verdict = select(BASELINE, [run], thresholds, PROTOCOL, ALL)
        (judged,) = verdict.candidates
        assert judged.decision == Decision.QUALIFIED, judged.reasons
        assert judged.auto_promote is alone
        assert (verdict.selected == "m:q4") is alone
        agreement = next(g for g in judged.gates if g.gate == "agreement")
        assert agreement.measure is not None
        assert ("a person approves it" in agreement.detail) is not alone


def test_a_plan_frozen_before_budgets_is_judged_as_it_was() -> None:
    base, cand = runs(n=4, diverging=2)
    legacy = PLAIN.model_copy(update={"quality_budget": None, "lossy_min_identical_fraction": 0.5})
    (gate,) = lossy_gates(base, cand, legacy, DRAWS, None)
    assert gate == lossy_agreement(base.greedy, cand.greedy, 0.5)
    assert gate.measure is None and "measure" not in gate.model_dump(exclude_unset=False)


def test_the_budget_lives_in_the_policy_and_the_old_fraction_migrates() -> None:
    data = yaml.safe_load((REPO / "policy" / "default.yaml").read_text())
    data["thresholds"]["lossy_min_identical_fraction"] = 0.8
    migrated = Policy.model_validate(data)
    assert migrated.thresholds.quality_budget.default.min_identical_share == 0.8
    assert legacy_fraction(migrated.thresholds.quality_budget) == 0.8
    data["thresholds"]["quality_budget"] = {"default": {"min_identical_share": 0.9}}
    with pytest.raises(ValueError, match="replaced by quality_budget"):
        Policy.model_validate(data)


def test_a_policy_naming_the_old_fraction_hashes_as_it_did() -> None:
    """The hash of a policy written before budgets is unchanged, and equals that of the same
    policy written with the budget it migrates to, so old plans keep verifying."""
    data = yaml.safe_load((REPO / "policy" / "demo.yaml").read_text())
    old = Policy.model_validate({**data, "thresholds": {**data["thresholds"]}})
    data["thresholds"]["lossy_min_identical_fraction"] = QualityBudget().min_identical_share
    assert policy_hash(Policy.model_validate(data)) == policy_hash(old)
    named = old.model_copy(deep=True)
    named.thresholds.quality_budget.default.max_mean_kl = 0.05
    assert policy_hash(named) != policy_hash(old)


def test_auto_promoting_a_lossy_class_needs_a_budget_of_its_own() -> None:
    data = yaml.safe_load((REPO / "policy" / "default.yaml").read_text())
    data.setdefault("auto_promote", {})["quantization"] = True
    with pytest.raises(ValueError, match="auto_promote is on for quantization"):
        Policy.model_validate(data)
    data["thresholds"]["quality_budget"] = {
        "classes": {"quantization": {"min_identical_share": 0.6, "max_mean_kl": 0.05}}
    }
    assert Policy.model_validate(data).auto_promote[CandidateClass.QUANTIZATION]


def test_every_shipped_policy_judges_lossy_candidates_by_the_quality_suite() -> None:
    for name in ("default", "single-user", "demo"):
        assert load_policy(name).protocol.quality_suite == "quality", name


def test_thresholds_rederived_from_an_old_policy_take_the_plans_form() -> None:
    share = QualityBudget().min_identical_share
    legacy = PLAIN.model_copy(
        update={"quality_budget": None, "lossy_min_identical_fraction": share}
    )
    assert frozen_as(PLAIN, legacy) == legacy
    assert frozen_as(PLAIN, PLAIN) == PLAIN
    named = budget_of(min_identical_share=0.5)
    assert frozen_as(named, legacy) == named, "a real budget stays one (and fails to match)"
    with pytest.raises(ValueError, match="exactly one"):
        EffectiveThresholds(**{**PLAIN.model_dump(), "lossy_min_identical_fraction": 0.5})


def test_a_screening_start_stops_once_lost_tasks_pass_the_allowance() -> None:
    """Between a screening start's quality answers: a lossy candidate that has already lost more
    of the tasks the baseline passes than its budget allows fails its quality gate there (more
    answers cannot win them back); within the allowance, or lossless, it goes on."""
    thresholds = budget_of(task_allowance=1)
    base = BASELINE.model_copy(
        update={"samples": [*BASELINE.samples, *answers("baseline", BASE_ANSWERS)]}
    )
    quantized = make_run("m:q4", 1.2, klass=CandidateClass.QUANTIZATION, semantics=Semantics.LOSSY)

    def after(replies: dict[str, str]) -> CandidateRun:
        return quantized.model_copy(update={"samples": answers("m:q4", replies)})

    wrong = {"num-add-small": "7 plus 5 is 11.", "word-france": "It is Istanbul."}
    one = after({"num-add-small": wrong["num-add-small"], "num-hard": "It is 391."})
    assert gate_stop(base, one, thresholds, PROTOCOL, complete=False) is None  # 1 lost: allowed
    two = after(wrong)
    stop = gate_stop(base, two, thresholds, PROTOCOL, complete=False)
    assert stop is not None and stop.gate == "quality" and not stop.passed
    assert stop.detail.startswith("after 2 of the quality suite's tasks, holds 0 of the 2 task(s)")
    assert "lost: num-add-small: expected 12, got 11" in stop.detail
    # the tasks not asked yet are not counted against it; a lossless run is judged by its tokens
    assert gate_stop(base, after({}), thresholds, PROTOCOL, complete=False) is None
    lossless = two.model_copy(update={"semantics": Semantics.LOSSLESS})
    assert gate_stop(base, lossless, thresholds, PROTOCOL, complete=False) is None
