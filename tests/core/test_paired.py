"""Paired starts (``MeasureProtocol.paired``, decision method 6): the statistics of a round whose
configurations ran at once, the aggregate rate of batches that alternate in one window, the
memory rule that allows it, and the round loop over simulated paired starts."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateClass,
    CandidateRun,
    ConfigTruth,
    Decision,
    Knobs,
    LearnedSpread,
    Recipe,
    Sample,
    TargetProfile,
)
from mcp_infra.core.admission import together_fits
from mcp_infra.core.selector import drift_checked, select
from mcp_infra.core.stats import paired_log_interval
from mcp_infra.core.workload import output_tps_by_start
from mcp_infra.flows.projection import NullJournal, SimServer, simulated_plan
from mcp_infra.flows.rounds import Bench, heldout_check, run_rounds
from mcp_infra.state.catalog import load_policy
from tests.helpers.paths import BENCHMARKS
from tests.helpers.selector_runs import (
    ALL,
    PROMPTS,
    PROTOCOL,
    THRESHOLDS,
    make_run,
    measure,
    only,
)


def _protocol(paired: bool):
    """One look at four starts: the early-stopping levels are not what these tests are about."""
    return PROTOCOL.model_copy(update={"paired": paired, "min_starts": 4, "max_starts": 4})


def _run(cid: str, factor: float, per_start: list[float]) -> CandidateRun:
    """Three prompts, three repeats each, every start as slow or fast as ``per_start`` says."""
    klass = None if cid == BASELINE_ID else CandidateClass.SERVER_TUNING
    run = make_run(cid, factor, klass=klass)
    tps = {p: [100.0 * factor * n for n in (0.99, 1.0, 1.01)] for p in PROMPTS}
    return run.model_copy(
        update={"samples": measure(cid, tps, starts=len(per_start), spread=tuple(per_start))}
    )


def _case(seed: int, factor: float) -> tuple[CandidateRun, CandidateRun]:
    """Four rounds under load that comes and goes (a log sd of 0.3 shared by the round's two
    configurations) and a 3% process-to-process spread of each configuration's own."""
    rng = random.Random(seed)
    shared = [math.exp(rng.gauss(0.0, 0.3)) for _ in range(4)]
    own = [[math.exp(rng.gauss(0.0, 0.03)) for _ in range(4)] for _ in range(2)]
    base = _run("baseline", 1.0, [s * o for s, o in zip(shared, own[0], strict=True)])
    cand = _run("m:cand", factor, [s * o for s, o in zip(shared, own[1], strict=True)])
    return base, cand


def _decide(base: CandidateRun, cand: CandidateRun, paired: bool, method: int = 6):
    return only(select(base, [cand], THRESHOLDS, _protocol(paired), ALL, method=method))


def test_paired_rounds_cancel_the_load_the_round_shared() -> None:
    """A true 1.3x under load that swings 30% from round to round: judged as independent starts
    the interval spans the load and decides nothing; judged by round it qualifies."""
    base, cand = _case(1, 1.3)
    unpaired, paired = _decide(base, cand, False), _decide(base, cand, True)
    assert unpaired.decision == Decision.INCONCLUSIVE, unpaired.reasons
    assert paired.decision == Decision.QUALIFIED, paired.reasons
    assert paired.ci_high / paired.ci_low < (unpaired.ci_high / unpaired.ci_low) / 3
    assert "paired by start over 4 starts" in " ".join(paired.reasons)
    # method 5 knows no pairing: a verifier replaying an older verdict gets the unpaired one
    assert _decide(base, cand, True, method=5).model_dump() == unpaired.model_dump()


def test_paired_rounds_still_hold_the_error_rate_on_a_null_candidate() -> None:
    """The same candidate under another name, under the same load: never qualified over 60
    made-up cycles, while a true 1.3x qualifies in nearly all of them."""
    null = [_decide(*_case(seed, 1.0), True).decision for seed in range(60)]
    real = [_decide(*_case(seed, 1.3), True).decision for seed in range(60)]
    assert Decision.QUALIFIED not in null
    assert real.count(Decision.QUALIFIED) >= 57, real


def test_only_the_starts_both_sides_measured_are_paired() -> None:
    """A baseline measured in more rounds than a candidate (it stopped, decided): the pairs are
    the rounds they shared, and the paired figures use those alone."""
    base, cand = _case(2, 1.3)
    shorter = cand.model_copy(update={"samples": [s for s in cand.samples if s.start < 3]})
    verdict = _decide(base, shorter, True)
    assert "paired by start over 3 starts" in " ".join(verdict.reasons)
    assert "3 baseline and 3 candidate start(s)" in " ".join(verdict.reasons)


def test_a_paired_interval_needs_two_paired_starts() -> None:
    est, low, high = paired_log_interval([0.0, 0.1, -0.1], [0.3, 0.42, 0.18], 0.95)
    assert low < est < high and math.log(est) == pytest.approx(0.3)
    for bad in (([0.0], [0.1]), ([0.0, 0.1], [0.2])):
        try:
            paired_log_interval(*bad, 0.95)
        except ValueError:
            continue
        raise AssertionError(f"{bad} gave an interval")


def _timed(cid: str, start: int, order: int, sent: float, e2e: float) -> Sample:
    return Sample(
        candidate=cid,
        prompt_id="p",
        repeat=order,
        order=order,
        start=start,
        decode_tps=50.0,
        completion_tokens=64,
        e2e_s=e2e,
        t_mono=sent,
        concurrency=1,
        request_class="short",
    )


def test_the_aggregate_rate_of_alternating_batches_counts_each_batch_alone() -> None:
    """Two configurations' batches alternate in one window: each takes 1 s, the other's second
    lies between them. Over the whole span one would read half its rate."""
    mine = [_timed("c", 0, 0, 0.0, 1.0), _timed("c", 0, 1, 2.0, 1.0)]
    assert output_tps_by_start(mine, 1) == {0: 128 / 3.0}
    assert output_tps_by_start(mine, 1, per_batch=True) == {0: 128 / 2.0}


def test_paired_starts_fit_only_where_every_configuration_fits_at_once() -> None:
    fits, why = together_fits({"baseline": 2.0, "k4": 3.0}, 2.0, 16.0, 0.8, exclusive=False)
    assert fits and "2 configurations at once need 5.00 GB + the live backend 2.00 GB" in why
    # the 27B target and its drafter pair on a 48 GB Mac (issue 18's figures: 16.4 GB and
    # 22.05 GB against a budget of 38.4 GB), even with the live backend stopped
    fits, why = together_fits({"baseline": 16.4, "d": 22.05}, 16.4, 48.0, 0.8, exclusive=True)
    assert not fits and "one start after another" in why
    fits, why = together_fits({"baseline": 2.0, "k4": None}, 2.0, 16.0, 0.8, exclusive=False)
    assert not fits and "k4 is unknown" in why


PROFILE = TargetProfile.model_validate(
    yaml.safe_load((Path(BENCHMARKS) / "profiles" / "qwen27b-m5pro.yaml").read_text())
)
FAST = ConfigTruth(decode_tps=34.47, prefill_tps=300, load_s=15, peak_gb=10)


def _recipe(name: str) -> Recipe:
    return Recipe(
        candidate_id=name,
        template="mlx_lm_server",
        model_path="/m",
        knobs=Knobs(prompt_cache_size=0),
        candidate_class="acceleration_plugin",  # type: ignore[arg-type]
    )


def _bench(paired: bool, server: SimServer) -> Bench:
    plan = simulated_plan(load_policy("single-user"), ["sim:fast"])
    plan = plan.model_copy(update={"protocol": plan.protocol.model_copy(update={"paired": True})})
    return Bench(
        plan=plan,
        journal=NullJournal(),
        run_start=server,
        clock=server.clock,
        now=server.clock.wall,
        run_together=server.together if paired else None,
    )


def test_the_round_loop_runs_each_round_as_one_paired_start() -> None:
    server = SimServer(PROFILE, {"sim:fast": FAST}, seed=3, load_spread=0.2)
    calls: list[list[str]] = []
    together = server.together

    def counted(specs, ready):
        calls.append([s.candidate for s in specs])
        return together(specs, ready)

    bench = _bench(True, server)
    bench = Bench(**{**bench.__dict__, "run_together": counted})
    base, runs = run_rounds(
        bench, _recipe(BASELINE_ID), {"sim:fast": _recipe("sim:fast")}, deadline=1e9
    )
    cand = runs["sim:fast"]
    assert calls and all(set(c) <= {BASELINE_ID, "sim:fast"} for c in calls)
    assert len(calls) == cand.starts  # one paired start per round while the candidate is open
    # a round's configurations share one window (and one reading of the machine)
    windows = {(r.round, r.started_at, r.ended_at) for r in cand.rounds}
    assert windows <= {(r.round, r.started_at, r.ended_at) for r in base.rounds}
    assert "qualified after" in cand.stopped, cand.stopped
    # the held-out check is one paired start of the baseline and the winner
    held = heldout_check(bench, _recipe(BASELINE_ID), _recipe("sim:fast"))
    assert calls[-1] == [BASELINE_ID, "sim:fast"]
    assert held.baseline.rounds[0].started_at == held.winner.rounds[0].started_at


def test_without_a_way_to_pair_the_rounds_run_one_start_after_another() -> None:
    """The protocol asks for pairs, the memory did not allow them (the cycle passes no
    ``run_together``): the same loop, one start at a time, each its own window."""
    server = SimServer(PROFILE, {"sim:fast": FAST}, seed=3)
    bench = _bench(False, server)
    assert not bench.together
    base, runs = run_rounds(
        bench, _recipe(BASELINE_ID), {"sim:fast": _recipe("sim:fast")}, deadline=1e9
    )
    first = {r.config: r.started_at for r in base.rounds + runs["sim:fast"].rounds if r.round == 0}
    assert first[BASELINE_ID] != first["sim:fast"]


def test_a_learned_paired_spread_lets_two_paired_starts_decide() -> None:
    """Two paired starts alone have one degree of freedom (t = 12.7 at 95%): nothing decides.
    The spread learned from earlier paired cycles' differences is pooled in (at most 4 degrees
    of freedom where a look may qualify, as for one side), and then two starts decide; a cycle
    whose differences disagree with it falls back to its own."""
    base, cand = _case(1, 1.3)
    two = [s for s in base.samples if s.start < 2], [s for s in cand.samples if s.start < 2]
    base, cand = (
        r.model_copy(update={"samples": x}) for r, x in zip((base, cand), two, strict=True)
    )
    protocol = PROTOCOL.model_copy(update={"paired": True, "min_starts": 2, "max_starts": 2})
    alone = only(select(base, [cand], THRESHOLDS, protocol, ALL))
    assert alone.decision == Decision.INCONCLUSIVE, alone.reasons
    learned = protocol.model_copy(update={"learned_spread": LearnedSpread(sd=0.03, df=8)})
    pooled = only(select(base, [cand], THRESHOLDS, learned, ALL))
    assert pooled.decision == Decision.QUALIFIED, pooled.reasons
    assert "learned, pooled with this cycle" in " ".join(pooled.reasons)
    tiny = protocol.model_copy(update={"learned_spread": LearnedSpread(sd=0.0005, df=8)})
    own = only(select(base, [cand], THRESHOLDS, tiny, ALL))
    assert "disagrees with the learned spread" in " ".join(own.reasons)


def test_a_paired_cycle_needs_no_drift_re_measure() -> None:
    """Each round's difference is of configurations measured side by side, so drift between
    rounds cancels; the lone re-measure would bring in only its own window's load (projected
    under load: half the paired cycles lost a qualified 1.9x drafter to it)."""
    base, cand = _case(1, 1.3)
    protocol = _protocol(True).model_copy(update={"drift_check": True})
    assert drift_checked(protocol.model_copy(update={"paired": False}))
    assert not drift_checked(protocol) and drift_checked(protocol, method=5)
    paired = only(select(base, [cand], THRESHOLDS, protocol, ALL))
    assert paired.decision == Decision.QUALIFIED, paired.reasons
    unpaired = protocol.model_copy(update={"paired": False})
    open_ = only(select(base, [cand], THRESHOLDS, unpaired, ALL))
    assert open_.decision != Decision.QUALIFIED  # unpaired: no drift samples, fails closed
