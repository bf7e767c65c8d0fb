"""Issue 10: decisions that see server starts, the A/A noise floor, worst-prompt intervals, drift
that fails closed, workload cells, early-stopping levels, and what each verdict records."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from mcp_infra.contracts import (
    CandidateRun,
    CandidateVerdict,
    Decision,
    Knobs,
    Sample,
    Semantics,
    WorkloadCell,
)
from mcp_infra.core.intervals import ASSUMED_START_NOISE, look_level, t_quantile
from mcp_infra.core.judging import cell_words, headline_cell
from mcp_infra.core.selector import select
from mcp_infra.core.stats import SummaryOptions, speedup_summary
from tests.helpers.selector_runs import ALL, BASELINE, PROTOCOL, THRESHOLDS, make_run, only


def decide(runs, baseline=BASELINE, protocol=PROTOCOL, thresholds=THRESHOLDS, **kw):
    return select(baseline, runs, thresholds, protocol, ALL, **kw)


# ------------------------------------------------------------------ statistics over starts


def test_t_quantile_matches_tables() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-3)
    assert t_quantile(0.975, 6) == pytest.approx(2.4469, abs=1e-3)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


def _two_level(cid: str, factor: float, spread: tuple[float, ...]) -> list[Sample]:
    noise = (0.99, 1.0, 1.01)
    return [
        Sample(
            candidate=cid,
            prompt_id=p,
            repeat=i,
            start=st,
            decode_tps=100.0 * factor * spread[st] * n,
            completion_tokens=64,
        )
        for st in range(len(spread))
        for p in ("p1", "p2", "p3")
        for i, n in enumerate(noise)
    ]


def test_start_to_start_spread_widens_the_interval() -> None:
    """The old bootstrap saw only repeats; a whole process running faster or slower must show."""
    tight = speedup_summary(
        _two_level("baseline", 1.0, (1.0, 1.0, 1.0)),
        _two_level("x:y", 1.2, (1.0, 1.0, 1.0)),
        SummaryOptions(resamples=200),
    )
    spread = speedup_summary(
        _two_level("baseline", 1.0, (0.92, 1.0, 1.08)),
        _two_level("x:y", 1.2, (1.08, 0.92, 1.0)),
        SummaryOptions(resamples=200),
    )
    assert tight.estimate == pytest.approx(1.2) and spread.estimate == pytest.approx(1.2, rel=1e-3)
    assert spread.ci_high / spread.ci_low > 1.1 > tight.ci_high / tight.ci_low
    assert spread.baseline_starts == spread.candidate_starts == 3
    # The baseline against itself differs by several percent: that is its noise floor.
    assert spread.noise_floor > 1.03 and tight.noise_floor == pytest.approx(1.0)
    for p in spread.per_prompt:
        assert p.ci_low < p.speedup < p.ci_high


def test_summary_is_seeded_and_reproducible() -> None:
    base = _two_level("baseline", 1.0, (0.95, 1.05))
    cand = _two_level("x:y", 1.1, (1.0,))
    one = speedup_summary(base, cand, SummaryOptions(resamples=200, seed=3))
    two = speedup_summary(base, cand, SummaryOptions(resamples=200, seed=3))
    assert one == two


def test_look_level_spends_the_error_rate_over_the_looks() -> None:
    assert look_level(0.95, 4, 4, 4) == 0.95  # a fixed protocol: one look
    levels = [look_level(0.95, n, 2, 4) for n in (2, 3, 4)]
    assert levels[0] == levels[1] > levels[2]
    assert sum(1 - lv for lv in levels) == pytest.approx(0.05)
    many = [look_level(0.95, n, 1, 20) for n in range(1, 21)]
    assert sum(1 - lv for lv in many) == pytest.approx(0.05)
    assert 1 - many[-1] >= 0.025


# ------------------------------------------------------------------ the A/A noise floor


def test_candidate_must_clear_the_noise_floor_not_just_the_threshold() -> None:
    # The baseline's own starts differ by about 10%; a candidate measured in tight starts at
    # 1.115x clears the 5% threshold with its interval's lower bound, but not the floor (a fixed
    # protocol of 12 starts: the interval at the full confidence, whatever the defaults).
    wobbly = make_run("baseline", klass=None, spread=(0.9, 1.0, 1.1) * 4)
    fixed = PROTOCOL.model_copy(update={"min_starts": 12, "max_starts": 12})
    wide = THRESHOLDS.model_copy(update={"worst_prompt_tolerance_pct": 50})

    def tight(factor: float) -> CandidateVerdict:
        run = make_run("m:tight", factor, noise=(1.0, 1.0, 1.0), spread=(1.0,) * 12)
        return only(decide([run], baseline=wobbly, protocol=fixed, thresholds=wide))

    cv = tight(1.115)
    assert cv.noise_floor is not None and 1.05 <= cv.ci_low < cv.noise_floor
    assert cv.decision == Decision.INCONCLUSIVE
    assert any("clears the threshold but not the A/A noise floor" in r for r in cv.reasons)
    clear = tight(1.15)
    assert clear.noise_floor == pytest.approx(cv.noise_floor)  # the baseline's, not the run's
    assert clear.ci_low >= clear.noise_floor and clear.decision == Decision.QUALIFIED


def test_single_baseline_start_is_explicit_and_conservative() -> None:
    single = make_run("baseline", klass=None, starts=1)
    cv = only(decide([make_run("m:fast", 1.5, starts=1)], baseline=single))
    assert cv.noise_floor_assumed and cv.baseline_starts == 1
    z = NormalDist().inv_cdf((1 + PROTOCOL.confidence) / 2)  # 2.054 at the default 96%
    assert cv.noise_floor == pytest.approx(math.exp(z * math.sqrt(2) * ASSUMED_START_NOISE))
    assert any("single server start" in r and "assumed 5%" in r for r in cv.reasons)
    assert cv.decision == Decision.QUALIFIED  # a large gain still clears it
    small = only(decide([make_run("m:small", 1.10, starts=1)], baseline=single))
    assert small.decision == Decision.INCONCLUSIVE  # with 3 tight starts it would qualify
    assert only(decide([make_run("m:small", 1.10)])).decision == Decision.QUALIFIED


# ------------------------------------------------------------------ worst prompt, regression


def test_prompt_interval_straddling_the_floor_is_inconclusive() -> None:
    run = make_run(
        "m:uneven",
        {"p1": 1.6, "p2": 1.6, "p3": 0.88},
        noise=(0.85, 1.0, 1.15),
        spread=(0.97, 1.0, 1.03),
    )
    cv = only(decide([run]))
    p3 = next(p for p in cv.per_prompt if p.prompt_id == "p3")
    assert p3.ci_low < 0.9 <= p3.ci_high
    assert cv.decision == Decision.INCONCLUSIVE
    assert any("prompt p3" in r and "straddles" in r for r in cv.reasons)


def test_prompt_interval_wholly_below_the_floor_rejects() -> None:
    run = make_run("m:uneven", {"p1": 1.6, "p2": 1.6, "p3": 0.7}, noise=(0.98, 1.0, 1.02))
    cv = only(decide([run]))
    p3 = next(p for p in cv.per_prompt if p.prompt_id == "p3")
    assert p3.ci_high < 0.9
    assert cv.decision == Decision.REJECTED
    assert cv.reasons[0].startswith("Regressing prompt: prompt p3 ran at 0.700x")


# ------------------------------------------------------------------ drift fails closed


def test_drift_check_without_drift_samples_is_inconclusive() -> None:
    on = PROTOCOL.model_copy(update={"drift_check": True, "drift_tolerance_pct": 4.0})
    verdict = decide([make_run("m:fast", 1.5)], protocol=on)
    cv = only(verdict)
    assert cv.decision == Decision.INCONCLUSIVE and verdict.selected is None
    assert any("not re-measured" in r and "no drift samples" in r for r in cv.reasons)


def test_failed_drift_samples_are_inconclusive() -> None:
    on = PROTOCOL.model_copy(update={"drift_check": True, "drift_tolerance_pct": 4.0})
    again = [s.model_copy(update={"phase": "drift"}) for s in BASELINE.samples]
    again[0] = again[0].model_copy(update={"error": "connection refused", "decode_tps": None})
    base = BASELINE.model_copy(update={"samples": [*BASELINE.samples, *again]})
    cv = only(decide([make_run("m:fast", 1.5)], baseline=base, protocol=on))
    assert cv.decision == Decision.INCONCLUSIVE
    assert any(
        "drift re-measurements of the baseline failed" in r and "connection refused" in r
        for r in cv.reasons
    )
    clean = [s.model_copy(update={"phase": "drift"}) for s in BASELINE.samples]
    ok = BASELINE.model_copy(update={"samples": [*BASELINE.samples, *clean]})
    assert only(decide([make_run("m:fast", 1.5)], baseline=ok, protocol=on)).decision == (
        Decision.QUALIFIED
    )


def test_interim_calls_leave_the_drift_check_to_the_final_one() -> None:
    on = PROTOCOL.model_copy(update={"drift_check": True, "drift_tolerance_pct": 4.0})
    cv = only(decide([make_run("m:fast", 1.5)], protocol=on, interim=True))
    assert cv.decision == Decision.QUALIFIED
    assert any("Drift check pending" in r for r in cv.reasons)


# ------------------------------------------------------------------ ties


def test_tie_prefers_lossless_before_lossy_then_cheaper_knobs() -> None:
    lossy = make_run("m:a-kv", 1.51, semantics=Semantics.LOSSY, knobs=Knobs(kv_bits=8))
    lossless = make_run("m:z-draft", 1.50, knobs=Knobs(draft=True, num_draft_tokens=4))
    verdict = decide([lossy, lossless])
    assert all(v.decision == Decision.QUALIFIED for v in verdict.candidates)
    assert lossy.knobs.cost_key() < lossless.knobs.cost_key()
    assert verdict.selected == "m:z-draft"  # the lossless drafter, although its knobs cost more
    assert "preferred over 1 tied candidate(s)" in verdict.reason


# ------------------------------------------------------------------ workload cells


def _cell_samples(
    cid: str,
    request_class: str,
    concurrency: int,
    tps: float,
    starts: int = 2,
    wall_per_request: float = 1.0,
) -> list[Sample]:
    """``concurrency`` requests at a time; each batch takes ``wall_per_request`` seconds."""
    rows = []
    for st in range(starts):
        t = 1000.0 * st
        for i, p in enumerate(("p1", "p2", "p3")):
            for r in range(3):
                batch = (i * 3 + r) // concurrency
                rows.append(
                    Sample(
                        candidate=cid,
                        prompt_id=p,
                        repeat=r,
                        start=st,
                        round=st,
                        request_class=request_class,
                        concurrency=concurrency,  # type: ignore[arg-type]
                        decode_tps=tps * (1 + 0.01 * r),
                        completion_tokens=64,
                        ttft_s=0.1,
                        t_mono=t + batch * wall_per_request,
                        e2e_s=wall_per_request,
                    )
                )
    return rows


def _workload_run(cid: str, c4_wall: float, klass=None) -> CandidateRun:
    from mcp_infra.contracts import CandidateClass

    rows = _cell_samples(
        cid,
        "short",
        1,
        150.0 if cid != "baseline" else 100.0,
        wall_per_request=1.0 if cid == "baseline" else 0.67,
    )
    rows += _cell_samples(cid, "short", 4, 90.0, wall_per_request=c4_wall)
    greedy = [
        Sample(
            candidate=cid,
            prompt_id=p,
            repeat=0,
            text="a plain answer, no loop",
            token_ids=[1, 2, 3],
        )
        for p in ("p1", "p2", "p3")
    ]
    return CandidateRun(
        candidate=cid,
        candidate_class=klass
        or (None if cid == "baseline" else CandidateClass.ACCELERATION_PLUGIN),
        samples=rows,
        greedy=greedy,
    )


def _workload(c4_role: str):
    return PROTOCOL.model_copy(
        update={
            "workload": [
                WorkloadCell(request_class="short", concurrency=1),
                WorkloadCell(request_class="short", concurrency=4, role=c4_role),  # type: ignore[arg-type]
            ]
        }
    )


def test_decisive_cell_that_loses_blocks_and_says_where() -> None:
    base = _workload_run("baseline", c4_wall=1.0)
    cand = _workload_run("m:draft", c4_wall=1.8)  # 4 in flight: 0.55x the aggregate output
    verdict = decide([cand], baseline=base, protocol=_workload("decisive"))
    cv = only(verdict)
    assert cv.decision == Decision.REJECTED and verdict.selected is None
    assert cv.speedup_estimate == pytest.approx(1.5, rel=0.02)  # headline: 1 short at a time
    c4 = next(c for c in cv.cells if c.concurrency == 4)
    assert c4.status == "regressed" and c4.role == "decisive" and not c4.headline
    assert c4.output_ratio == pytest.approx(1 / 1.8, rel=0.02)
    assert any(
        r.startswith(
            "Lost at a decisive workload cell: at 4 concurrent short requests "
            "the candidate gives 0.56x the baseline's aggregate output tok/s"
        )
        for r in cv.reasons
    )


def test_reported_cell_is_shown_but_never_blocks() -> None:
    base = _workload_run("baseline", c4_wall=1.0)
    cand = _workload_run("m:draft", c4_wall=1.8)
    verdict = decide([cand], baseline=base, protocol=_workload("reported"))
    cv = only(verdict)
    assert cv.decision == Decision.QUALIFIED and verdict.selected == "m:draft"
    head = next(c for c in cv.cells if c.headline)
    assert (head.request_class, head.concurrency) == ("short", 1)
    assert head.baseline_ttft_p50_s == pytest.approx(0.1) and head.candidate_ttft_p99_s == (
        pytest.approx(0.1)
    )
    c4 = next(c for c in cv.cells if c.concurrency == 4)
    assert c4.role == "reported" and c4.status == "regressed"
    assert c4.baseline_output_tps is not None and c4.candidate_output_tps is not None
    assert any(
        r.startswith(
            "Reported, not decisive: at 4 concurrent short requests the candidate gives 0.56x"
        )
        for r in cv.reasons
    )


def test_decisive_cell_the_candidate_skipped_rejects() -> None:
    base = _workload_run("baseline", c4_wall=1.0)
    cand = _workload_run("m:draft", c4_wall=1.0)
    cand = cand.model_copy(update={"samples": [s for s in cand.samples if s.concurrency == 1]})
    cv = only(decide([cand], baseline=base, protocol=_workload("decisive")))
    assert cv.decision == Decision.REJECTED
    assert next(c for c in cv.cells if c.concurrency == 4).status == "unmeasured"


def test_headline_cell_and_words() -> None:
    base = _workload_run("baseline", c4_wall=1.0)
    only4 = base.model_copy(update={"samples": [s for s in base.samples if s.concurrency == 4]})
    assert headline_cell(base, base, PROTOCOL) == ("short", 1)
    assert headline_cell(only4, only4, PROTOCOL) == ("short", 4)
    assert headline_cell(CandidateRun(candidate="baseline"), base, PROTOCOL) is None
    assert cell_words("short", 4) == "4 concurrent short requests"
    assert cell_words("long_prefill", 1) == "one long-prefill request at a time"


# ------------------------------------------------------------------ records


def test_verdict_records_starts_rounds_and_requests() -> None:
    cv = only(decide([make_run("m:fast", 1.5, errors=0)]))
    assert (cv.starts_used, cv.rounds_used, cv.requests_used, cv.baseline_starts) == (3, 3, 27, 3)
    p = PROTOCOL
    assert cv.interval_level == pytest.approx(
        look_level(p.confidence, 3, p.min_starts, p.max_starts)
    )
    assert cv.cells and cv.cells[0].headline


def test_old_verdicts_still_parse() -> None:
    old = {
        "candidate": "m:x",
        "decision": "qualified",
        "reasons": ["Qualified."],
        "per_prompt": [
            {"prompt_id": "p1", "baseline_tps": 1.0, "candidate_tps": 2.0, "speedup": 2.0}
        ],
    }
    cv = CandidateVerdict.model_validate(old)
    assert cv.cells == [] and cv.starts_used == 0 and cv.noise_floor is None
