"""The rest of the machine's load around each server start (``core.machine``, ``flows.loadwatch``):
the arithmetic from two readings, the bounded wait for a quiet machine, the words an open verdict
gains, and the round loop carrying the figures. Pure parts run on made-up readings; the round loop
runs over the cost model's simulated starts, with a scripted machine whose other load is known
(a real machine's load cannot be set by a test). The real reading runs once, on this machine."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    CandidateVerdict,
    ConfigTruth,
    CycleState,
    Decision,
    Event,
    JournalStep,
    Knobs,
    LearnedSpread,
    MachineLoad,
    Recipe,
    RoundRecord,
    ServicePolicy,
    TargetProfile,
    Verdict,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.machine import (
    QUIET_LOOK_S,
    LoadSnapshot,
    QuietRule,
    RedoRule,
    busy_starts,
    cpu_words,
    load_sentence,
    machine_load,
    open_verdict_words,
    quiet_rule,
    quiet_step,
    set_aside_reason,
    stolen_fraction,
    summarize,
    taken_fraction,
    waiting_text,
)
from mcp_infra.core.sanitize import LATER_OPTIONAL_FIELDS, RETIRED_FIELDS, policy_hash
from mcp_infra.core.selector import DRIFT_OPENED, drift_opened
from mcp_infra.flows.confirm import heldout_check, heldout_machine
from mcp_infra.flows.loadwatch import Machine
from mcp_infra.flows.measure import StartResult, StartSpec
from mcp_infra.flows.projection import simulated_plan
from mcp_infra.flows.rounds import Bench, run_rounds
from mcp_infra.flows.simulation import NullJournal, SimServer
from mcp_infra.flows.status import CycleView, cycle_progress
from mcp_infra.procs.usage import load_snapshot
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.store import Home
from tests.helpers.paths import BENCHMARKS

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def snap(t: float, busy: float, own: dict[str, float] | None = None, **kw: object) -> LoadSnapshot:
    return LoadSnapshot(monotonic=t, cpus=2, busy_cpu_s=busy, own_cpu_s=own or {}, **kw)


# ---------------------------------------------------------------------------------------------
# Two readings to figures
# ---------------------------------------------------------------------------------------------


def test_other_cpu_is_the_machine_busy_time_less_ours() -> None:
    before = snap(
        100.0,
        1000.0,
        {"supervisor": 50.0, "front:7:1.00": 3.0},
        load_avg_1m=1.5,
        available_memory_fraction=0.6,
        swap_in_bytes=10,
        swap_out_bytes=0,
        steal_s=4.0,
    )
    after = snap(
        110.0,
        1016.0,  # 16 CPU seconds in 10 s on 2 CPUs
        # the supervisor's 10 s include the measured server it reaped; the front took 1 s
        {"supervisor": 60.0, "front:7:1.00": 4.0},
        load_avg_1m=3.25,
        available_memory_fraction=0.4,
        swap_in_bytes=4106,
        swap_out_bytes=2048,
        steal_s=4.5,
    )
    load = machine_load(before, after, waited_s=2.0, quiet=True)
    assert load.window_s == 10.0 and load.cpus == 2
    assert load.other_cpu_s == pytest.approx(5.0)
    assert load.own_cpu_s == pytest.approx(11.0)
    assert load.other_cpu_fraction == pytest.approx(0.25)
    assert load.load_avg_1m == 3.25  # the higher of the two
    assert load.available_memory_fraction == 0.4  # the lower of the two
    assert (load.swap_in_bytes, load.swap_out_bytes) == (4096, 2048)
    assert load.steal_s == pytest.approx(0.5)
    assert (load.waited_s, load.quiet) == (2.0, True)


def test_an_excluded_process_that_started_inside_the_window_counts_whole() -> None:
    # the front restarted by its healer: the new one's CPU is all inside the window; the old
    # one's last part is unread and counts as other
    before = snap(0.0, 0.0, {"supervisor": 1.0, "front:7:1.00": 9.0})
    after = snap(10.0, 8.0, {"supervisor": 3.0, "front:8:2.00": 1.5})
    assert machine_load(before, after).other_cpu_s == pytest.approx(8.0 - 2.0 - 1.5)


def test_the_figures_never_go_negative_or_past_the_machine() -> None:
    # our own reaped children can make "ours" exceed the machine's busy time by a tick
    load = machine_load(snap(0.0, 10.0, {"supervisor": 0.0}), snap(1.0, 11.0, {"supervisor": 1.2}))
    assert load.other_cpu_s == 0.0 and load.other_cpu_fraction == 0.0
    assert machine_load(snap(0.0, 0.0), snap(1.0, 5.0)).other_cpu_fraction == 1.0
    assert machine_load(snap(5.0, 0.0), snap(5.0, 0.0)).other_cpu_fraction == 0.0
    missing = machine_load(snap(0.0, 0.0), snap(1.0, 1.0))
    assert missing.load_avg_1m is None and missing.swap_in_bytes is None


def test_this_machine_can_be_read() -> None:
    """The real psutil reading (no server involved): two readings make valid figures."""
    first = load_snapshot()
    second = load_snapshot()
    assert first.cpus >= 1 and "supervisor" in first.own_cpu_s
    assert second.busy_cpu_s >= first.busy_cpu_s
    load = machine_load(first, second)
    assert 0.0 <= load.other_cpu_fraction <= 1.0
    assert load.available_memory_fraction is not None and 0 < load.available_memory_fraction <= 1


def test_a_round_record_from_before_the_load_figures_still_validates() -> None:
    old = {
        "config": "baseline",
        "start": 0,
        "round": 0,
        "started_at": T0.isoformat(),
        "ended_at": T0.isoformat(),
    }
    assert RoundRecord.model_validate(old).machine is None
    with pytest.raises(ValueError):
        MachineLoad.model_validate(
            {"window_s": 1, "cpus": 2, "other_cpu_s": 0, "other_cpu_fraction": 0, "surprise": 1}
        )


def _as_before_budgets(body: dict) -> None:
    """A default quality budget hashes as the one fraction it replaced (core.budget)."""
    budget = body["thresholds"].pop("quality_budget")
    body["thresholds"]["lossy_min_identical_fraction"] = budget["default"]["min_identical_share"]


def test_the_quiet_setting_leaves_existing_policy_hashes_alone() -> None:
    policy = load_policy("default")
    assert policy.service.quiet_cpu_fraction is None
    body = policy.model_dump(mode="json")
    _as_before_budgets(body)
    del body["service"]["quiet_cpu_fraction"]
    body["service"] |= RETIRED_FIELDS["service"]
    before = sha256_bytes(canonical_json(body, LATER_OPTIONAL_FIELDS - {"quiet_cpu_fraction"}))
    assert policy_hash(policy) == before
    busy = policy.model_copy(
        update={"service": policy.service.model_copy(update={"quiet_cpu_fraction": 0.2})}
    )
    assert policy_hash(busy) != before


def test_the_retired_round_fields_leave_existing_policy_hashes_alone() -> None:
    policy = load_policy("default")
    body = policy.model_dump(mode="json")
    _as_before_budgets(body)
    assert "max_round_repeats" not in body["service"]  # removed: nothing ever read them
    body["service"] |= {"max_live_requests_per_round": 2, "max_round_repeats": 2}
    assert policy_hash(policy) == sha256_bytes(canonical_json(body, LATER_OPTIONAL_FIELDS))


# ---------------------------------------------------------------------------------------------
# Waiting for a quiet machine
# ---------------------------------------------------------------------------------------------


def test_the_policy_waits_only_with_a_threshold_and_time_to_wait() -> None:
    assert quiet_rule(ServicePolicy()) is None
    assert quiet_rule(ServicePolicy(quiet_cpu_fraction=0.2, quiet_wait_s=0)) is None
    rule = quiet_rule(ServicePolicy(quiet_cpu_fraction=0.2, quiet_wait_s=30))
    assert rule is not None and (rule.cpu_fraction, rule.max_wait_s) == (0.2, 30)


def _load(fraction: float) -> MachineLoad:
    return MachineLoad(window_s=1, cpus=2, other_cpu_s=2 * fraction, other_cpu_fraction=fraction)


def test_one_look_says_quiet_wait_or_start_anyway() -> None:
    rule = QuietRule(cpu_fraction=0.25, max_wait_s=5.0, look_s=1.0)
    assert quiet_step(_load(0.25), rule, 1) == "quiet"
    assert quiet_step(_load(0.5), rule, 1) == "wait"
    assert quiet_step(_load(0.5), rule, 4) == "wait"  # a fifth look still fits in 5 s
    assert quiet_step(_load(0.5), rule, 5) == "give_up"
    assert quiet_step(_load(0.5), QuietRule(0.25, 0.5, 1.0), 1) == "give_up"


class ScriptedMachine:
    """A machine whose other processes take ``cores[i]`` CPUs during look i (then the last)."""

    def __init__(self, cores: list[float]) -> None:
        self.t = 0.0
        self.busy = 0.0
        self.cores = cores
        self.looks = 0

    def read(self) -> LoadSnapshot:
        return snap(self.t, self.busy, {"supervisor": 0.0})

    def sleep(self, seconds: float) -> None:
        rate = self.cores[min(self.looks, len(self.cores) - 1)]
        self.t += seconds
        self.busy += rate * seconds
        self.looks += 1


class Lines:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(
        self, state: CycleState, message: str, step: JournalStep | None = None, **fields: object
    ) -> None:
        fields = {"step": step.value if step else "enter", **fields}
        self.events.append(Event(ts=T0, cycle_id="c", state=state, message=message, fields=fields))


def test_a_quiet_machine_costs_one_look_and_no_journal_line() -> None:
    fake = ScriptedMachine([0.1])
    journal = Lines()
    machine = Machine(fake.read, QuietRule(0.25, 30.0), sleep=fake.sleep)
    opened = machine.open(journal, {"candidate": "c1"})
    assert (opened.waited_s, opened.quiet) == (QUIET_LOOK_S, True)
    assert journal.events == []


def test_a_busy_machine_is_waited_for_and_status_says_so() -> None:
    fake = ScriptedMachine([1.6, 1.6, 1.6, 0.2])
    journal = Lines()
    rule = QuietRule(0.25, 30.0, look_s=1.0)
    machine = Machine(fake.read, rule, sleep=fake.sleep)
    waited, quiet = machine.wait_quiet(rule, journal, {"candidate": "c1"})
    assert (waited, quiet) == (4.0, True)
    first, last = journal.events
    assert first.fields["waiting"] is True and first.fields["candidate"] == "c1"
    assert first.fields["other_cpu_fraction"] == pytest.approx(0.8)
    assert "waiting for a quiet machine" in first.message and "1.60 of 2 CPUs" in first.message
    assert waiting_text([first]) == first.message  # what `status` shows meanwhile
    assert last.fields["waiting"] is False and "quiet after 4 s" in last.message
    assert waiting_text(journal.events) is None


def test_the_wait_is_bounded_and_then_measures_anyway() -> None:
    fake = ScriptedMachine([2.0])
    journal = Lines()
    machine = Machine(fake.read, QuietRule(0.25, 5.5, look_s=1.0), sleep=fake.sleep)
    opened = machine.open(journal, {})
    assert opened.quiet is False and opened.waited_s == 5.0  # a sixth look would pass 5.5 s
    assert [e.fields["waiting"] for e in journal.events] == [True, False]
    assert "still busy after 5 s" in journal.events[-1].message
    assert "measuring anyway" in journal.events[-1].message


# ---------------------------------------------------------------------------------------------
# The round loop carries the figures
# ---------------------------------------------------------------------------------------------


def _sim_server(decode_tps: float = 34.47) -> SimServer:
    """The cost model's simulated starts: the real-target profile, one candidate (1.9x by
    default; the target decodes 18.14 tok/s)."""
    profile = TargetProfile.model_validate(
        yaml.safe_load((BENCHMARKS / "profiles/qwen27b-m5pro.yaml").read_text())
    )
    truth = ConfigTruth(decode_tps=decode_tps, prefill_tps=300, load_s=15, peak_gb=10)
    return SimServer(profile, {"sim:fast": truth}, seed=3)


def _sim_recipes() -> tuple[Recipe, Recipe]:
    """(baseline, candidate) recipes the simulated starts measure."""
    recipe = Recipe(
        candidate_id="sim:fast",
        template="mlx_lm_server",
        model_path="/m",
        knobs=Knobs(prompt_cache_size=0),
        candidate_class="acceleration_plugin",  # type: ignore[arg-type]
    )
    return recipe.model_copy(update={"candidate_id": BASELINE_ID}), recipe


def test_every_start_of_the_round_loop_records_the_machine_load() -> None:
    server = _sim_server()

    def read() -> LoadSnapshot:  # one other core busy all along, on the simulated clock
        return snap(server.clock(), 1.0 * server.clock(), {"supervisor": 0.0})

    plan = simulated_plan(load_policy("single-user"), ["sim:fast"])
    bench = Bench(
        plan=plan,
        journal=NullJournal(),
        run_start=server,
        clock=server.clock,
        now=server.clock.wall,
        machine=Machine(read),
    )
    baseline, recipe = _sim_recipes()
    base, runs = run_rounds(bench, baseline, {"sim:fast": recipe}, deadline=1e9)
    rounds = base.rounds + runs["sim:fast"].rounds
    assert rounds and all(r.machine is not None for r in rounds)
    for r in rounds:
        assert r.machine is not None and r.machine.window_s > 0
        assert r.machine.other_cpu_fraction == pytest.approx(0.5)
        assert r.machine.waited_s is None  # the policy does not wait
        assert r.set_aside is None  # nor does it measure a busy start again
    assert "busy" in load_sentence(rounds)


# ---------------------------------------------------------------------------------------------
# A start that other processes slowed, measured again
# ---------------------------------------------------------------------------------------------


def test_a_start_is_set_aside_only_when_busy_under_a_rule_with_redos_left() -> None:
    rule = RedoRule(cpu_fraction=0.25, times=1)
    assert set_aside_reason(_load(0.45), None, 0) is None  # the policy keeps every start
    assert set_aside_reason(None, rule, 0) is None  # no reading, nothing to judge by
    assert set_aside_reason(_load(0.25), rule, 0) is None  # at the line is quiet
    reason = set_aside_reason(_load(0.45), rule, 0)
    assert reason is not None
    assert "0.90 of 2 CPUs (45%)" in reason and "more than the 25% busy line" in reason
    assert set_aside_reason(_load(0.45), rule, 1) is None  # bounded: the redo is kept
    assert set_aside_reason(_load(0.9), RedoRule(0.25, 2), 1) is not None


def test_the_held_out_redo_takes_the_busy_line_of_the_quiet_wait() -> None:
    read = ScriptedMachine([0.0]).read
    assert heldout_machine(None) is None  # the cost model reads no machine
    held = heldout_machine(Machine(read, busy=0.1))
    assert held is not None and held.redo == RedoRule(0.1, 1)


class BusyStarts:
    """The cost model's simulated starts, with other processes taking ``cores`` CPUs through
    the starts named in ``busy`` ((configuration, its nth start), all of them with None)."""

    def __init__(
        self,
        busy: set[tuple[str, int]] | None,
        cores: float = 0.9,
        decode_tps: float = 34.47,
        redo: RedoRule | None = None,
    ) -> None:
        self.server = _sim_server(decode_tps)
        self.busy, self.cores, self.redo = busy, cores, redo
        self.calls: dict[str, int] = {}
        self.other_cpu = 0.0

    def __call__(self, spec: StartSpec, ready: object) -> StartResult:
        n = self.calls.get(spec.candidate, 0)
        self.calls[spec.candidate] = n + 1
        began = self.server.clock()
        result = self.server(spec, ready)  # type: ignore[arg-type]
        if self.busy is None or (spec.candidate, n) in self.busy:
            self.other_cpu += self.cores * (self.server.clock() - began)
        return result

    def read(self) -> LoadSnapshot:
        return snap(self.server.clock(), self.other_cpu, {"supervisor": 0.0})

    def cycle(self, journal: Lines) -> tuple[CandidateRun, dict[str, CandidateRun], Bench]:
        plan = simulated_plan(load_policy("single-user"), ["sim:fast"])
        # With a learned spread a reported cell is measured in a configuration's first start
        # alone (measure.cells_for_start).
        learned = plan.protocol.model_copy(update={"learned_spread": LearnedSpread(sd=0.055, df=8)})
        plan = plan.model_copy(update={"protocol": learned})
        bench = Bench(
            plan=plan,
            journal=journal,
            run_start=self,
            clock=self.server.clock,
            now=self.server.clock.wall,
            machine=Machine(self.read, redo=self.redo, busy=0.25),
        )
        baseline, recipe = _sim_recipes()
        base, runs = run_rounds(bench, baseline, {"sim:fast": recipe}, deadline=1e9)
        return base, runs, bench


HOPELESS = 12.0  # decode tok/s of a candidate at 0.66x the simulated target's 18.14


def _judged_lines(journal: Lines) -> list[Event]:
    return [e for e in journal.events if e.fields["step"] == JournalStep.JUDGED.value]


def test_a_look_before_min_starts_judges_only_candidates_whose_starts_so_far_were_quiet() -> None:
    """With a learned spread a hopeless candidate is rejected after its first start, but only
    where its start and the baseline's ran quiet: the learned spread was learned from quiet
    starts, so one busy start is held back and judged in the next round with the cycle's own
    spread beside history (an A/A candidate measured 0.565x beside a co-tenant and was
    rejected after one round before this rule)."""
    quiet = Lines()
    _, runs, _ = BusyStarts(set(), decode_tps=HOPELESS).cycle(quiet)
    assert runs["sim:fast"].stopped == "rejected after 1 start(s) (round 1)"
    assert "held_busy" not in _judged_lines(quiet)[0].fields
    for busy in ({("sim:fast", 0)}, {(BASELINE_ID, 0)}):
        journal = Lines()
        base, runs, _ = BusyStarts(busy, decode_tps=HOPELESS).cycle(journal)
        run = runs["sim:fast"]
        assert run.stopped == "rejected after 2 start(s) (round 2)", (busy, run.stopped)
        first, second = _judged_lines(journal)[:2]
        assert first.fields["held_busy"] == ["sim:fast"] and first.fields["decided"] == {}
        assert first.fields["open"] == ["sim:fast"]
        assert "a start so far ran on a busy machine: sim:fast" in first.message
        assert "held_busy" not in second.fields  # two starts a side: judged whatever the load
        assert all(r.set_aside is None for r in base.rounds + run.rounds)  # selection keeps all


def test_one_start_a_side_qualifies_only_where_both_ran_quiet() -> None:
    """Single-user decides on one start a side with history (``min_starts: 1``): a clear 1.9x
    winner is qualified after its first start on a quiet machine, but where its start or the
    baseline's ran busy the look rests on a spread learned from quiet starts alone, so it is
    held and decided in the next round with the cycle's own spread beside history."""
    quiet = Lines()
    _, runs, _ = BusyStarts(set()).cycle(quiet)
    assert runs["sim:fast"].stopped == "qualified after 1 start(s) (round 1)"
    for busy in ({("sim:fast", 0)}, {(BASELINE_ID, 0)}):
        journal = Lines()
        _, runs, _ = BusyStarts(busy).cycle(journal)
        assert runs["sim:fast"].stopped == "qualified after 2 start(s) (round 2)", busy
        first = _judged_lines(journal)[0]
        assert first.fields["held_busy"] == ["sim:fast"] and first.fields["decided"] == {}
        assert "not judged on history alone" in first.message


def test_busy_starts_are_those_over_the_line_and_a_start_without_a_reading_is_not() -> None:
    rounds = [
        RoundRecord(
            config="c",
            start=i,
            round=i,
            started_at=T0,
            ended_at=T0,
            machine=_load(f) if f is not None else None,
        )
        for i, f in enumerate((0.1, 0.25, 0.45, None))
    ]
    assert busy_starts(rounds, 0.25) == {2}
    assert busy_starts(rounds, 0.05) == {0, 1, 2}
    assert busy_starts([], 0.25) == set()


# ---------------------------------------------------------------------------------------------
# What an open verdict says
# ---------------------------------------------------------------------------------------------


def _round(fraction: float, **kw: object) -> RoundRecord:
    load = MachineLoad.model_validate(
        {
            "window_s": 10.0,
            "cpus": 2,
            "other_cpu_s": 20 * fraction,
            "other_cpu_fraction": fraction,
            "load_avg_1m": 5.2,
            "available_memory_fraction": 0.5,
            "swap_in_bytes": 0,
            "swap_out_bytes": 0,
            **kw,
        }
    )
    return RoundRecord(config="c", start=0, round=0, started_at=T0, ended_at=T0, machine=load)


def test_a_busy_machine_is_named_with_its_figures_and_what_to_do() -> None:
    words = load_sentence([_round(0.6), _round(0.4)])
    assert words.startswith("the machine was busy while it measured")
    assert "1.00 of its 2 CPUs busy on average over 2 server start(s) (50%," in words
    assert "60% in the busiest start" in words and "load average up to 5.2" in words
    assert "service.quiet_cpu_fraction" in words and "quieter" in words
    assert "memory" not in words


def test_with_the_wait_on_the_advice_is_a_longer_wait() -> None:
    busy = _round(0.6, waited_s=60.0, quiet=False)
    words = load_sentence([busy, _round(0.1, waited_s=3.0, quiet=True)])
    assert "waited 63 s in all" in words and "1 of 2 started busy" in words
    assert "service.quiet_wait_s" in words


def test_short_memory_is_named() -> None:
    words = load_sentence([_round(0.05, available_memory_fraction=0.04, swap_out_bytes=2**30)])
    assert "memory was short, 4% available at the lowest and 1024 MiB swapped" in words
    assert "close programs" in words


def test_a_quiet_machine_says_the_load_does_not_explain_it() -> None:
    words = load_sentence([_round(0.05), _round(0.1)])
    assert words.startswith("the machine was quiet")
    assert "more starts" in words
    # the policy's own threshold is the bar where it sets one
    assert load_sentence([_round(0.1)], busy_fraction=0.05).startswith("the machine was busy")
    # quiet after waiting: the wait is said, since it is what made the starts quiet
    waited = load_sentence([_round(0.05, waited_s=20.0, quiet=True), _round(0.1)])
    assert waited.startswith("the machine was quiet") and "waited 20 s in all" in waited
    assert "waited" not in words


def test_an_open_held_out_check_on_a_quiet_machine_points_at_its_repeats_not_more_starts() -> None:
    words = load_sentence([_round(0.05), _round(0.1)], heldout=True)
    assert words.startswith("the machine was quiet")
    assert "protocol.heldout_repeats" in words and "max_starts" not in words
    run = CandidateRun(candidate="c", rounds=[_round(0.05)])
    held = open_verdict_words(_verdict(Decision.INCONCLUSIVE), [run], heldout=True)
    assert "one start per side" in held and "max_starts" not in held


def test_no_figures_no_words() -> None:
    bare = RoundRecord(config="c", start=0, round=0, started_at=T0, ended_at=T0)
    assert summarize([bare]) is None and load_sentence([bare]) == ""


def _verdict(decision: Decision) -> Verdict:
    return Verdict(
        candidates=[CandidateVerdict(candidate="c", decision=decision, reasons=[])],
        selected=None,
        reason="no candidate qualified, baseline kept",
    )


def test_only_an_open_decision_gains_the_load_words() -> None:
    run = CandidateRun(candidate="c", rounds=[_round(0.7)])
    words = open_verdict_words(_verdict(Decision.INCONCLUSIVE), [run])
    assert words.startswith("; the machine was busy")
    assert open_verdict_words(_verdict(Decision.REJECTED), [run]) == ""
    assert open_verdict_words(_verdict(Decision.INCONCLUSIVE), [CandidateRun(candidate="c")]) == ""


def test_an_open_decision_the_drift_check_made_says_so_not_more_starts() -> None:
    """A candidate that qualified but that the drift check left open: the words name the drift
    finding first, and a quiet machine's sentence does not ask for more starts (they would not
    settle it). 2026-12-03: a real k4 at 2.04x was kept out so, and the summary said "more
    starts (protocol.max_starts) may settle it"."""
    finding = "the baseline re-measured after the experiments ran at 1.223x its first speed"
    drifted = CandidateVerdict(
        candidate="k4",
        decision=Decision.INCONCLUSIVE,
        reasons=["Qualified: speedup 2.040x.", f"Inconclusive: {finding}{DRIFT_OPENED}"],
    )
    verdict = Verdict(candidates=[drifted], selected=None, reason="kept")
    quiet = CandidateRun(candidate="k4", rounds=[_round(0.03)])
    words = open_verdict_words(verdict, [quiet])
    assert words.startswith(f"; the drift check left k4 open: {finding}; the machine was quiet")
    assert "more starts" not in words and "run again may decide" in words
    # another candidate open by its interval: more starts may still settle that one
    wide = CandidateVerdict(candidate="k2", decision=Decision.INCONCLUSIVE, reasons=["Open."])
    both = verdict.model_copy(update={"candidates": [drifted, wide]})
    assert "more starts" in open_verdict_words(both, [quiet])
    assert drift_opened(wide) is None and drift_opened(drifted) == finding


def test_a_child_this_process_waited_for_counts_as_ours() -> None:
    """The measured server is left out of "other" this way: stopped and reaped by the
    supervisor, its CPU time lands in the supervisor's own (children) time. A small CPU burner
    stands in for it here (no server in the fast tier); it burns CPU time, not wall time, so a
    busy machine cannot make it burn less."""
    before = load_snapshot()
    burn = "import time\nwhile time.process_time() < 0.5:\n    pass\n"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=120)
    after = load_snapshot()
    # the kernel counts in clock ticks: a few of them short of the 0.5 s is still ours
    assert after.own_cpu_s["supervisor"] - before.own_cpu_s["supervisor"] >= 0.4


def test_status_says_a_start_is_waiting_for_a_quiet_machine(bare_home: Home) -> None:
    """The cycle's progress line (what `status` and the demo print) names the wait while it
    lasts, from the journal alone: the lines a real wait writes, after a start's entry."""
    where = {"candidate": "c1", "round": 0, "start": 0, "index": 2, "total": 3, "phase": "measure"}
    fake = ScriptedMachine([1.8])
    lines = Lines()
    entry = Event(
        ts=T0,
        cycle_id="c",
        state=CycleState.EXPERIMENT,
        message="round 1: c1, start 1",
        fields={"step": "enter", **where},
    )
    Machine(fake.read, sleep=fake.sleep).wait_quiet(QuietRule(0.25, 2.5), lines, where)
    waiting, ended = lines.events  # two looks, then it gives up
    for event in (entry, waiting):
        bare_home.append_event(event)
    current = CycleView(  # state/current.json as the journal's last line left it
        cycle_id="c", state="EXPERIMENT", message=waiting.message, candidate="c1", index=2, total=3
    )
    view = cycle_progress(bare_home, current)
    assert view.progress is not None and "measuring c1" in view.progress
    assert (
        "waiting for a quiet machine before this start: other processes used 1.80 of 2 CPUs"
        in view.progress
    )
    bare_home.append_event(ended)
    view = cycle_progress(bare_home, current.model_copy(update={"message": ended.message}))
    assert view.progress is not None and "waiting for a quiet machine" not in view.progress


def test_a_held_out_start_other_processes_slowed_is_measured_again() -> None:
    fake = BusyStarts({(BASELINE_ID, 0)})
    journal = Lines()
    _, runs, bench = fake.cycle(journal)
    assert not [e for e in journal.events if e.fields["step"] == JournalStep.SET_ASIDE.value]
    fake.calls.clear()  # the held-out check's starts counted afresh: the baseline's first busy
    baseline, recipe = _sim_recipes()
    held = heldout_check(bench, baseline, recipe)
    steps = [e for e in journal.events if e.fields["step"] == JournalStep.SET_ASIDE.value]
    assert [(e.fields["candidate"], e.fields["start"]) for e in steps] == [(BASELINE_ID, 0)]
    assert [r.set_aside is not None for r in held.baseline.rounds] == [True, False]
    assert [r.set_aside is not None for r in held.winner.rounds] == [False]
    phases = {(s.start, s.phase) for s in held.baseline.samples}
    # The redo has no greedy pass to warm it up (the busy start's outputs stand): a warm-up.
    assert phases == {(0, "busy"), (1, "warmup"), (1, "heldout")}
    assert held.verdict is not None and held.passed, held.reason
    assert "1 baseline and 1 candidate start(s)" in held.reason


def test_the_held_out_check_measures_a_busy_start_again_once_under_every_policy() -> None:
    """Selection rounds measure no start again; the held-out check, one start a side, measures a
    busy one again, once, on either side, whatever the policy."""
    for side in (BASELINE_ID, "sim:fast"):
        fake = BusyStarts({(side, 0)})
        _, _, bench = fake.cycle(Lines())
        assert bench.machine is not None and bench.machine.redo is None
        fake.calls.clear()
        fake.busy = {(side, 0), (side, 1)}  # busy again: kept, the bound is one redo
        held = heldout_check(bench, *_sim_recipes())
        mine, other = (
            (held.baseline, held.winner) if side == BASELINE_ID else (held.winner, held.baseline)
        )
        assert [r.set_aside is not None for r in mine.rounds] == [True, False]
        assert [r.set_aside is not None for r in other.rounds] == [False]
        assert {s.phase for s in mine.samples if s.start == 1} >= {"heldout"}
    quiet = BusyStarts(set())
    _, _, bench = quiet.cycle(Lines())
    held = heldout_check(bench, *_sim_recipes())
    assert [len(held.baseline.rounds), len(held.winner.rounds)] == [1, 1]


def test_the_hypervisors_steal_counts_as_taken_and_is_named() -> None:
    """A VM's steal takes CPU from the measurement as another process would (measured here: a
    start at 20-30% steal ran 0.19 lower in log tok/s), so the rules and the words count it."""
    stolen = _round(0.05, steal_s=4.0).machine  # 4 of the window's 20 CPU-seconds
    quiet = _round(0.05).machine  # no steal recorded: macOS, bare metal, older bundles
    assert stolen is not None and quiet is not None
    assert stolen_fraction(stolen) == pytest.approx(0.2)
    assert taken_fraction(stolen) == pytest.approx(0.25)
    assert stolen_fraction(quiet) == 0.0 and taken_fraction(quiet) == pytest.approx(0.05)
    rule = QuietRule(cpu_fraction=0.25, max_wait_s=10.0)
    assert quiet_step(quiet, rule, 1) == "quiet" and quiet_step(stolen, rule, 1) == "quiet"
    busy = _round(0.05, steal_s=6.0).machine
    assert busy is not None
    assert quiet_step(busy, rule, 1) == "wait"
    assert set_aside_reason(busy, RedoRule(0.25, 1), 0) is not None
    assert "the hypervisor withheld" in cpu_words(busy) and "(steal, 30%)" in cpu_words(busy)
    assert "hypervisor" not in cpu_words(quiet)
    assert set_aside_reason(quiet, RedoRule(0.25, 1), 0) is None
    words = load_sentence([_round(0.05, steal_s=12.0), _round(0.05)])
    assert words.startswith("the machine was busy")
    assert "other processes and the hypervisor's steal kept 0.70 of its 2 CPUs" in words
    assert "65% in the busiest start" in words and "steal 30% of them on average" in words
