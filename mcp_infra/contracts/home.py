"""Other home files: the cycle in progress, needs-operator, the audit log of ``propose_plan``,
recipe memory, watch state, artifact inventories and process usage."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from mcp_infra.contracts.base import REVISION_PATTERN, Contract, InventoryFile, Part
from mcp_infra.contracts.journal import CycleState, Outcome
from mcp_infra.contracts.manifest import SHA256_PATTERN, RuntimeEnvSpec
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
    failed_requests: int = Field(
        0,
        ge=0,
        description="requests of its selection run that got no answer (its server died, hung or "
        "refused): a gate that failed beside them judged no answers, so it is not held against "
        "the recipe",
    )
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


class ArtifactInventory(Contract):
    """The sha256 of every file of a prepared hub snapshot, checked before each use."""

    repo: str
    revision: Annotated[str, Field(pattern=REVISION_PATTERN)]
    snapshot: str
    allow_patterns: list[str] = Field(default_factory=list)
    prepared_at: datetime
    files: list[InventoryFile]
    digest: str = Field(description="sha256 over the sorted (path, size, sha256) list")


class LockedPackage(Part):
    """One distribution the environment's interpreter sees, where it is found first."""

    name: str = Field(max_length=100)
    version: str = Field(max_length=100)
    location: Literal["environment", "shared"]


class RuntimeLock(Contract):
    """A built runtime environment's full resolved lock: every package and version it sees,
    the flags its servers accept (from their ``--help`` at build time) and the sha256 of every
    file in it. Hashed like a model artifact and re-checked before each use."""

    env_hash: Annotated[str, Field(pattern=SHA256_PATTERN)]
    spec: RuntimeEnvSpec
    python: str = Field(description="the environment's interpreter (a path)")
    python_version: str
    platform: str
    shared_site: str | None = Field(
        None, description="the control plane's site-packages the environment sees (site: shared)"
    )
    packages: list[LockedPackage]
    lock_digest: str = Field(description="sha256 over the sorted (name, version, location) list")
    accepted_flags: dict[str, list[str]] = Field(
        default_factory=dict, description="launch template → the flags its server's --help lists"
    )
    help_sha256: dict[str, str] = Field(default_factory=dict)
    files: list[InventoryFile]
    files_digest: str = Field(description="sha256 over the sorted (path, size, sha256) list")
    size_bytes: int = 0
    built_at: datetime
    build_s: float | None = None
    builder: str = Field("", max_length=200, description="how it was built (uv, or venv + pip)")


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
