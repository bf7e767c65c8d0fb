"""A split recipe in real cycles: the splittable demo target in one process is the baseline, the
same folder over 2 ranks on this machine through ``mlx.launch --backend ring`` is the candidate
(real launcher, real ranks, real ring collectives over TCP on 127.0.0.1).

Faults are real: a rank SIGKILLed while its start is measured, a supervisor SIGKILLed while
the split candidate is measured. Afterwards no rank may run: the orphan check looks for every
mlx server process serving this home's models (launchers and ranks alike)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from mcp_infra.contracts import (
    CandidateRun,
    CycleState,
    DistributedEvidence,
    Event,
    FrozenPlan,
    JournalStep,
    Outcome,
    ProcessRecord,
    RankRecord,
    Verdict,
)
from mcp_infra.demo.homes import make_split_home
from mcp_infra.flows.measure import prompts_by_class
from mcp_infra.flows.supervisor import operator_recover, supervise
from mcp_infra.state import evidence, memory
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.context import HomeContext, service_record
from mcp_infra.state.store import CycleFiles, Home, file_safe, read_model, read_optional
from tests.helpers.faultkit import (
    inspect,
    project_servers,
    queue_plan,
    start_live,
    supervisor,
    wait_for,
)
from tests.helpers.journal import on_journal

SPLIT = "demo-split:tp2-ring"
PLAN = {"hypothesis": "two ranks share the work", "candidates": [SPLIT]}
# The split decodes about ten times slower than one process on a 2-core machine (two ranks
# and their ring share the cores with the live backend): short answers keep each start short,
# and the lossy split answers the quick quality suite (four tasks, not 35: what is asserted here
# is the split's record and its agreement gate, not its answers).
SPLIT_PROTOCOL: dict[str, object] = {
    "repeats": 1,
    "warmup": 0,
    "max_tokens": 8,
    "quality_suite": "smoke",
}


def measuring_split(start: int):  # noqa: ANN201 - a predicate over journal events
    def when(event: Event) -> bool:
        return (
            event.state == CycleState.EXPERIMENT
            and event.step == JournalStep.MEASURING
            and event.fields.get("candidate") == SPLIT
            and event.fields.get("start") == start
        )

    return when


def split_record(home: Home) -> ProcessRecord:
    for path in sorted(home.candidates_dir.glob("*.json")):
        record = read_optional(path, ProcessRecord)
        if record is not None and record.launch is not None:
            return record
    raise AssertionError("no split server is recorded")


def alive(rank: RankRecord) -> bool:
    try:
        proc = psutil.Process(rank.pid or -1)
        return proc.status() != psutil.STATUS_ZOMBIE and (
            abs(proc.create_time() - (rank.create_time or 0)) < 0.05
        )
    except psutil.Error:
        return False


def test_a_split_candidate_is_measured_and_judged_with_its_split_recorded(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    """One start each: the split is measured whole, its agreement gate carries the lossless
    comparison, the evidence names its hosts, backend, split and ranks, and no rank is left."""
    began = time.monotonic()
    home = make_split_home(
        tmp_path / "home", demo_models, min_starts=1, max_starts=1, **SPLIT_PROTOCOL
    )
    start_live(home)
    queue_plan(home, PLAN)
    (summary,) = supervise(home)
    assert summary.outcome == Outcome.KEPT_BASELINE, summary.reason  # slower here: never promoted

    bundle = evidence.bundle_path(home, summary.cycle_id)
    verdict = read_model(CycleFiles(bundle).verdict, Verdict)
    (judged,) = verdict.candidates
    assert judged.candidate == SPLIT and judged.decision.value == "rejected", judged.reasons
    gates = {g.gate: g for g in judged.gates}
    assert "lossless" not in gates  # judged as lossy ...
    agreement = gates["agreement"]  # ... with the lossless comparison reported
    assert agreement.detail.startswith("split over 2 ranks, judged as lossy; lossless comparison: ")
    plan = read_model(CycleFiles(bundle).plan, FrozenPlan)
    selection = prompts_by_class(load_suite(plan.protocol.suite), "selection")
    assert len(agreement.comparisons) == sum(len(p) for p in selection.values()) > 0
    for comparison in agreement.comparisons:
        assert comparison.compared == "token_ids"
        assert comparison.identical == (comparison.first_divergence is None)
        if not comparison.identical:
            assert f"{comparison.prompt_id} diverges at token" in agreement.detail

    run = read_model(CycleFiles(bundle).runs / f"{file_safe(SPLIT)}.json", CandidateRun)
    assert run.knobs.ranks == 2 and run.knobs.backend == "ring" and run.knobs.split == "tensor"
    assert run.semantics.value == "lossy" and run.starts == 1 and run.greedy

    split = read_model(CycleFiles(bundle).distributed, DistributedEvidence)
    hosts = {p.name: p for p in split.hosts}
    assert hosts["local"].reachable and hosts["local"].packages == hosts["control-plane"].packages
    assert hosts["local"].models == hosts["control-plane"].models
    (launched,) = split.launches
    assert (launched.candidate, launched.start) == (SPLIT, 0)
    assert (launched.launch.backend, launched.launch.split) == ("ring", "tensor")
    assert launched.launch.hosts == ["local", "local"]
    assert [r.rank for r in launched.launch.ranks] == [0, 1]
    for rank in launched.launch.ranks:
        assert rank.env["MLX_RANK"] == str(rank.rank) and "MLX_HOSTFILE" in rank.env
        assert not alive(rank), f"rank {rank.rank} (pid {rank.pid}) still runs"
    hostfile = json.loads(Path(launched.launch.hostfile).read_text())
    assert [h["ssh"] for h in hostfile["hosts"]] == ["127.0.0.1", "127.0.0.1"]

    after = inspect(home)
    assert after.serving == "demo-split:single" and after.healthy
    assert after.orphans == [] and after.verified
    base = read_model(CycleFiles(bundle).runs / "baseline.json", CandidateRun)
    identical = sum(c.identical for c in agreement.comparisons)
    print(
        f"\nsplit cycle: {time.monotonic() - began:.1f} s; start to ready "
        f"{_ready_s(home, summary.cycle_id)}; speedup "
        f"{judged.speedup_estimate}x ({judged.ci_low} to {judged.ci_high}); median decode "
        f"{_median(base)} vs {_median(run)} tok/s; greedy identical {identical} of "
        f"{len(agreement.comparisons)}; peak {base.peak_memory_gb:.2f} vs "
        f"{run.peak_memory_gb:.2f} GB"
    )


def _ready_s(home: Home, cycle_id: str) -> dict[str, float]:
    """Seconds from each configuration's first start being journaled to its readiness."""
    events, _ = home.read_journal(cycle_id)
    entered: dict[str, float] = {}
    ready: dict[str, float] = {}
    for e in events:
        name = e.fields.get("candidate")
        if e.state == CycleState.EXPERIMENT and name and e.fields.get("start") == 0:
            if e.step == JournalStep.ENTER:
                entered.setdefault(name, e.ts.timestamp())
            elif e.step == JournalStep.MEASURING and name in entered:
                ready.setdefault(name, round(e.ts.timestamp() - entered[name], 1))
    return ready


def _median(run: CandidateRun) -> str:
    speeds = sorted(s.decode_tps for s in run.samples if s.decode_tps and s.start == 0)
    return f"{speeds[len(speeds) // 2]:.1f}" if speeds else "-"


def test_a_killed_rank_rejects_the_candidate_and_recover_leaves_no_rank(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    """First cycle: rank 1 is SIGKILLed while the split is measured: the candidate is rejected
    with that rank's own log tail and neither rank is left. Second cycle, in a supervisor
    process: the supervisor is SIGKILLed while the split is measured, its launcher and both
    ranks outlive it (their own session), and ``recover`` ends every one of them."""
    began = time.monotonic()
    home = make_split_home(
        tmp_path / "home", demo_models, min_starts=1, max_starts=1, **SPLIT_PROTOCOL
    )
    start_live(home)
    queue_plan(home, PLAN)
    killed: list[RankRecord] = []

    def kill_rank_1() -> None:
        record = split_record(home)
        assert record.launch is not None
        (rank,) = [r for r in record.launch.ranks if r.rank == 1]
        assert alive(rank) and rank.pid
        os.kill(rank.pid, signal.SIGKILL)
        killed.append(rank)

    with on_journal(home, measuring_split(0), kill_rank_1) as acted:
        (summary,) = supervise(home)
    assert acted and killed, f"the split was never measured: {summary.reason}"
    verdict = read_model(CycleFiles(evidence.bundle_path(home, summary.cycle_id)).verdict, Verdict)
    (judged,) = verdict.candidates
    assert judged.decision.value == "rejected"
    why = " ".join(judged.reasons)
    assert "rank 1 on host local exited with code -9; its log tail: " in why, judged.reasons
    split = read_model(home.cycle_files(summary.cycle_id).distributed, DistributedEvidence)
    for rank in split.launches[0].launch.ranks:
        assert not alive(rank), f"rank {rank.rank} (pid {rank.pid}) still runs"
    first = inspect(home)
    assert first.orphans == [] and first.serving == "demo-split:single" and first.healthy
    killed_rank_s = time.monotonic() - began

    # The same candidate again: its agreement gate failed above by the requests that died with
    # the rank, which recipe memory does not hold against the recipe (state.memory).
    (remembered,) = memory.outcomes(home, judged.candidate)
    assert (
        remembered.failed_requests > 0
        and memory.skip_reason(remembered, HomeContext(home).policy) is None
    )
    queue_plan(home, PLAN)
    proc = supervisor(home)
    try:
        wait_for(
            lambda: any(
                measuring_split(0)(e)
                for folder in (home.cycles.iterdir() if home.cycles.is_dir() else [])
                if folder.name != summary.cycle_id
                for e in home.read_journal(folder.name)[0]
            ),
            240,
            "the split candidate to be measured",
            proc,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    record = split_record(home)
    assert record.launch is not None and len(record.launch.ranks) == 2
    assert all(alive(r) for r in record.launch.ranks), "the ranks outlive the supervisor"
    live = service_record(home)
    assert live is not None
    assert set(project_servers(home)) - {live.pid}, "the launcher and its ranks still run"

    operator_recover(home)
    for rank in record.launch.ranks:
        assert not alive(rank), f"rank {rank.rank} (pid {rank.pid}) still runs after recover"
    after = inspect(home)
    assert after.orphans == [], after.orphans
    assert after.serving == "demo-split:single" and after.healthy
    assert after.interrupted and after.verified
    print(
        f"\nkilled rank: {killed_rank_s:.1f} s; recover after a killed supervisor: "
        f"{time.monotonic() - began - killed_rank_s:.1f} s more"
    )
