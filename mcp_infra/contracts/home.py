"""Other home files: the cycle in progress, needs-operator, the audit log of ``propose_plan``,
recipe memory, watch state, artifact inventories and process usage."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from mcp_infra.contracts.base import REVISION_PATTERN, Contract, Part
from mcp_infra.contracts.journal import CycleState, Outcome
from mcp_infra.contracts.verdicts import Decision


class CurrentCycle(Contract):
    """state/current.json: the cycle in progress, as its journal last said (for ``status``)."""

    cycle_id: str
    state: CycleState
    message: str
    candidate: str | None = None
    index: int | None = None
    total: int | None = None


class NeedsOperatorRecord(Contract):
    """state/needs_operator.json: the service could not be restored; no cycle runs until a
    person runs `mcp-infra recover`."""

    cycle_id: str
    reason: str
    ts: datetime


class AuditRecord(Contract):
    ts: datetime
    client: str
    plan_hash: str
    accepted: bool
    plan_id: str | None = None
    detail: str = ""


class RememberedGate(Part):
    gate: str
    passed: bool
    detail: str = ""


class RememberedOutcome(Part):
    """What one cycle learned about one candidate, with what it was judged under."""

    candidate: str
    cycle_id: str
    sealed_at: datetime
    manifest_hash: str | None = None
    environment_key: str
    policy_hash: str | None = None
    decision: Decision
    reasons: list[str] = Field(default_factory=list)
    gates: list[RememberedGate] = Field(default_factory=list)
    started: bool = True
    speedup_estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    baseline_tps: float | None = None
    candidate_tps: float | None = None
    peak_memory_gb: float | None = None
    max_peak_memory_gb: float | None = Field(None, description="the memory cap it was judged by")
    selected: bool = False


class CycleMemory(Contract):
    """memory/<cycle_id>.json: every candidate outcome of one sealed cycle."""

    cycle_id: str
    outcome: Outcome
    recorded_at: datetime
    environment: dict[str, str]
    outcomes: list[RememberedOutcome] = Field(default_factory=list)


class RecheckAttempt(Part):
    count: int = Field(0, ge=0)
    last: float = Field(0.0, description="epoch seconds of the latest attempt")


class WatchState(Contract):
    """state/watch.json: re-checks `supervise --watch` proposed, per (candidate, conditions)."""

    rechecks: dict[str, RecheckAttempt] = Field(default_factory=dict)


class InventoryFile(Part):
    path: str
    size: int
    sha256: str


class ArtifactInventory(Contract):
    """The sha256 of every file of a prepared hub snapshot, checked before each use."""

    repo: str
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)]
    snapshot: str
    allow_patterns: list[str] = Field(default_factory=list)
    prepared_at: datetime
    files: list[InventoryFile]
    digest: str = Field(description="sha256 over the sorted (path, size, sha256) list")


class ProcessUsage(Contract):
    """CPU and memory of one server process (tree), sampled while it ran and before it stopped."""

    pid: int
    create_time: float
    role: str
    label: str
    first_at: datetime
    first_cpu_s: float
    last_at: datetime
    last_cpu_s: float
    peak_rss_gb: float | None = None
    peak_source: str = ""


class UsageStart(Contract):
    """<cycle>/usage-start.json: counters read when the cycle began."""

    at: datetime
    monotonic: float
    supervisor_cpu_s: float
    energy_uj: dict[str, int] = Field(default_factory=dict)
