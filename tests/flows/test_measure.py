"""Pure parts of the measurement protocol: round order, round planning, batches at concurrency,
prompt splits, the decisive view the selector gets, and per-cell figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_infra.contracts import (
    CandidateRun,
    CellFigures,
    EffectiveThresholds,
    MeasureProtocol,
    Sample,
    WorkloadCell,
)
from mcp_infra.core.workload import (
    aggregate_tps,
    cell_figures,
    cell_regressions,
    decisive_view,
    describe_cell,
)
from mcp_infra.flows.confirm import heldout_protocol
from mcp_infra.flows.measure import (
    StartSpec,
    batches,
    cells_for_start,
    prompts_by_class,
    start_plan,
)
from mcp_infra.flows.rounds import next_round, past_max, round_order
from mcp_infra.flows.simulation import sim_recipe
from mcp_infra.state.catalog import load_policy, load_suite

THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5,
    max_peak_memory_gb=8,
    max_error_rate=0,
    worst_prompt_tolerance_pct=10,
    lossy_min_identical_fraction=0.5,
)
SINGLE_USER = MeasureProtocol(
    workload=[
        WorkloadCell(request_class="short", concurrency=1),
        WorkloadCell(request_class="short", concurrency=4, role="reported"),
    ]
)


def test_rounds_alternate_their_order() -> None:
    configs = ["baseline", "a:1", "a:2"]
    assert round_order(configs, 0) == ["baseline", "a:1", "a:2"]
    assert round_order(configs, 1) == ["a:2", "a:1", "baseline"]
    assert round_order(configs, 2) == configs
    # Over two rounds every configuration's mean position is the same: drift cancels.
    positions = {c: [round_order(configs, r).index(c) for r in (0, 1)] for c in configs}
    assert {sum(p) for p in positions.values()} == {2}


@pytest.mark.parametrize(
    ("done", "open_", "left", "last", "go", "words"),
    [
        (0, ["a:1"], 1000, 0, True, "fewer than 2"),
        (1, ["a:1"], 1000, 100, True, "fewer than 2"),
        (2, ["a:1"], 1000, 100, True, "still open"),
        (2, [], 1000, 100, False, "every decision"),
        (3, ["a:1"], 1000, 100, False, "maximum of 3"),
        (2, ["a:1"], 150, 100, False, "time budget"),
        (1, ["a:1"], 0, 100, False, "ran out"),
    ],
)
def test_next_round(
    done: int, open_: list[str], left: float, last: float, go: bool, words: str
) -> None:
    protocol = MeasureProtocol(min_starts=2, max_starts=3)
    decision, why = next_round(done, open_, protocol, left, last)
    assert decision is go and words in why


def test_a_gate_start_runs_past_the_maximum_of_timed_starts_while_time_allows() -> None:
    protocol = MeasureProtocol(min_starts=2, max_starts=3)
    go, why = next_round(3, ["a:1", "a:2"], protocol, 1000, 100, gates_due=["a:1"])
    assert go and why.startswith("a:1 qualif(ies) on speed")
    assert not next_round(3, ["a:1"], protocol, 150, 100, gates_due=["a:1"])[0]  # no time
    assert not next_round(3, ["a:1"], protocol, 0, 100, gates_due=["a:1"])[0]
    assert past_max(3, protocol) and not past_max(2, protocol)


def test_a_gate_start_asks_the_greedy_passes_and_the_quality_tasks_and_times_nothing() -> None:
    suite = load_suite("demo-speed")
    tasks = load_suite("quality").prompts[:3]
    spec = StartSpec(
        sim_recipe("a:1"),
        "a:1",
        prompts_by_class(suite),
        MeasureProtocol(),
        start=3,
        greedy_times=2,
        timed=False,
    )
    plan = start_plan(spec, tasks)
    every = sum(len(v) for v in prompts_by_class(suite).values())
    assert [b.kind for b in plan] == ["greedy"] * 2 * every + ["quality"] * 3
    # With a gate check a timed start asks its quality tasks before anything is timed.
    checked = start_plan(spec._replace(timed=True, gate_check=lambda *_: False), tasks)
    kinds = [b.kind for b in checked]
    assert kinds.index("timed") > max(i for i, k in enumerate(kinds) if k == "quality")
    assert [b.kind for b in start_plan(spec._replace(timed=True), tasks)][-1] == "quality"


def test_min_starts_wins_over_a_smaller_max() -> None:
    protocol = MeasureProtocol(min_starts=3, max_starts=2)
    assert next_round(2, ["a:1"], protocol, 1e6, 1)[0] is True
    assert next_round(3, ["a:1"], protocol, 1e6, 1)[0] is False


def test_batches_at_concurrency_one_visit_every_prompt_each_repeat() -> None:
    out = batches(["p", "q", "r"], 1, 2, seed=7)
    assert all(len(b) == 1 for b in out) and len(out) == 6
    for repeat in (0, 1):
        assert sorted(pid for b in out for r, pid in b if r == repeat) == ["p", "q", "r"]
    assert out == batches(["p", "q", "r"], 1, 2, seed=7)  # seeded: the same every time


def test_batches_at_concurrency_four_keep_four_in_flight() -> None:
    out = batches(["p", "q", "r", "s", "t"], 4, 1, seed=1)
    assert [len(b) for b in out] == [4, 4]  # 5 prompts: a second batch filled by cycling
    assert {pid for b in out for _, pid in b} == {"p", "q", "r", "s", "t"}
    one = batches(["long"], 4, 2, seed=1)
    assert one == [[(0, "long")] * 4, [(1, "long")] * 4]
    assert batches([], 4, 2, seed=1) == []


def test_suites_split_selection_and_heldout_prompts() -> None:
    suite = load_suite("demo-speed")
    selection = prompts_by_class(suite, "selection")
    heldout = prompts_by_class(suite, "heldout")
    assert len(selection["short"]) == 4 and [p.id for p in selection["long_prefill"]] == [
        "long-context-larch"
    ]
    assert heldout["short"] and not set(p.id for p in heldout["short"]) & {
        p.id for p in selection["short"]
    }
    general = load_suite("general")
    assert prompts_by_class(general, "heldout")["short"]
    assert prompts_by_class(general, "selection")["long_prefill"]


def test_demo_long_prefill_has_at_least_2000_tokens(demo_models: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(demo_models["target"] / "tokenizer.json"))
    (long,) = prompts_by_class(load_suite("demo-speed"))["long_prefill"]
    assert len(tok.encode(long.messages[-1].content).ids) >= 2000
    assert long.max_tokens <= 16  # a long document, a short answer: the demo stays fast


def test_policies_declare_their_workloads() -> None:
    default = load_policy("default").protocol
    assert {(c.request_class, c.concurrency) for c in default.workload if c.role == "decisive"} == {
        ("short", 1),
        ("short", 4),
        ("long_prefill", 1),
    }
    # the costliest cell guards: measured in a first start, blocking a clear regression
    assert [(c.request_class, c.concurrency) for c in default.workload if c.role == "guard"] == [
        ("long_prefill", 4)
    ]
    demo = load_policy("demo").protocol
    roles = {(c.request_class, c.concurrency): c.role for c in demo.workload}
    assert roles == {("short", 1): "decisive", ("short", 4): "reported"}
    assert demo.min_starts >= 2


def _sample(
    prompt: str,
    tps: float,
    *,
    n: int = 1,
    start: int = 0,
    order: int = 0,
    t: float = 0.0,
    phase: str = "measure",
) -> Sample:
    tokens = 33
    return Sample(
        candidate="x",
        prompt_id=prompt,
        repeat=0,
        phase=phase,  # type: ignore[arg-type]
        completion_tokens=tokens,
        decode_tps=tps,
        ttft_s=0.05,
        e2e_s=tokens / tps,
        t_mono=t,
        start=start,
        order=order,
        concurrency=n,
    )


def test_decisive_view_leaves_reported_cells_out() -> None:
    run = CandidateRun(
        candidate="baseline",
        samples=[_sample("p", 70), _sample("p", 20, n=4), _sample("p", 60, phase="warmup", n=4)],
    )
    view = decisive_view(run, SINGLE_USER)
    assert [(s.concurrency, s.phase) for s in view.samples] == [(1, "measure"), (4, "warmup")]
    everything = MeasureProtocol()  # the default: every cell decisive
    assert decisive_view(run, everything) is run


def test_aggregate_tps_counts_a_batch_once_in_wall_time() -> None:
    # Four requests in flight together for 1 s each: 4 x 33 tokens in 1 s of wall time.
    batch = [_sample(p, 33, n=4, order=3, t=10.0) for p in "abcd"]
    assert aggregate_tps(batch, 4) == pytest.approx(132)
    # One at a time, back to back: 2 x 33 tokens in 2 s.
    serial = [_sample("a", 33, order=0, t=0.0), _sample("b", 33, order=1, t=1.0)]
    assert aggregate_tps(serial, 1) == pytest.approx(33)
    # The wall span counts the time between them too (the verdict's figure): 66 tokens in 6 s.
    apart = [_sample("a", 33, order=0, t=0.0), _sample("b", 33, order=1, t=5.0)]
    assert aggregate_tps(apart, 1) == pytest.approx(11)


def test_cell_figures_compare_with_the_baseline_and_name_the_loss() -> None:
    # One at a time, back to back (each request takes 33 tokens / its tok/s), then 4 at once.
    base = [_sample(p, 73, order=i, t=i * 33 / 73) for i, p in enumerate("abcd")]
    base += [_sample(p, 43, n=4, order=9, t=100.0) for p in "abcd"]
    cand = [_sample(p, 105, order=i, t=i * 33 / 105) for i, p in enumerate("abcd")]
    cand += [_sample(p, 24, n=4, order=9, t=100.0) for p in "abcd"]
    base_cells = cell_figures(base, SINGLE_USER)
    cells = cell_figures(cand, SINGLE_USER, baseline=base_cells)
    one, four = cells
    assert one.aggregate_vs_baseline == pytest.approx(105 / 73)
    assert four.aggregate_vs_baseline == pytest.approx(24 / 43)
    assert four.requests == 4 and four.ttft_p50_s == pytest.approx(0.05)
    # Under a single-user policy 4 concurrent requests are reported, not decisive...
    assert cell_regressions(cells, THRESHOLDS) == []
    # ...and when they are decisive, the loss is named, in words.
    decisive = [c.model_copy(update={"role": "decisive"}) for c in cells]
    (lost,) = cell_regressions(decisive, THRESHOLDS)
    assert lost.concurrency == 4
    words = describe_cell(lost)
    assert "4 concurrent requests" in words and "0.56x" in words


def test_a_cell_without_prompts_is_not_a_regression() -> None:
    empty = CellFigures(request_class="long_prefill", concurrency=1, requests=0)
    assert cell_regressions([empty], THRESHOLDS) == []
    unmatched = CellFigures(request_class="long_prefill", concurrency=1, requests=3)
    assert cell_regressions([unmatched], THRESHOLDS) == [unmatched]


def test_heldout_protocol_uses_decisive_single_request_classes() -> None:
    default = load_policy("default").protocol
    held = heldout_protocol(default)
    assert [(c.request_class, c.concurrency) for c in held.workload] == [
        ("short", 1),
        ("long_prefill", 1),
    ]
    assert held.quality_suite is None and held.drift_check is False
    assert held.repeats == default.heldout_repeats == 3  # the policy says
    derived = default.model_copy(update={"heldout_repeats": None})
    assert heldout_protocol(derived).repeats == max(6, 2 * default.repeats * default.min_starts)
    assert heldout_protocol(derived.model_copy(update={"repeats": 1})).repeats == 6


def test_reported_cells_run_in_the_first_starts_decisive_cells_in_every_start() -> None:
    demo = load_policy("demo").protocol
    assert [c.role for c in demo.workload] == ["decisive", "reported"] and demo.min_starts == 2
    cells = [[(c.concurrency, c.role) for c in cells_for_start(demo, st)] for st in range(4)]
    assert cells[0] == cells[1] == [(1, "decisive"), (4, "reported")]
    assert cells[2] == cells[3] == [(1, "decisive")]
    later = demo.model_copy(update={"min_starts": 3, "max_starts": 4})
    assert len(cells_for_start(later, 2)) == 2 and len(cells_for_start(later, 3)) == 1
    default = load_policy("default").protocol  # decisive cells in every start, the guard once
    assert cells_for_start(default, 12) == [c for c in default.workload if c.role == "decisive"]
    assert cells_for_start(default, 0) == default.workload
