"""The managed service: recipes, process records, config.yaml, the front's route and status."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from mcp_infra.contracts.base import ID_PATTERN, Contract, Part
from mcp_infra.contracts.manifest import CandidateClass, Knobs, Semantics, TemplateName


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

    def key(self) -> str:
        """Identity of a recipe for comparisons (ignores the hashes' order)."""
        return self.model_dump_json(include={"template", "model_path", "draft_path", "knobs"})


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
