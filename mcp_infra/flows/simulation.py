"""The product's own round loop over simulated starts and a simulated clock.

Why: a protocol that is honest on tiny CPU models can take an hour on a 27B model at 18 tok/s.
The only projection worth trusting is the cycle's own code priced on the target: ``start_plan``
(every request a start sends), ``rounds.run_rounds`` (``next_round``, the failed-gate stop, the
per-round ``select``, the time budget), the drift re-measure, ``decide_cycle`` and the held-out
check all run unchanged; only the server and the clock are simulated, from a ``TargetProfile``.

A simulated start: the server loads (``load_s``), then each batch of ``start_plan`` takes the time
the profile gives it: one request prefills its prompt at ``prefill_tps`` and decodes at
``decode_tps``; n requests at once either batch (``batch_tps[n]`` aggregate output tok/s, shared)
or, where the configuration has no batched figure (a drafter in ``mlx_lm.server``), are served
one after another, each waiting for the ones before it. Every fresh start runs a log-normal
factor faster or slower (``start_spread``) and every request varies on top (``request_spread``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    ConfigTruth,
    CycleState,
    Decision,
    FrozenPlan,
    JournalStep,
    LearnedSpread,
    Policy,
    Recipe,
    ReferenceAnswer,
    ReferenceAnswers,
    Sample,
    TargetProfile,
    Verdict,
)
from mcp_infra.core.admission import admit
from mcp_infra.core.reference import answers_of
from mcp_infra.core.stats import derive_seed
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.flows.confirm import heldout_check, heldout_protocol, measure_drift
from mcp_infra.flows.measure import (
    Batch,
    StartResult,
    StartSpec,
    annotate_cells,
    greedy_prompts,
    play,
    prompts_by_class,
    short_c1,
    start_plan,
)
from mcp_infra.flows.rounds import Bench, decide_cycle, run_rounds
from mcp_infra.state.catalog import load_suite

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
TEXT = "plain simulated answer words that do not repeat themselves at all"
ANSWERS = {
    "arithmetic": "391",
    "json_object": '{"city": "Paris", "country": "France"}',
    "one_word": "blue",
    "python_add": "```python\ndef add(a, b):\n    return a + b\n```",
}
"""Answers the quality tasks' checkers pass, so a lossy candidate's gates are priced as passing
(whether a real model passes is not simulated; a task not here gets ``TEXT``, which fails)."""


class SimClock:
    """Seconds since the simulated cycle began; only simulated work moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t)


class NullJournal:
    """The simulation journals nothing (its cycle touches no home)."""

    cycle_id = "projection"

    def __call__(
        self,
        state: CycleState,
        message: str,
        step: JournalStep | None = None,
        **fields: object,
    ) -> None:
        return None


def prompt_tokens(prompt: SuitePrompt, chars_per_token: float) -> int:
    return max(1, round(sum(len(m.content) for m in prompt.messages) / chars_per_token))


@dataclass
class SimServer:
    """The simulated servers of one projected cycle: their truths, noise and clock."""

    profile: TargetProfile
    truths: dict[str, ConfigTruth]
    seed: int
    clock: SimClock = field(default_factory=SimClock)
    requests: int = 0
    # Other processes' load: the log slowdown over one start's window is |N(0, load_spread)|
    # (load only slows); each start draws its own.
    load_spread: float = 0.0
    # Simulated seconds by what they were spent on: "<phase> load" and "<phase> <batch kind>"
    # (measure greedy, measure timed, measure quality, heldout timed, ...).
    spent: dict[str, float] = field(default_factory=dict)

    def _spend(self, what: str, seconds: float) -> None:
        self.spent[what] = self.spent.get(what, 0.0) + seconds

    def truth(self, name: str) -> ConfigTruth:
        return self.truths.get(name, self.profile.baseline)

    def _load(self, key: str) -> float:
        if self.load_spread <= 0:
            return 1.0
        rng = random.Random(derive_seed(self.seed, f"load:{key}"))
        return math.exp(-abs(rng.gauss(0.0, self.load_spread)))

    def __call__(self, spec: StartSpec, ready: Callable[[int], None]) -> StartResult:
        key = f"{spec.candidate}:{spec.phase}:{spec.start}"
        return self._start(spec, ready, self._load(key))

    def _start(self, spec: StartSpec, ready: Callable[[int], None], load: float) -> StartResult:
        truth = self.truth(spec.candidate)
        key = f"{spec.candidate}:{spec.phase}:{spec.start}"
        rng = random.Random(derive_seed(self.seed, key))
        # Greedy passes, quality answers and warm-ups draw their own noise: a start that asks
        # fewer of them (answers kept from an earlier cycle) measures the same speeds.
        untimed = random.Random(derive_seed(self.seed, f"{key}:untimed"))
        factor = math.exp(rng.gauss(0.0, self.profile.start_spread)) * load
        self.clock.t += truth.load_s
        self._spend(f"{spec.phase} load", truth.load_s)
        ready(0)
        tasks = load_suite(spec.quality_suite).prompts if spec.quality_suite else []  # as measure
        result = StartResult(peak_gb=truth.peak_gb, memory_source="projected", port=0)

        def send(batch: Batch) -> None:
            began = self.clock.t
            measured = batch.kind == "timed" and batch.requests[0].tags["phase"] != "warmup"
            noise = rng if measured else untimed
            samples = self._batch(truth, factor, noise, batch.requests, batch.kind)
            self._spend(f"{spec.phase} {batch.kind}", self.clock.t - began)
            into = {"greedy": result.greedy, "quality": result.quality}.get(batch.kind)
            (into if into is not None else result.samples).extend(samples)

        play(spec, start_plan(spec, tasks), send, result)
        return result

    def _batch(
        self,
        truth: ConfigTruth,
        factor: float,
        rng: random.Random,
        requests: Sequence,
        kind: str,
    ) -> list[Sample]:
        n = len(requests)
        began = self.clock.t
        aggregate = truth.batch_tps.get(n) if n > 1 else None
        out: list[Sample] = []
        waited = 0.0
        for request in requests:
            noise = math.exp(rng.gauss(0.0, self.profile.request_spread))
            tokens = request.max_tokens
            prefill = prompt_tokens(request.prompt, self.profile.chars_per_token) / (
                truth.prefill_tps * factor
            )
            if aggregate is not None:  # batched: n requests share the aggregate rate
                decode_tps = aggregate * factor * noise / n
                ttft = n * prefill
            else:  # one after another: each waits for the ones before it
                decode_tps = truth.decode_tps * factor * noise
                ttft = waited + prefill
            e2e = ttft + tokens / decode_tps
            waited = e2e if aggregate is None else 0.0
            out.append(self._sample(request, kind, began, ttft, e2e, decode_tps, truth))
        self.clock.t = began + max(s.e2e_s or 0.0 for s in out)
        self.requests += n
        return out

    def _sample(
        self,
        request,
        kind: str,
        began: float,
        ttft: float,
        e2e: float,
        decode_tps: float,
        truth: ConfigTruth,
    ) -> Sample:
        tokens = request.max_tokens
        pid = request.prompt.id
        ids = [derive_seed(1, f"{pid}:{i}") % 50_000 for i in range(tokens)]
        if truth.diverges and kind != "timed":  # quality answers are greedy outputs too
            ids[len(ids) // 2] += 1
        fields = {
            "candidate": request.tags["candidate"],
            "prompt_id": pid,
            "repeat": request.tags.get("repeat", 0),
            "order": request.tags.get("order", 0),
            "start": request.tags["start"],
            "round": request.tags["round"],
            "completion_tokens": tokens,
            "ttft_s": ttft,
            "decode_s": tokens / decode_tps,
            "decode_tps": decode_tps,
            "e2e_s": e2e,
            "text": ANSWERS.get(pid, TEXT) if kind == "quality" else TEXT,
            "token_ids": ids if kind != "timed" else None,
            "started_at": EPOCH + timedelta(seconds=began),
            "t_mono": began,
        }
        if kind == "timed":
            fields |= {
                "phase": request.tags["phase"],
                "request_class": request.tags["request_class"],
                "concurrency": request.tags["concurrency"],
            }
        elif kind == "greedy":
            fields |= {"request_class": request.tags["request_class"]}
        else:
            fields |= {"phase": "quality"}
        return Sample(**fields)


class Projection(NamedTuple):
    """One projected cycle."""

    minutes: float
    rounds: int
    requests: int
    outcome: str  # promoted | rejected | kept_baseline (inconclusive)
    selected: str | None
    decided: bool
    unserved_s: float
    reason: str
    verdict: Verdict | None = None
    screening_s: float = 0.0  # the screening round (a plan of many candidates), else 0
    screened_out: tuple[str, ...] = ()  # what screening dropped
    spent: dict[str, float] | None = None  # the servers' seconds by what (SimServer.spent)


def sim_recipe(name: str, semantics: str = "lossless") -> Recipe:
    return Recipe(
        candidate_id=name,
        template="mlx_lm_server",
        model_path=f"/projected/{name}",
        semantics=semantics,  # type: ignore[arg-type]
        candidate_class="acceleration_plugin",  # type: ignore[arg-type]
    )


def history_spread(
    plan: FrozenPlan, profile: TargetProfile, df: int, error: float = 1.0
) -> LearnedSpread | None:
    """The spread a home with ``df`` degrees of freedom of history would have learned on this
    profile (times ``error``, to price a history that is wrong): the sd of a start's mean log
    level over the headline cell's prompts, one request each."""
    if df <= 0:
        return None
    per = max(1, len(prompts_of(plan).get("short", []))) * plan.protocol.repeats
    sd = math.sqrt(profile.start_spread**2 + profile.request_spread**2 / per) * error
    return LearnedSpread(sd=sd, df=df, source=f"projected: {df} df of history, x{error:g}")


@dataclass(frozen=True)
class Setting:
    """What a projected cycle meets besides its plan and its target: the seed of its draws, the
    time budget, the memory budget, the memory mode the cycle's own admission chose (None:
    decided from the truths' peaks), other processes' load (``SimServer.load_spread``) and
    whether the plan is screened (None: by its size, as the cycle decides; False: the same plan
    at full rigour, for the benchmark's comparison) and whether the live configuration's answers
    are kept from an earlier cycle (``core.reference``: a later cycle on the same service)."""

    seed: int
    cycle_minutes: float
    memory_budget_fraction: float = 0.8
    exclusive: bool | None = None
    load_spread: float = 0.0
    screening: bool | None = None
    reference: bool = False  # the live configuration's answers are kept (a cycle asked them)

    @classmethod
    def of(
        cls,
        policy: Policy,
        seed: int,
        *,
        exclusive: bool | None = None,
        load_spread: float = 0.0,
        screening: bool | None = None,
        reference: bool = False,
    ) -> Setting:
        """The setting ``policy``'s budgets give a cycle drawn with ``seed``."""
        budget = policy.service.memory_budget_fraction
        minutes = policy.budgets.cycle_minutes
        return cls(seed, minutes, budget, exclusive, load_spread, screening, reference)


def project(
    plan: FrozenPlan,
    profile: TargetProfile,
    truths: dict[str, ConfigTruth],
    setting: Setting,
    recipes: Mapping[str, Recipe] | None = None,
) -> Projection:
    """One cycle of ``plan`` on ``profile`` with candidates behaving as ``truths``: the rounds,
    the drift re-measure, the decision, the held-out check and the promotion, priced.
    ``recipes``: the candidates' real recipes where known (their knobs and semantics decide the
    greedy passes and the quality suite)."""
    seed, cycle_minutes = setting.seed, setting.cycle_minutes
    exclusive = setting.exclusive
    server = SimServer(profile, truths, seed, load_spread=setting.load_spread)
    clock = server.clock
    live = sim_recipe(BASELINE_ID)
    candidates = {c: (recipes or {}).get(c) or sim_recipe(c) for c in plan.candidates[1:]}
    if exclusive is None:
        exclusive = any(
            admit(
                truths[c].peak_gb if c in truths else None,
                profile.baseline.peak_gb,
                profile.memory_gb,
                setting.memory_budget_fraction,
            ).mode
            == "exclusive"
            for c in candidates
        )
    bench = Bench(
        plan=plan,
        journal=NullJournal(),
        run_start=server,
        clock=clock,
        now=clock.wall,
        screening=setting.screening,
        reference=kept_answers(plan, profile) if setting.reference else None,
    )
    _live_check(server, plan, live)
    held_from = clock()
    first_round: list[float] = []

    def seen(*_: object) -> None:
        first_round.append(first_round[0] if first_round else clock())

    baseline, runs = run_rounds(bench, live, candidates, deadline=cycle_minutes * 60, on_round=seen)
    screening_s = first_round[0] - held_from if bench.screened and first_round else 0.0
    rounds = max((r.round for r in baseline.rounds), default=-1) + 1
    if plan.protocol.drift_check and clock() <= cycle_minutes * 60:
        baseline = measure_drift(bench, live, baseline, rounds)
    unserved = clock() - held_from if exclusive else 0.0
    baseline, runs = annotate_cells(baseline, runs, plan.protocol)
    verdict, losses = decide_cycle(baseline, runs, plan, screened=bench.screened)
    outcome, selected, reason = _judged(verdict, runs, losses)
    if selected is not None and clock() <= cycle_minutes * 60:
        held = heldout_check(bench, live, candidates[selected])
        if not held.passed:
            outcome, selected, reason = "kept_baseline", None, held.reason
        else:
            began = clock()
            _promotion(server, plan, candidates[selected])
            if exclusive:
                unserved += clock() - began
    elif selected is not None:
        outcome, selected, reason = "kept_baseline", None, "time budget ran out"
    decided = outcome in ("promoted", "rejected")
    dropped = tuple(verdict.screening.dropped) if verdict.screening else ()
    return Projection(
        clock() / 60,
        rounds,
        server.requests,
        outcome,
        selected,
        decided,
        unserved,
        reason,
        verdict,
        screening_s,
        dropped,
        server.spent,
    )


def kept_answers(plan: FrozenPlan, profile: TargetProfile) -> ReferenceAnswers:
    """The live configuration's answers as an earlier cycle that asked the same would have kept
    them: its first greedy pass over the selection and the held-out prompts, and its quality
    answers (their most likely tokens as asked for a lossy plan)."""
    server = SimServer(profile, {}, 0)
    answers: list[ReferenceAnswer] = []
    for split, protocol in (
        ("selection", plan.protocol),
        ("heldout", heldout_protocol(plan.protocol)),
    ):
        prompts = prompts_by_class(load_suite(protocol.suite), split)
        suite = protocol.quality_suite
        spec = StartSpec(
            sim_recipe(BASELINE_ID),
            BASELINE_ID,
            prompts,
            protocol,
            greedy_times=1,
            quality_suite=suite,
            timed=False,
            reported=False,
        )
        result = server(spec, lambda _: None)
        run = CandidateRun(candidate=BASELINE_ID, greedy=result.greedy, samples=result.quality)
        tasks = load_suite(suite).prompts if suite else []
        every = greedy_prompts(protocol, prompts)
        answers += answers_of(run, every, tasks, protocol.max_tokens, "projected")
    answers = [
        a.model_copy(update={"sample": a.sample.model_copy(update={"top_logprobs": []})})
        for a in answers
    ]
    return ReferenceAnswers(key="0" * 64, recipe="projected", answers=answers)


def _live_check(server: SimServer, plan: FrozenPlan, live: Recipe) -> None:
    """The live service's sanity measurement: short requests one at a time, once."""
    began = server.clock()
    spec = StartSpec(live, BASELINE_ID, prompts_of(plan), _short_c1(plan))
    for batch in start_plan(spec):
        server._batch(
            server.profile.baseline, 1.0, random.Random(server.seed), batch.requests, batch.kind
        )
    server._spend("live timed", server.clock() - began)


def _promotion(server: SimServer, plan: FrozenPlan, winner: Recipe) -> None:
    """The winner started on its own port and verified there: its load and one greedy pass."""
    truth = server.truth(winner.candidate_id)
    server.clock.t += truth.load_s
    server._spend("promote load", truth.load_s)
    began = server.clock()
    spec = StartSpec(winner, winner.candidate_id, prompts_of(plan), plan.protocol, greedy_times=1)
    for batch in start_plan(spec):
        if batch.kind == "greedy":
            server._batch(truth, 1.0, random.Random(server.seed), batch.requests, batch.kind)
    server._spend("promote greedy", server.clock() - began)


def _judged(
    verdict: Verdict, runs: dict[str, CandidateRun], losses: list
) -> tuple[str, str | None, str]:
    if verdict.selected is not None and not losses:
        return "promoted", verdict.selected, verdict.reason
    every = [v.decision for v in verdict.candidates]
    if every and all(d == Decision.REJECTED for d in every) or losses:
        return "rejected", None, verdict.reason
    return "kept_baseline", None, verdict.reason


def prompts_of(plan: FrozenPlan) -> dict[str, list[SuitePrompt]]:
    """The plan's selection prompts by request class, as the cycle measures them."""
    return prompts_by_class(load_suite(plan.protocol.suite), "selection")


def _short_c1(plan: FrozenPlan):
    return short_c1(plan.protocol).model_copy(update={"repeats": 1})
