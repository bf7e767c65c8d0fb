"""Samples and runs: every measured request, round and cell of one configuration."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from mcp_infra.contracts.base import SHA256_PATTERN, Contract, Part, unset
from mcp_infra.contracts.manifest import CandidateClass, Knobs, Semantics


class CodeRun(Part):
    """A quality task's code answer run against the task's tests in a separate, limited process
    (``procs.sandbox``), recorded beside the answer so the gate judges it without running it."""

    digest: str = Field(
        description="sha256 of the function, the code extracted from the answer and the tests "
        "(core.answers.CodeJob.digest): the gate checks the run is of this answer's code"
    )
    passed: int = Field(ge=0, description="tests whose call returned the expected value")
    total: int = Field(ge=0, description="tests run")
    detail: str = Field(max_length=500, description="the first failure, a timeout, or all passed")

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


class Sample(Contract):
    """One measured request."""

    candidate: str
    phase: Literal["warmup", "measure", "verify", "drift", "quality", "heldout", "busy"] = Field(
        "measure",
        description="what it was for; busy: timed in a start that other processes slowed, kept "
        "in the evidence and never selected (the start was measured again, RoundRecord.set_aside)",
    )
    prompt_id: str
    repeat: int
    order: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    decode_tps: float | None = None
    e2e_s: float | None = None
    e2e_tps: float | None = None
    finish_reason: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = Field(
        None,
        exclude_if=unset,
        description="per output token, the runtime's most likely tokens at that step as (token "
        "id, log-probability), most likely first: asked in the greedy passes and quality tasks "
        "of a plan with a lossy candidate (core.fidelity); None where not asked or not given",
    )
    code_run: CodeRun | None = Field(
        None, exclude_if=unset, description="a code task's answer run against its tests"
    )
    error: str | None = None
    start: int = Field(
        0,
        ge=0,
        description="index of the fresh server process this sample was "
        "measured in (per configuration, counted from 0)",
    )
    round: int = Field(0, ge=0, description="measurement round the sample belongs to")
    started_at: datetime | None = Field(
        None, description="UTC wall-clock time the request was sent"
    )
    t_mono: float | None = Field(None, description="time.monotonic() when the request was sent")
    timing_source: Literal["client", "server"] = Field(
        "client", description="who timed it: the client (streamed tokens) or the server's timings"
    )
    request_class: Literal["short", "long_prefill"] = "short"
    concurrency: int = Field(
        1, ge=1, le=64, description="requests in flight at once, this included"
    )


class MachineLoad(Part):
    """What the rest of the machine did while one server start ran (core.machine, from two
    psutil readings): a busy machine slows starts unevenly and widens the intervals, so each
    round says how busy it was."""

    window_s: float = Field(ge=0, description="seconds between the two readings")
    cpus: int = Field(ge=1, description="logical CPUs of the machine")
    other_cpu_s: float = Field(
        ge=0,
        description="CPU seconds of every process other than this supervisor (with the servers "
        "it started and reaped, the measured one included) and the front",
    )
    other_cpu_fraction: float = Field(
        ge=0, description="other_cpu_s over the window's CPU capacity (window_s x cpus)"
    )
    own_cpu_s: float | None = Field(
        None,
        ge=0,
        description="CPU seconds the left-out processes took: the measurement's own (the "
        "measured server, the requests this supervisor sent, the front)",
    )
    steal_s: float | None = Field(
        None, description="CPU seconds a hypervisor gave to other machines (Linux guests)"
    )
    load_avg_1m: float | None = Field(
        None, description="the higher 1-minute load average of the two readings (ours included)"
    )
    available_memory_fraction: float | None = Field(
        None, ge=0, le=1, description="the lower available/total memory of the two readings"
    )
    swap_in_bytes: int | None = Field(None, ge=0)
    swap_out_bytes: int | None = Field(None, ge=0)
    waited_s: float | None = Field(
        None,
        ge=0,
        description="seconds the start waited for a quiet machine first (service."
        "quiet_cpu_fraction); None when the policy does not wait",
    )
    quiet: bool | None = Field(
        None, description="whether the machine was quiet when the wait ended; None: no wait"
    )


class RoundRecord(Part):
    """One fresh server process of one configuration in one measurement round (flows.measure)."""

    config: str = Field(description="the configuration measured: baseline or a candidate id")
    start: int = Field(ge=0, description="index of this configuration's fresh process, from 0")
    round: int = Field(ge=0)
    position: int = Field(0, ge=0, description="its place in the round's interleaved order")
    started_at: datetime
    ended_at: datetime
    port: int | None = None
    live_requests: int | None = Field(
        None,
        description="live requests the stable endpoint served while this round ran "
        "(co-tenant load); None when no counter was available",
    )
    error: str | None = None
    machine: MachineLoad | None = Field(
        None, description="the rest of the machine's load while it ran; None: not read"
    )
    peak_gb: float | None = Field(None, description="this start's peak memory (GB); None: not read")
    set_aside: str | None = Field(
        None,
        description="why this start's timed samples were set aside (phase busy) and the start "
        "measured again (the held-out check's busy rule: flows.confirm.heldout_machine); None: "
        "kept",
    )


class CellFigures(Part):
    """One configuration's figures in one workload cell, and how they compare with the baseline's
    in the same cell (reported in words by the cycle; the selector decides on the samples)."""

    request_class: Literal["short", "long_prefill"]
    concurrency: int = Field(ge=1, le=64)
    role: Literal["decisive", "guard", "reported"] = "decisive"
    requests: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    decode_tps: float | None = Field(None, description="median per-request decode tok/s")
    aggregate_tps: float | None = Field(
        None,
        description="output tokens / wall span of the cell's requests, per start, geometric "
        "mean over starts (core.workload.aggregate_tps, as the verdict's output tok/s)",
    )
    aggregate_vs_baseline: float | None = None
    decode_vs_baseline: float | None = None


class ReferenceSource(Part):
    """Answers a run holds that an earlier cycle measured: a baseline's greedy outputs and
    quality answers are a deterministic function of its configuration (model files, runtime,
    machine, knobs) and of each prompt, so a cycle whose baseline is a configuration measured
    before compares with those answers instead of asking them again."""

    key: Annotated[str, Field(pattern=SHA256_PATTERN)] = Field(
        description="the configuration's identity (state.references.reference_key)"
    )
    cycles: list[str] = Field(
        max_length=64, description="the cycles whose fresh starts measured the answers"
    )
    greedy: int = Field(0, ge=0, description="greedy outputs taken from them")
    quality: int = Field(0, ge=0, description="quality answers taken from them")


class ReferenceAnswer(Part):
    """One answer of a configuration, as the first greedy pass of a fresh start gave it."""

    kind: Literal["greedy", "quality"]
    digest: Annotated[str, Field(pattern=SHA256_PATTERN)] = Field(
        description="sha256 of the prompt as asked: its messages and answer budget"
    )
    cycle_id: str = Field(max_length=100)
    sample: Sample


class ReferenceAnswers(Contract):
    """references/<key>.json: every answer kept for one configuration, one per (kind, prompt),
    the newest measurement of each (core.reference)."""

    key: Annotated[str, Field(pattern=SHA256_PATTERN)]
    recipe: str = Field(max_length=20_000, description="the configuration (Recipe.key())")
    answers: list[ReferenceAnswer] = Field(default_factory=list, max_length=4096)


class CandidateRun(Contract):
    """Everything measured for one candidate: the input to selection, kept raw in evidence."""

    candidate: str
    candidate_class: CandidateClass | None = None
    semantics: Semantics = Semantics.LOSSLESS
    knobs: Knobs = Field(default_factory=Knobs)
    started: bool = True
    start_error: str | None = None
    peak_memory_gb: float | None = None
    memory_source: str | None = None
    samples: list[Sample] = Field(default_factory=list)
    greedy: list[Sample] = Field(default_factory=list)
    cache_note: str = ""
    purpose: Literal["selection", "heldout", "live"] = Field(
        "selection",
        description="selection runs feed the selector; held-out runs are the final "
        "check of the winner; the live run is the live service's sanity measurement",
    )
    starts: int = Field(0, ge=0, description="fresh server processes this configuration ran in")
    rounds: list[RoundRecord] = Field(default_factory=list)
    stopped: str = Field("", description="why measuring this configuration stopped")
    cells: list[CellFigures] = Field(default_factory=list)
    reference: ReferenceSource | None = Field(
        None,
        exclude_if=unset,
        description="where its greedy outputs or quality answers came from when this cycle did "
        "not ask them again: an earlier cycle's fresh start of the same configuration "
        "(state.references); None: every answer here was measured in this cycle",
    )
