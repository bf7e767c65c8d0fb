"""The measurement protocol: fresh server processes, interleaved rounds, early stopping.

Why: one server start per configuration hides start-to-start variance (a fresh process can run a
few percent faster or slower), and measuring the baseline first and candidates later lets slow
drift of the machine pass for a gain. So every configuration, the baseline recipe included, is
measured in at least ``protocol.min_starts`` fresh processes on a scratch port, one per round,
in an order that alternates each round (round 0: B C1 C2, round 1: C2 C1 B, ...), so both
effects land inside the selector's estimate. The live service keeps serving; it is measured once
as a sanity check, recorded, and never used for selection.

From round ``min_starts`` on, the selector judges all data so far after each round; a candidate
it qualifies or rejects stops being measured, and another round runs only while some decision is
open, rounds < ``protocol.max_starts`` and the cycle's time budget allows (``next_round``).

Each start measures the policy's workload: every cell (request class x concurrency) of
``protocol.workload``; at concurrency n, n streamed requests are in flight at once (threads,
``bench.stream_chat``). A *reported* cell (shown, never blocking) is measured in a
configuration's first ``max(2, min_starts)`` starts only: enough for its interval, and the later
rounds, which exist to settle decisions, are spent on the decisive cells. Greedy outputs for the
equality gate are taken at concurrency 1 at the start of each configuration's first start (they
warm it up), the quality suite at its end; a screened plan takes a candidate's in a gate start
of their own once its speed qualifies it (``flows.rounds``). Each sample records its start,
round, send time (UTC and monotonic), request class and concurrency.

After selection, ``heldout_check`` measures the winner and the baseline on the suite's held-out
prompts (never seen by selection), each in a fresh start, and judges them with the selector.

Pure parts (``round_order``, ``batches``, ``next_round``, ``cells_for_start``,
``prompts_by_class``) are tested directly; the rest only sequences processes and requests around
them.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, NamedTuple

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    DistributedEvidence,
    FrozenPlan,
    LaunchEvidence,
    MeasureProtocol,
    ProcessRecord,
    Recipe,
    Sample,
    Semantics,
    ServiceConfig,
    WorkloadCell,
)
from mcp_infra.core.screening import screen_cell
from mcp_infra.core.stats import SEED, derive_seed
from mcp_infra.core.suites import Suite, SuitePrompt
from mcp_infra.core.workload import cell_figures, request_class_of, timed_length
from mcp_infra.procs import bench, usage
from mcp_infra.procs.runtime import (
    MemorySampler,
    PortBusy,
    ServerStartError,
    free_port,
    server_log_tail,
    whole,
)
from mcp_infra.procs.sandbox import with_code_run
from mcp_infra.procs.service import start_candidate, stop_candidate
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.store import Home, read_optional, utcnow, write_model

# ---------------------------------------------------------------------------------------------
# Pure planning
# ---------------------------------------------------------------------------------------------


def batches(
    prompt_ids: Sequence[str], concurrency: int, repeats: int, seed: int
) -> list[list[tuple[int, str]]]:
    """Batches of (repeat, prompt id) sent at once. Each repeat visits every prompt in a seeded
    shuffled order; at concurrency n the order is dealt into batches of exactly n in flight at
    once, a short last batch filled by cycling the prompts again (one long prompt at
    concurrency 4 is 4 copies of it, each with its own nonce)."""
    if not prompt_ids:
        return []
    rng = random.Random(seed)
    out: list[list[tuple[int, str]]] = []
    for repeat in range(repeats):
        ids = list(prompt_ids)
        rng.shuffle(ids)
        count = math.ceil(len(ids) / concurrency) * concurrency
        slots = [ids[i % len(ids)] for i in range(count)]
        out.extend(
            [(repeat, pid) for pid in slots[i : i + concurrency]]
            for i in range(0, count, concurrency)
        )
    return out


def cells_for_start(
    protocol: MeasureProtocol, start: int, first_full: int = 0
) -> list[WorkloadCell]:
    """The workload cells measured in a configuration's start ``start`` (0-based): every
    decisive cell always; a guard cell in the first start only; a reported cell in the first
    ``max(2, min_starts)`` starts, enough for its interval, or the first alone where a learned
    start-to-start spread gives one start an interval (later rounds exist to settle the
    decisions). ``first_full``: the configuration's first full start (1 in a screened plan,
    whose screening start times the headline cell alone, ``core.screening.screen_cell``)."""
    if start < first_full:
        return [screen_cell(protocol)]
    start -= first_full
    first = 1 if protocol.learned_spread is not None else max(2, protocol.min_starts)
    return [
        c
        for c in protocol.workload
        if c.role == "decisive"
        or (c.role == "guard" and start == 0)
        or (c.role == "reported" and start < first)
    ]


def prompts_by_class(suite: Suite, split: str = "selection") -> dict[str, list[SuitePrompt]]:
    """The suite's prompts of one split, by request class (long-context prompts are long
    prefills, every other class is short)."""
    out: dict[str, list[SuitePrompt]] = {"short": [], "long_prefill": []}
    for prompt in suite.prompts:
        if getattr(prompt, "split", "selection") == split:
            out[request_class_of(prompt.prompt_class)].append(prompt)
    return out


# ---------------------------------------------------------------------------------------------
# One start: a fresh process measured through the workload
# ---------------------------------------------------------------------------------------------


class ServerDied(RuntimeError):
    """The measured server exited mid-benchmark: stop measuring it, keep what was measured."""


@dataclass
class StartResult:
    samples: list[Sample] = field(default_factory=list)
    greedy: list[Sample] = field(default_factory=list)
    quality: list[Sample] = field(default_factory=list)
    died: str | None = None
    peak_gb: float | None = None
    memory_source: str | None = None
    port: int | None = None


GateCheck = Callable[[StartResult, bool], bool]
"""A gate start's gate check between its untimed requests: the start's result so far and
whether every untimed answer is in; True ends the start (a failed gate, which the run's verdict
names)."""


class StartSpec(NamedTuple):
    """What one fresh start measures: greedy passes first (0 where it takes no gates), warm-up,
    the workload cells of this start, then the quality suite if named. A screening start
    (``start < first_full``) times the headline cell alone; a gate start (``timed`` False: a
    screened plan's candidate once its speed qualifies it) takes the greedy passes and the
    quality suite, and times the reported cells alone (``reported``: a screened plan times a
    candidate's reported cells there, where they are shown, and in no earlier start). A start
    with a ``gate_check`` takes its gates before anything is timed, and the check may end it
    at a failed gate."""

    recipe: Recipe
    candidate: str
    prompts: dict[str, list[SuitePrompt]]
    protocol: MeasureProtocol
    start: int = 0
    round_index: int = 0
    phase: str = "measure"
    greedy_times: int = 0
    quality_suite: str | None = None
    top_logprobs: int = 0  # asked with the greedy passes and quality tasks (a lossy plan's)
    first_full: int = 0
    gate_check: GateCheck | None = None
    timed: bool = True  # False: no decisive or guard cell is timed (a gate start)
    reported: bool = True  # False: no reported cell is timed (a screened plan's, until its gates)


def _timed(
    base_url: str,
    request: Request,
    protocol: MeasureProtocol,
    barrier: threading.Barrier | None = None,
) -> Sample:
    """One streamed request; its send time is recorded as the moment the request went out."""
    if barrier is not None:
        barrier.wait(timeout=protocol.request_timeout_s)
    wall = utcnow()
    sent = time.monotonic()
    prompt, tags = request.prompt, request.tags
    sample = bench.stream_chat(
        base_url,
        bench.with_nonce(prompt.chat_messages(), uuid.uuid4().hex[:12]),
        max_tokens=request.max_tokens,
        timeout=protocol.request_timeout_s,
        labels=bench.Labels(
            tags["candidate"], prompt.id, tags["repeat"], tags["order"], tags["phase"]
        ),
    )
    done = time.monotonic()
    if sample.e2e_s is not None:  # the client's own timer started after the server lookup
        shift = max(0.0, (done - sent) - sample.e2e_s)
        sent += shift
        wall += timedelta(seconds=shift)
    return sample.model_copy(
        update={
            "start": tags["start"],
            "round": tags["round"],
            "started_at": wall,
            "t_mono": sent,
            "timing_source": "client",
            "request_class": tags["request_class"],
            "concurrency": tags["concurrency"],
        }
    )


class Request(NamedTuple):
    """One request of a start's plan: the prompt, its answer length, and the sample's tags."""

    prompt: SuitePrompt
    max_tokens: int
    tags: dict[str, Any]


class Batch(NamedTuple):
    """Requests sent at once (more than one only at concurrency > 1). ``greedy``: token ids
    for the equality gate; ``timed``: streamed and timed (warm-up included, by its phase);
    ``quality``: the quality suite's tasks at their own budgets."""

    kind: Literal["greedy", "timed", "quality"]
    requests: list[Request]


def timed_tokens(prompt: SuitePrompt, protocol: MeasureProtocol) -> int:
    """A timed request's answer length: the prompt's budget under the protocol's timed cap
    (``core.workload.timed_length``)."""
    return prompt.token_budget(timed_length(protocol))


def greedy_passes(recipe: Recipe, *, baseline: bool = False) -> int:
    """Greedy passes in a configuration's first start: two where a prompt cache can change a
    candidate's outputs (the second asks every prompt again with its prefix cached, as real
    traffic does), one where the cache is off, and one for the baseline (the gate compares
    with the baseline's first answer) and for the held-out check."""
    return 1 if baseline or recipe.knobs.prompt_cache_size == 0 else 2


def needs_quality(recipes: Sequence[Recipe]) -> bool:
    """The quality suite judges lossy candidates only: without one in the plan it is not run."""
    return any(r.semantics == Semantics.LOSSY for r in recipes)


def greedy_prompts(
    protocol: MeasureProtocol, prompts: dict[str, list[SuitePrompt]]
) -> list[SuitePrompt]:
    """What one greedy pass asks, in order: every prompt of the workload's request classes."""
    classes = dict.fromkeys(c.request_class for c in protocol.workload)
    return [p for cls in classes for p in prompts.get(cls, [])]


def first_asks(
    protocol: MeasureProtocol, prompts: dict[str, list[SuitePrompt]], quality: bool = True
) -> tuple[list[SuitePrompt], list[SuitePrompt]]:
    """What a configuration's first start asks untimed: its greedy pass over ``prompts``
    (``greedy_prompts``) and, with ``quality``, the protocol's quality tasks (none where it
    names no quality suite)."""
    suite = protocol.quality_suite if quality else None
    return greedy_prompts(protocol, prompts), load_suite(suite).prompts if suite else []


def start_plan(spec: StartSpec, quality_tasks: Sequence[SuitePrompt] = ()) -> list[Batch]:
    """Every request of one start, in order: greedy passes (where it takes its gates), the
    warm-up, each workload cell of this start in batches, then the quality tasks (a start with
    a gate check asks them before anything is timed). Pure: the
    cycle sends it (``measure_start``) and the cost model prices it (``flows.simulation``)."""
    protocol, prompts = spec.protocol, spec.prompts
    base = {"candidate": spec.candidate, "start": spec.start, "round": spec.round_index}
    classes = dict.fromkeys(c.request_class for c in protocol.workload)
    every = greedy_prompts(protocol, prompts)
    out: list[Batch] = []
    cap = protocol.max_tokens  # a task's own budget, never above the protocol's, as any prompt's
    tasks = [Batch("quality", [Request(t, t.token_budget(cap), dict(base))]) for t in quality_tasks]
    # Greedy outputs first: each pass sends every prompt once, so it warms the process up as a
    # warm-up pass does and replaces one. It meets the server's prompt cache as a user would:
    # empty at the first prompt, then holding earlier prompts' prefixes, then each asked again.
    for again in range(spec.greedy_times):
        for prompt in every:
            tags = {**base, "repeat": again, "request_class": request_class_of(prompt.prompt_class)}
            budget = prompt.token_budget(protocol.max_tokens)
            out.append(Batch("greedy", [Request(prompt, budget, tags)]))
    # Warm-up: one request per request class per remaining pass (the readiness probe's
    # one-token completion has already loaded the model; a pass over every prompt measured no
    # different from one per class), where anything is timed.
    order = 0
    cells = _cells(spec)
    firsts = [prompts[cls][0] for cls in classes if prompts.get(cls) and cells]
    for repeat in range(max(0, protocol.warmup - spec.greedy_times)):
        for prompt in firsts:
            cls = request_class_of(prompt.prompt_class)
            tags = {**base, "repeat": repeat, "order": order, "phase": "warmup"}
            tags |= {"request_class": cls, "concurrency": 1}
            out.append(Batch("timed", [Request(prompt, timed_tokens(prompt, protocol), tags)]))
            order += 1
    for cell in cells:
        chosen = {p.id: p for p in prompts.get(cell.request_class, [])}
        seed = derive_seed(SEED, f"{cell.request_class}:{cell.concurrency}:{spec.round_index}")
        for batch in batches(list(chosen), cell.concurrency, protocol.repeats, seed):
            requests = [
                Request(
                    chosen[pid],
                    timed_tokens(chosen[pid], protocol),
                    {
                        **base,
                        "repeat": repeat,
                        "order": order,
                        "phase": spec.phase,
                        "request_class": cell.request_class,
                        "concurrency": cell.concurrency,
                    },
                )
                for repeat, pid in batch
            ]
            out.append(Batch("timed", requests))
            order += 1
    if spec.gate_check is not None:  # gates first: the quality suite before anything is timed
        untimed = spec.greedy_times * len(every)
        return [*out[:untimed], *tasks, *out[untimed:]]
    return out + tasks


def _cells(spec: StartSpec) -> list[WorkloadCell]:
    """The cells ``spec`` times: ``cells_for_start``'s, less what ``timed`` and ``reported``
    leave out (a gate start: the workload's reported cells alone, where ``reported``)."""
    if not spec.timed:
        return [c for c in spec.protocol.workload if c.role == "reported" and spec.reported]
    cells = cells_for_start(spec.protocol, spec.start, spec.first_full)
    return cells if spec.reported else [c for c in cells if c.role != "reported"]


def play(
    spec: StartSpec, plan: Sequence[Batch], send: Callable[[Batch], None], result: StartResult
) -> None:
    """Send a start's plan in order, one batch after another, until the server dies or, in a
    gate start, ``spec.gate_check`` ends it at a failed gate (asked after every untimed batch).
    The cycle's sender and the cost model's simulated server both play a plan so."""
    untimed_left = sum(b.kind != "timed" for b in plan)
    for batch in plan:
        send(batch)
        if result.died:
            return
        if batch.kind == "timed":
            continue
        untimed_left -= 1
        if spec.gate_check is not None and spec.gate_check(result, untimed_left == 0):
            return


class _Sender:
    """One server's side of a start: its plan (``start_plan``), the samples it gets back, its
    peak memory, and whether it died (then it is sent nothing more)."""

    def __init__(self, base_url: str, spec: StartSpec, server: ProcessRecord | None) -> None:
        self.base_url, self.spec, self.server = base_url, spec, server
        tasks = load_suite(spec.quality_suite).prompts if spec.quality_suite else []
        self.plan = start_plan(spec, tasks)
        self.result = StartResult()
        self.sampler = MemorySampler(server.pid) if server else None
        workers = max((len(b.requests) for b in self.plan), default=1)
        self.pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def __enter__(self) -> _Sender:
        if self.sampler:
            self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool:
            self.pool.shutdown(wait=True)
        if self.sampler:
            self.sampler.__exit__(None, None, None)
            self.result.peak_gb = self.sampler.peak_gb
            self.result.memory_source = self.sampler.source

    def _keep(self, into: list[Sample], sample: Sample) -> None:
        server = self.server
        if sample.error and server is not None and not whole(server):
            tail = server_log_tail(server, 300)
            died = f"server process exited during measurement; log tail: {tail}"
            into.append(sample.model_copy(update={"error": died}))
            raise ServerDied(died)
        into.append(sample)

    def send(self, batch: Batch) -> None:
        """Send one batch and keep what comes back; a server that dies is noted, not raised."""
        if self.result.died:
            return
        protocol, result = self.spec.protocol, self.result
        try:
            if batch.kind == "timed":
                for sample in _send_timed(self.base_url, batch, protocol, self.pool):
                    self._keep(result.samples, sample)
                return
            (request,) = batch.requests
            sample = bench.greedy_chat(
                self.base_url,
                request.prompt.chat_messages(),
                max_tokens=request.max_tokens,
                timeout=protocol.request_timeout_s,
                candidate=self.spec.candidate,
                prompt_id=request.prompt.id,
                phase=self.spec.phase if batch.kind == "greedy" else "quality",
                top_logprobs=self.spec.top_logprobs,
            )
            if batch.kind == "quality":
                sample = with_code_run(sample)
            into = result.greedy if batch.kind == "greedy" else result.quality
            self._keep(into, sample.model_copy(update=request.tags))
        except ServerDied as exc:
            result.died = str(exc)


def measure_start(
    base_url: str, spec: StartSpec, *, server: ProcessRecord | None = None
) -> StartResult:
    """Send a start's plan (``start_plan``) to a server. A server that dies stops the
    measurement, recording why."""
    with _Sender(base_url, spec, server) as sender:
        play(spec, sender.plan, sender.send, sender.result)
    return sender.result


def _send_timed(
    base_url: str, batch: Batch, protocol: MeasureProtocol, pool: ThreadPoolExecutor | None
) -> list[Sample]:
    """One batch of timed requests, all in flight at once behind a barrier."""
    if len(batch.requests) == 1 or pool is None:
        return [_timed(base_url, r, protocol) for r in batch.requests]
    barrier = threading.Barrier(len(batch.requests))
    futures = [pool.submit(_timed, base_url, r, protocol, barrier) for r in batch.requests]
    return [f.result() for f in futures]


# ---------------------------------------------------------------------------------------------
# The real start: a scratch server from the recipe's launch template
# ---------------------------------------------------------------------------------------------


def _start(
    home: Home, config: ServiceConfig, recipe: Recipe, cycle_id: str, protocol: MeasureProtocol
) -> ProcessRecord:
    """A fresh scratch server. A busy scratch port is a reason to take another port, never a
    verdict on a configuration: on PortBusy it starts once more on a free port (the record's
    ``port`` says where it runs)."""
    try:
        return start_candidate(
            home, recipe, config, cycle_id=cycle_id, timeout=protocol.ready_timeout_s
        )
    except PortBusy:
        other = config.model_copy(update={"scratch_port": free_port()})
        return start_candidate(
            home, recipe, other, cycle_id=cycle_id, timeout=protocol.ready_timeout_s
        )


SERVER_START_ERRORS: tuple[type[Exception], ...] = (ServerStartError, PortBusy, ValueError)
"""What a real start raises when the configuration's server did not start."""


def server_starter(
    home: Home, config: ServiceConfig, cycle_id: str
) -> Callable[[StartSpec, Callable[[int], None]], StartResult]:
    """How the cycle measures one start (``rounds.Starter``): a fresh scratch server, measured
    through the workload, stopped; its CPU time and peak memory kept for the cycle's cost."""

    def run(spec: StartSpec, ready: Callable[[int], None]) -> StartResult:
        record = _start(home, config, spec.recipe, cycle_id, spec.protocol)
        try:
            keep_launch(home, cycle_id, spec, record)
            ready(record.port)
            result = measure_start(f"http://{config.host}:{record.port}", spec, server=record)
        finally:
            usage.snapshot(home.cycle_dir(cycle_id), record)
            stop_candidate(home, record)
        result.port = record.port
        return result

    return run


def keep_launch(home: Home, cycle_id: str, spec: StartSpec, record: ProcessRecord) -> None:
    """A split start's launch (hosts, backend, split, each rank's environment) added to the
    cycle's ``distributed.json``, sealed with its evidence."""
    if record.launch is None:
        return
    path = home.cycle_files(cycle_id).distributed
    kept = read_optional(path, DistributedEvidence) or DistributedEvidence()
    kept.launches.append(
        LaunchEvidence(
            candidate=spec.candidate,
            start=spec.start,
            round=spec.round_index,
            port=record.port,
            launch=record.launch,
        )
    )
    write_model(path, kept)


# ---------------------------------------------------------------------------------------------
# Sanity, drift and held-out measurements
# ---------------------------------------------------------------------------------------------


def short_c1(protocol: MeasureProtocol) -> MeasureProtocol:
    """The protocol narrowed to short requests one at a time, without warm-up or quality."""
    return protocol.model_copy(
        update={
            "workload": [WorkloadCell(request_class="short", concurrency=1)],
            "warmup": 0,
            "quality_suite": None,
        }
    )


def measure_live(
    base_url: str, live: Recipe, plan: FrozenPlan, server: ProcessRecord | None
) -> CandidateRun:
    """The live service, short requests one at a time, once: a sanity check that it answers
    (and how fast, with whatever traffic it serves), never an input to selection."""
    protocol = short_c1(plan.protocol).model_copy(update={"repeats": 1})
    prompts = prompts_by_class(load_suite(protocol.suite), "selection")
    spec = StartSpec(recipe=live, candidate=BASELINE_ID, prompts=prompts, protocol=protocol)
    result = measure_start(base_url, spec, server=server)
    samples = result.samples
    if result.died and not any(s.error for s in samples):
        samples.append(
            Sample(candidate=BASELINE_ID, prompt_id="live", repeat=-1, error=result.died)
        )
    return CandidateRun(
        candidate=BASELINE_ID,
        purpose="live",
        knobs=live.knobs,
        semantics=live.semantics,
        samples=samples,
        peak_memory_gb=result.peak_gb,
        memory_source=result.memory_source,
        starts=0,
        stopped="the live service, measured once as a sanity check",
    )


def annotate_cells(
    baseline: CandidateRun, runs: dict[str, CandidateRun], protocol: MeasureProtocol
) -> tuple[CandidateRun, dict[str, CandidateRun]]:
    """Each run with its per-cell figures (and the ratio to the baseline's, for candidates)."""
    base_cells = cell_figures(baseline.samples, protocol)
    out = {
        name: run.model_copy(
            update={"cells": cell_figures(run.samples, protocol, baseline=base_cells)}
        )
        for name, run in runs.items()
    }
    return baseline.model_copy(update={"cells": base_cells}), out
