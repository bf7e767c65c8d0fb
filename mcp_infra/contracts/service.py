"""The managed service: recipes, process records, config.yaml, the front's route and status."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from mcp_infra.contracts.base import ID_PATTERN, Contract, Part, unset
from mcp_infra.contracts.manifest import (
    SHA256_PATTERN,
    CandidateClass,
    Knobs,
    Semantics,
    TemplateName,
)
from mcp_infra.contracts.models import ModelSource


class RecipeRuntime(Part):
    """The pinned environment a recipe runs from: which one, its interpreter and the digests
    of its lock and files, checked again before each start (``state.runtimes``)."""

    env_hash: Annotated[str, Field(pattern=SHA256_PATTERN)]
    python: str = Field(max_length=1000, description="the environment's interpreter")
    lock_digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    files_digest: Annotated[str, Field(pattern=SHA256_PATTERN)]
    label: str = Field("", max_length=200, description="e.g. mlx-lm 0.32.1 (shared site)")


class Recipe(Contract):
    """Exactly what runs on a port: template, knobs and resolved artifact paths with hashes."""

    candidate_id: str
    template: TemplateName
    model_path: str
    draft_path: str | None = None
    knobs: Knobs = Field(default_factory=Knobs)
    artifact_hashes: dict[str, str] = Field(default_factory=dict)
    semantics: Semantics = Semantics.LOSSLESS
    candidate_class: CandidateClass | None = None
    manifest_hash: str | None = None
    runtime: RecipeRuntime | None = Field(
        None, description="its own pinned environment; None: the control plane's interpreter"
    )

    def key(self) -> str:
        """Identity of a recipe for comparisons (ignores the hashes' order)."""
        fields = {"template", "model_path", "draft_path", "knobs"}
        return self.model_dump_json(include=fields | ({"runtime"} if self.runtime else set()))


LOCAL_HOST = "127.0.0.1"
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$"


class ClusterHost(Part):
    """One machine that may run ranks of a split recipe (config.yaml ``distributed.hosts``).
    Hosts exist only in the home's own configuration: a plan or a manifest names a distributed
    candidate (how many ranks, which backend and split), never a host."""

    name: Annotated[str, Field(pattern=ID_PATTERN)]
    ssh: Annotated[str, Field(pattern=HOSTNAME_PATTERN)] = Field(
        LOCAL_HOST,
        description="what mlx.launch reaches it by: 127.0.0.1 is this machine (no ssh); any "
        "other name or address is reached over ssh (user, port and keys from ~/.ssh/config)",
    )
    ssh_port: int = Field(22, ge=1, le=65535, description="checked for reachability by preflight")
    ips: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="addresses the ring backend connects over (default: ssh, if an address)",
    )
    rdma: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None] = Field(
        default_factory=list,
        max_length=16,
        description="jaccl: the RDMA device towards each host in order (null for itself)",
    )
    slots: int = Field(1, ge=1, le=16, description="ranks this host may run")

    @field_validator("ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            ipaddress.ip_address(item)  # ValueError names the bad one
        return value

    @property
    def local(self) -> bool:
        return self.ssh == LOCAL_HOST

    def ring_ips(self) -> list[str]:
        """Addresses the ring backend uses: ``ips``, else ``ssh`` when it is an address."""
        import ipaddress

        if self.ips:
            return list(self.ips)
        try:
            ipaddress.ip_address(self.ssh)
        except ValueError:
            return []
        return [self.ssh]


def _local_only() -> list[ClusterHost]:
    return [ClusterHost(name="local", ssh=LOCAL_HOST, slots=2)]


class DistributedConfig(Part):
    """config.yaml ``distributed:``: the machines split recipes may use, in rank order."""

    hosts: list[ClusterHost] = Field(default_factory=_local_only, min_length=1, max_length=16)
    reach_timeout_s: float = Field(
        3.0, gt=0, le=60, description="preflight: the longest wait for a host to answer"
    )

    @model_validator(mode="after")
    def _unique(self) -> DistributedConfig:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("distributed host names must be unique")
        return self


class HostProbe(Part):
    """What preflight found on one configured host: reachable as configured, its packages, the
    fingerprints of the model folders a split recipe loads there, its memory."""

    name: str
    ssh: str
    reachable: bool
    detail: str = ""
    packages: dict[str, str] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict, description="path -> fingerprint")
    memory_gb: float | None = None
    python: str | None = None


class RankRecord(Part):
    """One rank of a split server: where it runs and, on this machine, its process."""

    rank: int = Field(ge=0)
    host: str = Field(description="the configured host's name")
    pid: int | None = Field(None, description="local ranks only")
    create_time: float | None = None
    log_path: str | None = None
    env: dict[str, str] = Field(
        default_factory=dict, description="the rank's MLX_* environment as it started"
    )


class LaunchRecord(Part):
    """How a split server was launched: mlx.launch's backend and split, its hosts and ranks."""

    backend: Literal["ring", "jaccl", "mpi"]
    split: Literal["tensor", "pipeline"]
    hosts: list[str]
    ring_port: int | None = Field(None, description="mlx.launch --starting-port")
    hostfile: str = Field(description="the JSON hostfile given to mlx.launch")
    log_dir: str = Field(description="where each local rank writes rank-<n>.log")
    ranks: list[RankRecord] = Field(default_factory=list)


class LaunchEvidence(Part):
    """One split server start measured in a cycle: the configuration, start, port and launch."""

    candidate: str
    start: int = Field(ge=0)
    round: int = Field(ge=0)
    port: int
    launch: LaunchRecord


class DistributedEvidence(Contract):
    """cycles/<id>/distributed.json: the hosts a cycle's split recipes ran on, as preflight
    found them, and every split start with its backend, split mode and ranks' environment."""

    hosts: list[HostProbe] = Field(default_factory=list)
    launches: list[LaunchEvidence] = Field(default_factory=list)


class ProcessRecord(Contract):
    """A server the project started: enough to find it again, never confused with a stranger."""

    role: Literal["stable", "candidate", "front", "backend"]
    pid: int
    pgid: int
    create_time: float = Field(description="process start time (epoch seconds, from the OS)")
    argv: list[str]
    host: str
    port: int
    log_path: str
    candidate_id: str
    cycle_id: str | None = None
    started_at: datetime
    ready_s: float | None = Field(None, description="seconds from start until it answered")
    launch: LaunchRecord | None = Field(
        None, description="a split server: pid and pgid are mlx.launch's; its ranks are here"
    )
    cpus: list[int] | None = Field(
        None, description="the CPUs its threads were kept on (ServiceConfig.server_cpus)"
    )


class FrontConfig(Part):
    """config.yaml ``front:``: how the front guards the stable port. Every wait and every size
    is bounded, so no client, slow or hostile, can hold the front's memory or descriptors."""

    max_per_backend: int = Field(
        16, ge=1, le=1024, description="requests sent to one backend at once; the rest wait"
    )
    max_queue: int = Field(
        512, ge=0, le=100_000, description="requests waiting at once; past it: 503 Retry-After"
    )
    max_connections: int = Field(
        1024,
        ge=8,
        le=100_000,
        description="open client connections; at the cap an idle or "
        "still-unsent one is closed for a new one",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=600, description="longest a new connection may take to send its headers"
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest a kept-alive connection may wait between requests"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest wait for the next piece of a request body"
    )
    send_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="longest a client may leave answer bytes unread"
    )
    max_header_bytes: int = Field(16_384, ge=1024, le=1 << 20)
    max_body_bytes: int = Field(32 << 20, ge=1024, le=1 << 31)
    max_connect_attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="connection attempts to a backend per request; a request is retried only "
        "when no byte of it reached the backend",
    )
    allow_origins: list[str] = Field(
        default_factory=list,
        description="web origins allowed to read answers (CORS); none by default, '*' for any",
    )
    token_file: str | None = Field(
        None, description="file holding a bearer token that every client must send"
    )
    ipv6: bool = Field(True, description="also hold [::1] on the stable port")
    heal: bool = Field(True, description="restart a live backend that died")
    heal_max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="restarts allowed within heal_window_s; one more death raises needs-operator",
    )
    heal_window_s: float = Field(600.0, gt=0, le=86_400)
    heal_max_failures: int = Field(
        3, ge=1, le=100, description="failed restart attempts in a row before needs-operator"
    )


class ServiceConfig(Contract):
    """config.yaml: the managed service."""

    host: Literal["127.0.0.1"] = "127.0.0.1"
    port: int = Field(8080, ge=1024, le=65535)
    scratch_port: int = Field(8090, ge=1024, le=65535)
    policy: Annotated[str, Field(pattern=ID_PATTERN)] = "default"
    baseline: Recipe
    front: FrontConfig = Field(default_factory=FrontConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    server_cpus: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="keep each server this home starts (the live one and every measured one "
        "alike) on this many CPUs, the last ones this process may use (Linux; None: all). "
        "The demo sets 1: on a 2-CPU VM the tiny models' servers then ran without the "
        "2.5x-slower spells that unpinned ones had (procs.runtime.pin_to_cpus)",
    )
    model: ModelSource | None = Field(
        None,
        exclude_if=unset,
        description="the model `mcp-infra init --model` configured: what was given, the folder "
        "served and the sha256 of its files, checked before each start",
    )
    model_dirs: list[Annotated[str, Field(min_length=2, max_length=1000)]] = Field(
        default_factory=list,
        exclude_if=unset,
        max_length=32,
        description="folders where the catalog looks for drafters and build sources, besides "
        "the Hugging Face hub cache (each a model folder or a folder of model folders)",
    )


class FrontRoute(Contract):
    """state/route.json: where the front sends requests. Written only by the supervisor side
    (atomically); the front polls it and echoes the generation it adopted in FrontStatus."""

    generation: int = Field(ge=0)
    mode: Literal["serve", "hold"]
    backend_url: str | None = None
    candidate_id: str | None = None
    max_hold_s: float = Field(120.0, gt=0, le=3600)
    scope: str | None = Field(None, description="the cycle whose impact is being counted")
    reason: str = Field("", max_length=300)
    updated_at: datetime


class BackendHealth(Part):
    url: str | None = None
    healthy: bool | None = None
    checked_at: datetime | None = Field(
        None, description="when the probe last saw this health change (probes run every 2 s)"
    )
    detail: str = ""


class FrontCounters(Part):
    live_requests: int = Field(0, description="requests received (served or in flight)")
    served: int = 0
    held: int = 0
    longest_hold_s: float = 0.0
    rejected_503: int = Field(
        0, description="every 503 the front answered (hold bound, full queue, backend down)"
    )
    upstream_errors: int = 0
    unserved_s: float = Field(0.0, description="seconds with no backend able to serve")
    queued: int = Field(0, description="requests that waited for a free slot on their backend")
    rejected_queue_full: int = 0
    refused: int = Field(
        0,
        description="requests the front answered itself with 4xx: path, method, size, token, body",
    )
    failed_streams: int = Field(
        0, description="answers the backend ended before they were complete"
    )
    client_gone: int = Field(0, description="clients that left before their answer was complete")
    connect_retries: int = Field(
        0, description="attempts repeated because no byte reached the backend"
    )
    dropped_connections: int = Field(
        0, description="connections closed by a limit: header time, idle time, the connection cap"
    )


class TaskHealth(Part):
    """One of the front's background tasks, supervised: a failure is logged and it restarts."""

    state: Literal["running", "restarting"] = "running"
    failures: int = 0
    last_error: str = ""
    last_error_at: datetime | None = None


class HealState(Part):
    """What the front did about a live backend that died (``core.frontrules`` decides)."""

    state: Literal["ok", "restarting", "backing_off", "waiting", "needs_operator", "off"] = "ok"
    deaths: int = 0
    recent_deaths: list[datetime] = Field(default_factory=list)
    restarts: int = 0
    failures: int = Field(0, description="failed restart attempts in a row")
    last_death_at: datetime | None = None
    last_restart_at: datetime | None = None
    restored_in_s: float | None = Field(None, description="death to serving again, last time")
    next_attempt_at: datetime | None = None
    note: str = Field("", max_length=600)


class LogHealth(Part):
    """Whether the product's logs can be written (the home's disk has room, the front's status
    file is written). Held in the front's memory and said in ``GET /health``: a full disk
    cannot keep it from being said."""

    state: Literal["ok", "degraded"] = "ok"
    since: datetime | None = Field(None, description="when logging became degraded")
    detail: str = Field("", max_length=300)


class Watchdog(Part):
    """The keeper's replacements of a proxy that missed its heartbeat or exited."""

    replaced: int = 0
    last: str = Field("", max_length=400, description="why and when the last one was replaced")


class FrontStatus(Contract):
    """state/front_status.json: written by the front when its content changed (at most every
    0.2 s), never otherwise, so a reader that watches it sees changes only. The supervisor side
    asks the front itself (``GET /health``) when it needs the figures of this instant."""

    pid: int
    generation: int
    mode: Literal["serve", "hold"]
    backend_url: str | None = None
    in_flight: int = 0
    in_flight_by_backend: dict[str, int] = Field(default_factory=dict)
    held_now: int = 0
    queued_now: int = 0
    total: FrontCounters = Field(default_factory=FrontCounters)
    scope: str | None = None
    scoped: FrontCounters = Field(default_factory=FrontCounters)
    backend: BackendHealth = Field(default_factory=BackendHealth)
    unserved_since: datetime | None = None
    listening: list[str] = Field(default_factory=list)
    tasks: dict[str, TaskHealth] = Field(default_factory=dict)
    healing: HealState = Field(default_factory=HealState)
    logging: LogHealth = Field(default_factory=LogHealth)
    watchdog: Watchdog = Field(default_factory=Watchdog)
    updated_at: datetime


class ServiceImpact(Contract):
    """cycles/<id>/service_impact.json: what the stable endpoint's clients saw during a cycle."""

    mode: Literal["concurrent", "exclusive"]
    mode_reason: str = Field("", max_length=500)
    promotion_mode: Literal["concurrent", "exclusive"] | None = Field(
        None, description="how a winner was swapped in, if the cycle got that far"
    )
    expected_downtime_s: float = Field(ge=0)
    unserved_s: float | None = None
    requests_held: int | None = None
    longest_hold_s: float | None = None
    rejected_503: int | None = None
    upstream_errors: int | None = None
    live_requests: int | None = None
    front_restarted: bool = False
    note: str = Field("", max_length=500)


class SupervisorRecord(Contract):
    pid: int
    create_time: float
    started_at: datetime
    cycle_id: str | None = None
