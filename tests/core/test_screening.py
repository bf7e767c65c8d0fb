"""Screening a plan of many candidates (``core.screening``): which plans are screened, what one
short start drops and why, what a start's gate check ends, and the verdict that records it."""

from __future__ import annotations

from datetime import UTC, datetime

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    Decision,
    LearnedSpread,
    MachineLoad,
    RoundRecord,
    Semantics,
)
from mcp_infra.core.screening import (
    SCREEN_CONFIDENCE,
    SCREEN_FROM,
    gate_stop,
    screen,
    screening_view,
    screening_words,
    screens,
    select_screened,
)
from mcp_infra.flows.projection import simulated_plan
from mcp_infra.state.catalog import load_policy
from tests.helpers.selector_runs import ALL, PROTOCOL, THRESHOLDS, TOKENS, make_run

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUSY = MachineLoad(window_s=10, cpus=2, other_cpu_s=12, other_cpu_fraction=0.6)


def first_start(
    run: CandidateRun, *, busy: bool = False, peak: float | None = None
) -> CandidateRun:
    """``run`` as one screening start: its start 0 (round 0) alone, with its round record."""
    record = RoundRecord(
        config=run.candidate,
        start=0,
        round=0,
        started_at=T0,
        ended_at=T0,
        machine=BUSY if busy else None,
        peak_gb=peak,
    )
    return run.model_copy(
        update={"samples": [s for s in run.samples if s.start == 0], "rounds": [record]}
    )


BASE = first_start(make_run(BASELINE_ID, klass=None))


def test_plans_of_four_candidates_or_more_are_screened() -> None:
    policy = load_policy("single-user")
    few = simulated_plan(policy, [f"m:c{i}" for i in range(SCREEN_FROM - 1)])
    many = simulated_plan(policy, [f"m:c{i}" for i in range(SCREEN_FROM)])
    assert not screens(few) and screens(many)


def test_only_a_clear_loser_is_dropped_and_the_rule_is_said() -> None:
    runs = [
        first_start(make_run("m:slow", 0.6)),  # far below the 1.05x threshold
        first_start(make_run("m:near", 0.97)),  # below it, but one start cannot tell
        first_start(make_run("m:fast", 1.5)),
    ]
    result = screen(BASE, runs, THRESHOLDS, PROTOCOL)
    assert result.judged == ["m:slow", "m:near", "m:fast"] and result.held == []
    assert list(result.dropped) == ["m:slow"]
    why = result.dropped["m:slow"]
    assert why.startswith("too slow: speedup 0.600x in one start a side (99% interval")
    assert "assumed start spread 5%" in why and "wholly below the required 1.050x" in why
    assert result.confidence == SCREEN_CONFIDENCE


def test_a_learned_spread_narrows_the_screening_interval() -> None:
    # 0.9x: under the assumed 5% a side the 99% interval reaches past 1.05x; a learned 2% does
    # not, so the same start is a clear loser there.
    runs = [first_start(make_run("m:c", 0.9))]
    assert not screen(BASE, runs, THRESHOLDS, PROTOCOL).dropped
    learned = PROTOCOL.model_copy(update={"learned_spread": LearnedSpread(sd=0.02, df=20)})
    dropped = screen(BASE, runs, THRESHOLDS, learned).dropped
    assert "learned start spread 2.0%" in dropped["m:c"]


def test_a_failed_gate_is_dropped_even_on_a_busy_machine_and_speed_is_not_judged_there() -> None:
    diverging = make_run("m:div", 1.5, greedy_ids={"p1": [*TOKENS[:3], 99, *TOKENS[4:]]})
    runs = [first_start(diverging, busy=True), first_start(make_run("m:slow", 0.5), busy=True)]
    result = screen(BASE, runs, THRESHOLDS, PROTOCOL, busy_line=0.25)
    assert result.dropped == {"m:div": "the lossless gate failed"}
    assert result.held == ["m:slow"] and result.judged == ["m:div"]
    # The baseline's own busy start holds every speed judgement.
    busy_base = first_start(make_run(BASELINE_ID, klass=None), busy=True)
    quiet = [first_start(make_run("m:slow", 0.5))]
    assert screen(busy_base, quiet, THRESHOLDS, PROTOCOL, busy_line=0.25).held == ["m:slow"]


def test_memory_is_judged_from_the_screening_start_alone() -> None:
    run = first_start(make_run("m:big", 1.5), peak=40.0)
    assert screen(BASE, [run], THRESHOLDS, PROTOCOL).dropped == {"m:big": "the memory gate failed"}
    # A later start's peak does not move what screening saw (evidence verify recomputes it).
    later = run.model_copy(
        update={"rounds": [*run.rounds, run.rounds[0].model_copy(update={"round": 1, "start": 1})]}
    )
    assert screening_view(later).peak_memory_gb == 40.0


def test_a_start_that_died_or_never_started_is_left_to_the_full_decision() -> None:
    died = first_start(make_run("m:died", 0.5))
    died = died.model_copy(update={"rounds": [died.rounds[0].model_copy(update={"error": "x"})]})
    never = CandidateRun(candidate="m:never", started=False, start_error="no")
    result = screen(BASE, [died, never], THRESHOLDS, PROTOCOL)
    assert result.judged == [] and result.dropped == {}


def test_a_gate_check_ends_a_lossless_start_at_its_first_divergence_only() -> None:
    base = make_run(BASELINE_ID, klass=None)
    partial = make_run("m:c", greedy_ids={"p1": [11, 12, 99]})
    partial = partial.model_copy(update={"greedy": partial.greedy[:1], "samples": []})
    stop = gate_stop(base, partial, THRESHOLDS, PROTOCOL, complete=False)
    assert stop is not None and stop.gate == "lossless" and "p1 diverges" in stop.detail
    # Prompts not answered yet are no failure; nor is a lossy start before all answers are in.
    same = make_run("m:c").model_copy(update={"samples": []})
    same = same.model_copy(update={"greedy": same.greedy[:1]})
    assert gate_stop(base, same, THRESHOLDS, PROTOCOL, complete=False) is None
    lossy = partial.model_copy(update={"semantics": Semantics.LOSSY})
    assert gate_stop(base, lossy, THRESHOLDS, PROTOCOL, complete=False) is None
    whole = make_run("m:c", greedy_ids={p: [99] for p in ("p1", "p2", "p3")})
    whole = whole.model_copy(update={"semantics": Semantics.LOSSY, "samples": []})
    stop = gate_stop(base, whole, THRESHOLDS, PROTOCOL, complete=True)
    assert stop is not None and stop.gate == "agreement"


def test_the_verdict_rejects_what_screening_dropped_and_decides_the_rest() -> None:
    slow, fast = make_run("m:slow", 0.6, starts=1), make_run("m:fast", 1.6)
    runs = [first_start(slow), fast]
    result = screen(BASE, runs, THRESHOLDS, PROTOCOL)
    base = make_run(BASELINE_ID, klass=None)
    verdict = select_screened(base, [slow, fast], THRESHOLDS, PROTOCOL, ALL, result)
    by = {v.candidate: v for v in verdict.candidates}
    assert [v.candidate for v in verdict.candidates] == ["m:slow", "m:fast"]
    assert by["m:slow"].decision == Decision.REJECTED
    assert by["m:slow"].reasons[0].startswith("Dropped by screening after one start: too slow")
    assert verdict.selected == "m:fast" and verdict.screening == result
    assert verdict.reason.endswith("; screening dropped m:slow after one start each")
    words = screening_words(result, 2)
    assert words.startswith("screening dropped 1 of 2 candidate(s) after one start each (m:slow:")
    assert words.endswith("; 1 go(es) on to the full decision")


def test_evidence_show_lists_what_screening_dropped_and_why() -> None:
    from mcp_infra.faces.render import screening_lines

    runs = [first_start(make_run("m:slow", 0.6)), first_start(make_run("m:fast", 1.5))]
    result = screen(BASE, runs, THRESHOLDS, PROTOCOL)
    base = make_run(BASELINE_ID, klass=None)
    verdict = select_screened(base, runs, THRESHOLDS, PROTOCOL, ALL, result)
    lines = screening_lines(verdict)
    assert lines[0] == "screening (99%, one short start each): dropped 1 of 2"
    assert lines[1].startswith("    m:slow: too slow: speedup 0.600x in one start a side")
    assert screening_lines(verdict.model_copy(update={"screening": None})) == []


def test_a_candidate_whose_gates_wait_is_judged_on_speed_alone_and_never_qualified() -> None:
    from mcp_infra.core.judging import awaiting_gates
    from mcp_infra.core.selector import select

    base = make_run(BASELINE_ID, klass=None)
    fast = make_run("m:fast", 1.5)
    waiting = fast.model_copy(update={"greedy": []})
    slow = make_run("m:slow", 0.6).model_copy(update={"greedy": []})
    assert awaiting_gates(waiting) and not awaiting_gates(fast)
    judged = {
        v.candidate: v
        for v in select(base, [waiting, slow], THRESHOLDS, PROTOCOL, ALL, interim=True).candidates
    }
    pending = judged["m:fast"]
    assert pending.decision == Decision.INCONCLUSIVE and pending.gates_pending
    assert not pending.gates and pending.reasons[0].startswith("Qualifies on speed (speedup 1.5")
    assert "not qualified before they pass" in pending.reasons[0]
    # A rejection on speed stands and needed no gate; its verdict says they were not taken.
    assert judged["m:slow"].decision == Decision.REJECTED and not judged["m:slow"].gates_pending
    assert judged["m:slow"].reasons[-1].startswith("Its gates were not taken")
    # The same timed samples with the gates taken qualify, and so are selected.
    verdict = select(base, [fast], THRESHOLDS, PROTOCOL, ALL)
    assert verdict.selected == "m:fast" and not verdict.candidates[0].gates_pending
    # Without its gates it is never selected, in a final call too.
    assert select(base, [waiting], THRESHOLDS, PROTOCOL, ALL).selected is None


def test_a_quality_answer_counts_as_gates_taken() -> None:
    """Either kind of gate output, a greedy answer or a quality answer, means a run's gates
    were taken: the gates judge it, not its speed alone."""
    from mcp_infra.contracts import Sample
    from mcp_infra.core.judging import awaiting_gates

    run = make_run("m:lossy", 1.5, semantics=Semantics.LOSSY).model_copy(update={"greedy": []})
    answer = Sample(candidate="m:lossy", prompt_id="q1", repeat=0, phase="quality", text="x")
    assert awaiting_gates(run)
    assert not awaiting_gates(run.model_copy(update={"samples": [*run.samples, answer]}))
