"""The front: mcp-infra's reverse proxy on the stable port, and the supervisor's handle on it.

Clients talk to the front; backends (the live recipe, candidates) run on ports of their own. The
front forwards the OpenAI-compatible API (streaming included, bytes relayed as they come) to the
backend its route names, so a promotion is a route switch between two running backends, not a
restart of the port clients use.

It makes the service more reliable than the bare server, not only movable:
- **Bounded, queued.** At most ``max_per_backend`` requests go to one backend at a time (and at
  most four connection attempts at once: mlx_lm.server's listen backlog is 5); the rest wait in
  one first-come queue, up to ``max_queue``, past which a client gets 503 with ``Retry-After``.
  A client waits instead of being reset.
- **Limits everywhere.** Header time, idle time, body size (a larger ``Content-Length`` is refused
  before a byte of the body is read; bodies up to 256 KiB are read and checked as JSON, larger
  ones streamed), time to read an answer, and the number of connections (at the cap the oldest
  connection that has no request in progress is closed to make room).
- **Honest failures.** A request is retried only when no byte of it reached a backend (the
  connection could not be opened), at most ``max_connect_attempts`` times and never for a client
  that has gone. A backend that ends an event stream before ``data: [DONE]`` (a crash) ends the
  client's stream with an error event, and the answer counts as failed.
- **Exposure.** Only the OpenAI-compatible paths and ``/health`` are served, read strictly
  (``core.frontrules.classify``); CORS headers from backends are dropped (mlx_lm.server sends
  ``*``) unless ``allow_origins`` is configured; an optional bearer token; 127.0.0.1 and ::1 are
  both held, so no other local user can take [::1] on the same port.
- **Self-healing.** When the live backend's recorded process is gone, the front asks for a
  restart (``python -m mcp_infra.procs.heal``, which takes the service lock, starts the recipe
  and switches to it) with bounded backoff; a backend that keeps dying raises needs-operator.
- **Supervised tasks.** Route polling, status writing, probing and healing each restart after a
  failure (logged, counted, visible in the status as ``tasks``).

Control is by one file, ``state/route.json`` (a ``FrontRoute``, written atomically by the
supervisor side), not by a socket: the route must survive a restart of the front anyway, so the
file is the one source of truth a restarted front resumes from. The front polls the file's
identity every 20 ms and echoes the generation it adopted, with its counters, the backend's
health and its healing, in ``state/front_status.json`` (written only when its content changed)
and in ``GET /health``; the supervisor side asks ``/health`` and waits for the new route to be
adopted and its backend seen healthy before it drains or stops anything (``set_route`` raises
``RouteNotAdopted`` otherwise).

Run: ``python -m mcp_infra.procs.front --home DIR --port PORT`` (started by ``ensure_front``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import h11
import httpx2 as httpx
import psutil

from mcp_infra.contracts import (
    BackendHealth,
    FrontConfig,
    FrontCounters,
    FrontRoute,
    FrontStatus,
    HealState,
    ProcessRecord,
    ServiceConfig,
    TaskHealth,
)
from mcp_infra.core import frontrules as rules
from mcp_infra.core.admission import hold_expired, retry_after_s, route_to
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.runtime import (
    LOOPBACK,
    LOOPBACK6,
    PortBusy,
    backend_url,
    is_running,
    port_open,
    port_owner_is,
    service_lock_held,
    stop_server,
)
from mcp_infra.state.context import load_config, mark_needs_operator, service_record
from mcp_infra.state.store import CorruptFile, Home, read_optional, utcnow, write_model

ROUTE_POLL_S = 0.02
STATUS_EVERY_S = 0.2
PROBE_EVERY_S = 2.0
PROBE_DOWN_S = 0.5
READ_CHUNK = 65_536
BUFFER_BODY_BYTES = 256 * 1024
CONNECTS_PER_BACKEND = 4  # below mlx_lm.server's listen backlog of 5
CONNECT_TIMEOUT_S = 10.0
HEAL_TIMEOUT_S = 240.0
SICK_AFTER_S = 10.0  # a running backend that answers /health with an error this long is restarted
SHUTDOWN_S = 5.0


def route_path(home: Home) -> Path:
    return home.state / "route.json"


def status_path(home: Home) -> Path:
    return home.state / "front_status.json"


def record_path(home: Home) -> Path:
    return home.state / "front.json"


def front_token(home: Home, cfg: FrontConfig) -> str | None:
    """The bearer token named by the config (a path relative to the home, or absolute)."""
    if not cfg.token_file:
        return None
    path = Path(cfg.token_file)
    path = path if path.is_absolute() else home.root / path
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def _log(message: str) -> None:
    """A line in the front's log; never raises (a full disk must not kill a task's handler)."""
    with contextlib.suppress(Exception):
        print(f"{utcnow():%Y-%m-%d %H:%M:%S} front: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The front process: talking to backends
# ---------------------------------------------------------------------------------------------


class Unreachable(Exception):
    """No connection to the backend could be opened: no byte of the request reached it."""


class UpstreamBroken(Exception):
    """The backend's connection failed after the request was (partly) sent."""


class Slow(UpstreamBroken):
    """The backend accepted the connection but did not answer in time."""


class BodyFailed(Exception):
    """The client's request body could not be read (too slow, too large, or the client left)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Outbound(NamedTuple):
    """One request as the front sends it on to a backend (``url``), body buffered or streamed."""

    method: str
    url: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes | AsyncIterator[bytes]
    length: int


class Upstream:
    """One HTTP/1.1 exchange with a backend on a fresh connection (never reused: a request is
    then known to have reached no backend exactly when its connection could not be opened)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str, gate: asyncio.Semaphore, timeout: float) -> Upstream:
        parts = urlsplit(url)
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(parts.hostname, parts.port), timeout
                )
            except (OSError, TimeoutError) as exc:
                raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
        return cls(reader, writer)

    async def _write(self, event: h11.Event) -> None:
        data = self.h.send(event)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def send(self, request: Outbound) -> None:
        method, url, path, headers, body, length = request
        host = urlsplit(url).netloc
        out = [("host", host), *headers, ("connection", "close")]
        if method == "POST":
            out.append(("content-length", str(length)))
        try:
            await self._write(h11.Request(method=method, target=path, headers=out))
            if isinstance(body, bytes):
                if body:
                    await self._write(h11.Data(data=body))
            else:
                async for chunk in body:
                    await self._write(h11.Data(data=chunk))
            await self._write(h11.EndOfMessage())
        except (OSError, h11.ProtocolError) as exc:
            raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc

    async def _event(self) -> h11.Event:
        while True:
            try:
                event = self.h.next_event()
            except h11.ProtocolError as exc:
                raise UpstreamBroken(f"the backend's answer is not valid HTTP: {exc}") from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(READ_CHUNK)
                except OSError as exc:
                    raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc
                try:
                    self.h.receive_data(data)
                except h11.ProtocolError as exc:
                    raise UpstreamBroken(str(exc)) from exc
                continue
            return event  # type: ignore[return-value]

    async def response(self) -> h11.Response:
        while True:
            event = await self._event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamBroken("the backend closed the connection without an answer")
            if not isinstance(event, h11.InformationalResponse):
                raise UpstreamBroken(f"unexpected {type(event).__name__} from the backend")

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body as it comes; raises UpstreamBroken if it stops short of its
        declared length. A body delimited by the close ends cleanly: the caller checks it."""
        while True:
            event = await self._event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


async def get_once(
    url: str, path: str, gate: asyncio.Semaphore, timeout: float
) -> tuple[int, bytes]:
    """A small GET to a backend (probes, /v1/models), bounded in time."""

    async def run() -> tuple[int, bytes]:
        up = await Upstream.open(url, gate, timeout)
        try:
            await up.send(Outbound("GET", url, path, [("accept", "application/json")], b"", 0))
            response = await up.response()
            body = b"".join([c async for c in up.body()])
            return response.status_code, body[:1_000_000]
        finally:
            up.close()

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError as exc:
        raise Slow(f"no answer within {timeout:.0f} s") from exc


# ---------------------------------------------------------------------------------------------
# The front process: clients
# ---------------------------------------------------------------------------------------------


class QueueFull(Exception):
    pass


class HoldExpired(Exception):
    pass


class ClientGone(Exception):
    pass


class Waiter:
    __slots__ = ("future", "held", "since")

    def __init__(self, future: asyncio.Future[str], held: bool) -> None:
        self.future = future
        self.held = held
        self.since = time.monotonic()


class Conn:
    """One client connection: an h11 state machine over a stream, with the client's limits."""

    def __init__(
        self, front: Front, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.front = front
        self.cfg = front.cfg
        self.reader = reader
        self.writer = writer
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.cfg.max_header_bytes)
        self.evictable = True
        self.gone = asyncio.Event()
        self.on_gone: Callable[[], None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self.opened = time.monotonic()

    async def next_event(self, timeout: float) -> h11.Event:
        deadline = time.monotonic() + timeout
        while True:
            event = self.h.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            data = await asyncio.wait_for(self.reader.read(READ_CHUNK), remaining)
            self.h.receive_data(data)

    async def send(self, event: h11.Event) -> None:
        data = self.h.send(event)
        if data:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), self.cfg.send_timeout_s)

    async def answer(
        self,
        status: int,
        body: dict[str, Any] | bytes | None = None,
        headers: list[tuple[str, str]] | None = None,
        close: bool = False,
    ) -> None:
        """A whole answer the front writes itself."""
        data = (
            b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        out = [("content-type", "application/json")] if data else []
        out += [*(headers or []), ("content-length", str(len(data)))]
        if close or self.h.their_state not in {h11.DONE, h11.MUST_CLOSE}:
            out.append(("connection", "close"))  # an unread body: the connection cannot go on
        await self.send(h11.Response(status_code=status, headers=out))
        if data:
            await self.send(h11.Data(data=data))
        await self.send(h11.EndOfMessage())

    async def read_body(self, limit: int) -> bytes:
        """The whole body, within one body timeout and ``limit`` bytes."""
        if self.h.they_are_waiting_for_100_continue:
            await self.send(h11.InformationalResponse(status_code=100, headers=[]))
        parts: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.cfg.body_timeout_s
        while True:
            try:
                event = await self.next_event(max(0.0, deadline - time.monotonic()))
            except TimeoutError as exc:
                raise BodyFailed(408, "the request body did not arrive in time") from exc
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise BodyFailed(413, f"the request body is larger than {limit} bytes")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise BodyFailed(400, "the connection closed inside the request body")

    async def stream_body(self) -> AsyncIterator[bytes]:
        """A large body, piece by piece, each piece within the body timeout."""
        if self.h.they_are_waiting_for_100_continue:
            await self.send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            try:
                event = await self.next_event(self.cfg.body_timeout_s)
            except TimeoutError as exc:
                raise BodyFailed(408, "the request body did not arrive in time") from exc
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise BodyFailed(400, "the connection closed inside the request body")

    def watch(self) -> None:
        """Until the answer is written, notice a client that leaves (its end of the connection
        closes): then ``gone`` is set and ``on_gone`` aborts the backend's connection. Bytes of
        a pipelined next request are kept for later, up to the header limit."""

        async def run() -> None:
            kept = 0
            while kept <= self.cfg.max_header_bytes:
                try:
                    data = await self.reader.read(READ_CHUNK)
                except OSError:
                    data = b""
                if not data:
                    self.gone.set()
                    if self.on_gone:
                        self.on_gone()
                    return
                kept += len(data)
                self.h.receive_data(data)

        self._watch = asyncio.ensure_future(run())

    async def unwatch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
            self._watch = None

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class Front:
    """Everything the front knows, owned by its one event loop."""

    def __init__(self, home: Home, cfg: FrontConfig, token: str | None, port: int) -> None:
        self.home = home
        self.cfg = cfg
        self.token = token
        self.port = port
        self.route: FrontRoute | None = None
        self._route_sig: tuple[int, int, int] | None = None
        self.active: dict[str, int] = {}
        self.waiters: deque[Waiter] = deque()
        self.connect_gates: dict[str, asyncio.Semaphore] = {}
        self.total = FrontCounters()
        self.scoped = FrontCounters()
        self.health = BackendHealth()
        self.models_body: bytes | None = None
        self.unreachable: set[str] = set()
        self.sick_since: float | None = None
        self.unserved_since: datetime | None = None
        self._unserved_mono: float | None = None
        self.tasks: dict[str, TaskHealth] = {}
        self.healing = HealState(state="ok" if cfg.heal else "off")
        self.listening: list[str] = []
        self.conns: dict[Conn, None] = {}
        self.probe_now = asyncio.Event()
        self.heal_now = asyncio.Event()
        self.healer: asyncio.subprocess.Process | None = None
        self.stopping = asyncio.Event()
        self._dirty = True
        self._written: str | None = None

    # routing ------------------------------------------------------------------------------

    def serving_url(self) -> str | None:
        route = self.route
        return route.backend_url if route and route.mode == "serve" else None

    def ready_url(self) -> str | None:
        """The backend a request may be sent to now, if any."""
        url = self.serving_url()
        return url if url and url not in self.unreachable else None

    def max_hold_s(self) -> float:
        return self.route.max_hold_s if self.route else 120.0

    def poll_route(self) -> bool:
        """Adopt a changed route file; True if it changed."""
        path = route_path(self.home)
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._route_sig:
            return False
        try:
            route = read_optional(path, FrontRoute)
        except CorruptFile:
            return False
        self._route_sig = sig
        if route is None:
            return False
        if route.scope != (self.route.scope if self.route else None):
            self.scoped = FrontCounters()
        if route.backend_url != (self.route.backend_url if self.route else None):
            self.health = BackendHealth(url=route.backend_url)
            self.unreachable.discard(route.backend_url or "")
            self.sick_since = None
            self.probe_now.set()
        self.route = route
        self._availability()
        self.dispatch()
        self._dirty = True
        return True

    # accounting -----------------------------------------------------------------------------

    def _availability(self) -> None:
        available = self.route is None or self.ready_url() is not None
        if available and self._unserved_mono is not None:
            self._add(unserved_s=time.monotonic() - self._unserved_mono)
            self._unserved_mono = None
            self.unserved_since = None
        elif not available and self._unserved_mono is None:
            self._unserved_mono = time.monotonic()
            self.unserved_since = utcnow()
        self._dirty = True

    def mark(self, url: str, reachable: bool) -> None:
        if reachable == (url not in self.unreachable):
            return
        if reachable:
            self.unreachable.discard(url)
        else:
            self.unreachable.add(url)
        self._availability()
        self.dispatch()

    def _add(self, **counts: float) -> None:
        for counters in (self.total, self.scoped):
            for name, value in counts.items():
                setattr(counters, name, getattr(counters, name) + value)
        self._dirty = True

    def note_hold(self, seconds: float) -> None:
        self._add(held=1)
        for counters in (self.total, self.scoped):
            counters.longest_hold_s = round(max(counters.longest_hold_s, seconds), 3)

    def snapshot(self) -> FrontStatus:
        gap = time.monotonic() - self._unserved_mono if self._unserved_mono else 0.0
        total = self.total.model_copy(update={"unserved_s": round(self.total.unserved_s + gap, 1)})
        scoped = self.scoped.model_copy(
            update={"unserved_s": round(self.scoped.unserved_s + gap, 1)}
        )
        route = self.route
        held = len(self.waiters) if self.ready_url() is None else 0
        return FrontStatus(
            pid=os.getpid(),
            generation=route.generation if route else 0,
            mode=route.mode if route else "hold",
            backend_url=route.backend_url if route else None,
            in_flight=sum(self.active.values()),
            in_flight_by_backend={k: v for k, v in self.active.items() if v},
            held_now=held,
            queued_now=len(self.waiters) - held,
            total=total,
            scope=route.scope if route else None,
            scoped=scoped,
            backend=self.health,
            unserved_since=self.unserved_since,
            listening=self.listening,
            tasks=self.tasks,
            healing=self.healing,
            updated_at=utcnow(),
        )

    def write_status(self) -> None:
        """Write the status file if its content changed since the last write (the time it
        was written is not content): a reader that watches the file sees changes only."""
        if not self._dirty:
            return
        self._dirty = False
        snap = self.snapshot()
        content = snap.model_dump_json(exclude={"updated_at"})
        if content == self._written:
            return
        _write_volatile(status_path(self.home), snap)
        self._written = content

    # admission ----------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Give free slots on the ready backend to waiting requests, first come first served."""
        url = self.ready_url()
        if url is None:
            for waiter in self.waiters:
                waiter.held = True
            return
        while self.waiters and self.active.get(url, 0) < self.cfg.max_per_backend:
            waiter = self.waiters.popleft()
            if waiter.future.done():
                continue
            self.active[url] = self.active.get(url, 0) + 1
            waiter.future.set_result(url)
            self._dirty = True

    def release(self, url: str) -> None:
        self.active[url] = self.active.get(url, 1) - 1
        if self.active[url] <= 0:
            del self.active[url]
        self._dirty = True
        self.dispatch()

    async def acquire(self, deadline: float, gone: asyncio.Event) -> str:
        """A slot on the serving backend: at once if one is free and nobody waits, else in turn
        (queue full: ``QueueFull``; past ``deadline``: ``HoldExpired``; client left:
        ``ClientGone``)."""
        url = self.ready_url()
        if url and not self.waiters and self.active.get(url, 0) < self.cfg.max_per_backend:
            self.active[url] = self.active.get(url, 0) + 1
            self._dirty = True
            return url
        if len(self.waiters) >= self.cfg.max_queue:
            raise QueueFull
        waiter = Waiter(asyncio.get_running_loop().create_future(), held=url is None)
        self.waiters.append(waiter)
        if url is not None:
            self._add(queued=1)
        self._dirty = True
        gone_wait = asyncio.ensure_future(gone.wait())
        either: set[asyncio.Future[Any]] = {waiter.future, gone_wait}
        granted = False
        try:
            await asyncio.wait(
                either,
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if waiter.future.done() and not waiter.future.cancelled() and not gone.is_set():
                granted = True
                return waiter.future.result()
            if gone.is_set():
                raise ClientGone
            raise HoldExpired
        finally:
            gone_wait.cancel()
            if not waiter.future.done():
                waiter.future.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            elif not granted and not waiter.future.cancelled():
                self.release(waiter.future.result())
            if waiter.held:
                self.note_hold(time.monotonic() - waiter.since)
            self._dirty = True

    def connect_gate(self, url: str) -> asyncio.Semaphore:
        gate = self.connect_gates.get(url)
        if gate is None:
            if len(self.connect_gates) > 64:  # old backends' gates, none in use
                self.connect_gates = {
                    k: g for k, g in self.connect_gates.items() if k in self.active
                }
            gate = self.connect_gates[url] = asyncio.Semaphore(CONNECTS_PER_BACKEND)
        return gate

    # health and healing -------------------------------------------------------------------

    async def probe(self) -> None:
        """``GET /health`` on the backend (``/v1/models`` where a server has no ``/health``):
        cheap, sends no completion and queues nothing behind the server's generation. The
        health kept changes only when the answer does. A slow answer (a busy server) changes
        nothing; a refused connection or an error answer makes the backend unready (requests
        wait) and, if it lasts, sick (``check_death``)."""
        url = self.route.backend_url if self.route else None
        if not url:
            return
        gate = self.connect_gate(url)
        try:
            status, _ = await get_once(url, "/health", gate, 2.0)
            path = "/health"
            if status == 404:
                path = "/v1/models"
                status, body = await get_once(url, path, gate, 5.0)
                if status == 200:
                    self.models_body = body
            healthy = status == 200
            detail = f"GET {path}: HTTP {status}"
        except Slow:
            return
        except (Unreachable, UpstreamBroken) as exc:
            healthy, detail = False, f"GET /health: {str(exc)[:120]}"
        if url != (self.route.backend_url if self.route else None):
            return  # the route moved while this probe ran
        if healthy:
            self.sick_since = None
        elif self.sick_since is None:
            self.sick_since = time.monotonic()
        if (self.health.url, self.health.healthy, self.health.detail) != (url, healthy, detail):
            self.health = BackendHealth(
                url=url, healthy=healthy, checked_at=utcnow(), detail=detail
            )
            self._dirty = True
        self.mark(url, healthy)

    def check_death(self) -> None:
        """The route serves the recorded live backend, and its process is gone (or runs but
        has answered its health check with an error for ``SICK_AFTER_S``: mlx_lm.server's
        generation thread can die of one bad request): ask for a restart (or, past the rules'
        bounds, for an operator)."""
        route = self.route
        if route is None or route.mode != "serve" or self.healing.state != "ok":
            return
        if service_lock_held(self.home):  # a switch is under way: its owner decides
            return
        try:
            record = service_record(self.home)
        except CorruptFile:
            return
        if record is None or backend_url(record) != route.backend_url:
            return
        if not is_running(record):
            detail = f"{record.candidate_id}, pid {record.pid}, exited"
        elif self.sick_since is not None and time.monotonic() - self.sick_since >= SICK_AFTER_S:
            detail = (
                f"{record.candidate_id}, pid {record.pid}, runs but failed its health check for "
                f"{SICK_AFTER_S:.0f} s ({self.health.detail})"
            )
        else:
            return
        if self.home.needs_operator_file.exists():
            self.healing = self.healing.model_copy(
                update={
                    "state": "needs_operator",
                    "note": f"the live backend stopped serving ({detail}) while needs-operator "
                    "is set: not restarted",
                }
            )
        else:
            self.healing = rules.after_death(self.healing, utcnow(), self.cfg, detail)
            if self.healing.state == "needs_operator":
                mark_needs_operator(self.home, "front", self.healing.note)
        _log(self.healing.note)
        self._dirty = True
        self.heal_now.set()

    async def heal_step(self) -> None:
        state = self.healing
        if state.state == "needs_operator" and not self.home.needs_operator_file.exists():
            self.healing = rules.operator_cleared(state)
            self._dirty = True
            return
        if not rules.attempt_due(state, utcnow()):
            return
        if service_lock_held(self.home):  # a switch is under way: its owner decides
            outcome: rules.HealOutcome = "busy"
            message = "a switch or restart of the service is under way; waiting for it"
        else:
            self.healing = state.model_copy(update={"note": f"{state.note} (restart running)"})
            self._dirty = True
            outcome, message = await self.run_healer()
        self.healing = rules.after_attempt(self.healing, outcome, message, utcnow(), self.cfg)
        if self.healing.state == "needs_operator":
            mark_needs_operator(self.home, "front", self.healing.note)
        if outcome != "busy":
            _log(f"restart: {outcome}: {message}")
        self._dirty = True
        self.probe_now.set()

    async def run_healer(self) -> tuple[rules.HealOutcome, str]:
        """``python -m mcp_infra.procs.heal`` (argv, no shell): its own process, so a slow start
        never blocks this loop and the service lock dies with it."""
        argv = [sys.executable, "-m", "mcp_infra.procs.heal", "--home", str(self.home.root)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.healer = proc
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), HEAL_TIMEOUT_S)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return "failed", f"the restart did not finish within {HEAL_TIMEOUT_S:.0f} s"
        finally:
            self.healer = None
        lines = out.decode("utf-8", "replace").strip().splitlines()
        try:
            answer = json.loads(lines[-1])
            return answer["outcome"], str(answer["message"])[:400]
        except (IndexError, ValueError, KeyError, TypeError):
            return "failed", f"the restart process exited {proc.returncode} without an answer"

    # supervised background tasks ----------------------------------------------------------

    async def supervised(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` for ever: a failure is logged, counted in the status and the task is
        restarted after a growing pause (at most 5 s)."""
        health = self.tasks[name] = TaskHealth()
        self._dirty = True
        pause = 0.05
        while True:
            started = time.monotonic()
            try:
                await body()
                raise RuntimeError("the task returned")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() - started > 30:
                    pause = 0.05
                health = self.tasks[name] = TaskHealth(
                    state="restarting",
                    failures=health.failures + 1,
                    last_error=f"{type(exc).__name__}: {exc}"[:300],
                    last_error_at=utcnow(),
                )
                self._dirty = True
                _log(f"task {name} failed ({health.last_error}); restarting in {pause:.2f} s")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                health = self.tasks[name] = health.model_copy(update={"state": "running"})
                self._dirty = True

    async def route_task(self) -> None:
        while True:
            self.poll_route()
            await asyncio.sleep(ROUTE_POLL_S)

    async def status_task(self) -> None:
        while True:
            self.write_status()
            await asyncio.sleep(STATUS_EVERY_S)

    async def probe_task(self) -> None:
        while True:
            self.probe_now.clear()
            await self.probe()
            self.check_death()
            down = self.serving_url() is not None and self.ready_url() is None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.probe_now.wait(), PROBE_DOWN_S if down else PROBE_EVERY_S
                )

    async def heal_task(self) -> None:
        while True:
            self.heal_now.clear()
            await self.heal_step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.heal_now.wait(), 0.5)

    # connections --------------------------------------------------------------------------

    async def on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(self, reader, writer)
        if len(self.conns) >= self.cfg.max_connections:
            victim = next((c for c in self.conns if c.evictable), None)
            self._add(dropped_connections=1)
            if victim is None:  # every connection has a request in progress
                with contextlib.suppress(Exception):
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    writer.close()
                return
            del self.conns[victim]
            victim.abort()
        self.conns[conn] = None
        try:
            await self.serve_connection(conn)
        except asyncio.CancelledError:  # the front is shutting down
            pass
        except Exception as exc:  # a broken client connection never reaches the loop
            if not isinstance(exc, OSError | TimeoutError | h11.ProtocolError):
                _log(f"connection: {type(exc).__name__}: {exc}")
        finally:
            self.conns.pop(conn, None)
            await conn.unwatch()
            with contextlib.suppress(Exception):
                writer.close()

    async def serve_connection(self, conn: Conn) -> None:
        first = True
        while True:
            conn.evictable = True
            try:
                event = await conn.next_event(
                    self.cfg.header_timeout_s if first else self.cfg.idle_timeout_s
                )
            except TimeoutError:
                self._add(dropped_connections=1)
                return
            except h11.RemoteProtocolError as exc:
                self._add(refused=1)
                with contextlib.suppress(Exception):
                    hint = exc.error_status_hint  # 431 (headers too large) or a client error
                    await conn.answer(
                        hint if hint == 431 else 400,
                        {"error": {"message": str(exc)[:200]}},
                        close=True,
                    )
                return
            if not isinstance(event, h11.Request):
                return
            conn.evictable = False
            first = False
            keep = await self.handle(conn, event)
            await conn.unwatch()
            if not keep or conn.h.our_state is not h11.DONE or conn.h.their_state is not h11.DONE:
                return
            conn.h.start_next_cycle()

    async def handle(self, conn: Conn, request: h11.Request) -> bool:
        """Answer one request; False: close the connection after it."""
        method = request.method.decode("ascii", "replace")
        target = rules.classify(method, bytes(request.target))
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]
        first = {k.lower(): v for k, v in reversed(headers)}
        origin = first.get("origin")
        allowed = rules.authorized(first.get("authorization"), self.token)
        if target.kind == "health":
            await conn.answer(200, self.health_body(full=allowed))
            return True
        if not allowed:
            self._add(refused=1)
            await conn.answer(
                401,
                {"error": {"message": "a valid bearer token is required", "type": "auth"}},
                [("www-authenticate", "Bearer")],
            )
            return True
        if target.kind == "refuse":
            self._add(refused=1)
            extra = [("allow", rules.ALLOWED_METHODS)] if target.status == 405 else []
            await conn.answer(
                target.status,
                {"error": {"message": target.reason, "type": "invalid_request"}},
                extra,
            )
            return True
        if target.kind == "preflight":
            cors = rules.preflight_headers(origin, self.cfg.allow_origins)
            await conn.answer(204 if cors else 403, None, cors)
            return True
        if target.kind == "models":
            body = await self.models_body_now()
            await conn.answer(200, body, rules.cors_headers(origin, self.cfg.allow_origins))
            return True
        return await self.forward(conn, method, target.path, headers, first, origin)

    def health_body(self, *, full: bool) -> dict[str, Any]:
        ok = self.ready_url() is not None and self.health.healthy is True
        if not full:
            return {"status": "ok" if ok else "degraded"}
        data = self.snapshot().model_dump(mode="json")
        checked = self.health.checked_at
        data["status"] = "ok" if ok else "degraded"
        data["connections"] = len(self.conns)
        data["backend_age_s"] = round((utcnow() - checked).total_seconds(), 1) if checked else None
        return data

    async def models_body_now(self) -> bytes:
        url = self.ready_url()
        if url:
            with contextlib.suppress(Unreachable, UpstreamBroken):
                status, body = await get_once(url, "/v1/models", self.connect_gate(url), 5.0)
                if status == 200 and body:
                    self.models_body = body
                    return body
        if self.models_body is not None:
            return self.models_body
        cid = self.route.candidate_id if self.route else None
        data = [] if not cid else [{"id": cid, "object": "model", "owned_by": "mcp-infra"}]
        return json.dumps({"object": "list", "data": data}).encode()

    async def forward(
        self,
        conn: Conn,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        first: dict[str, str],
        origin: str | None,
    ) -> bool:
        self._add(live_requests=1)
        length = int(first.get("content-length", "0") or 0)
        chunked = "chunked" in first.get("transfer-encoding", "").lower()
        body: bytes | None = b""
        if method == "GET" and (length or chunked):
            return await self._refuse(conn, 400, "a GET request has no body")
        if length > self.cfg.max_body_bytes:
            return await self._refuse(
                conn, 413, f"the request body is larger than {self.cfg.max_body_bytes} bytes"
            )
        if method == "POST" and (chunked or length <= BUFFER_BODY_BYTES):
            try:
                body = await conn.read_body(BUFFER_BODY_BYTES if chunked else length)
            except BodyFailed as exc:
                return await self._refuse(conn, exc.status, str(exc))
            problem = rules.body_problem(body)
            if problem:
                return await self._refuse(conn, 400, problem)
            length = len(body)
        elif method == "POST":
            body = None  # streamed once a backend slot is taken
        if body is not None:
            conn.watch()
        upstream_headers = rules.request_headers(headers)
        start = time.monotonic()
        deadline = start + self.max_hold_s()
        attempts = 0
        while True:
            try:
                url = await self.acquire(deadline, conn.gone)
            except QueueFull:
                self._add(rejected_503=1, rejected_queue_full=1)
                return await self._unavailable(conn, "the service is at capacity; retry shortly", 2)
            except HoldExpired:
                self._add(rejected_503=1)
                return await self._unavailable(
                    conn,
                    "the service is switching backends and could not serve within "
                    f"{self.max_hold_s():.0f} s; retry shortly",
                    retry_after_s(self.max_hold_s()),
                )
            except ClientGone:
                self._add(client_gone=1)
                return False
            content = body if body is not None else conn.stream_body()
            try:
                up = await Upstream.open(url, self.connect_gate(url), CONNECT_TIMEOUT_S)
            except Unreachable as exc:
                self.release(url)
                self.mark(url, False)
                self.probe_now.set()
                attempts += 1
                if conn.gone.is_set():
                    self._add(client_gone=1)
                    return False
                if attempts >= self.cfg.max_connect_attempts or hold_expired(
                    time.monotonic() - start, self.max_hold_s()
                ):
                    self._add(rejected_503=1, upstream_errors=1)
                    return await self._unavailable(
                        conn, f"the backend could not be reached ({exc}); retry shortly", 2
                    )
                self._add(connect_retries=1)
                continue
            try:
                outbound = Outbound(method, url, path, upstream_headers, content, length)
                return await self.relay(conn, up, outbound, origin)
            finally:
                up.close()
                self.release(url)

    async def relay(self, conn: Conn, up: Upstream, request: Outbound, origin: str | None) -> bool:
        """Send the request and relay the answer as it comes. Nothing here is retried: the
        request may have reached the backend."""
        conn.on_gone = up.close
        try:
            await up.send(request)
            response = await up.response()
        except BodyFailed as exc:
            return await self._refuse(conn, exc.status, str(exc))
        except UpstreamBroken as exc:
            if conn.gone.is_set():
                self._add(client_gone=1)
                return False
            self._add(upstream_errors=1)
            self.probe_now.set()
            return await self._fail(conn, 502, f"the backend failed before it answered: {exc}")
        self.mark(request.url, True)
        if conn.gone.is_set():
            self._add(client_gone=1)
            return False
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
        declared = next((v for k, v in raw if k.lower() == "content-length"), None)
        sse = any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in raw)
        out = rules.answer_headers(raw, origin, self.cfg.allow_origins)
        if declared is not None:
            out.append(("content-length", declared))
        tail = b""
        complete = True
        try:
            await conn.send(h11.Response(status_code=response.status_code, headers=out))
            try:
                async for chunk in up.body():
                    await conn.send(h11.Data(data=chunk))
                    if sse:
                        tail = (tail + chunk)[-256:]
            except UpstreamBroken:
                complete = False
            complete = complete and (not sse or rules.stream_finished(tail))
            if complete:
                self._add(served=1)
                with contextlib.suppress(OSError, TimeoutError):
                    await conn.send(h11.EndOfMessage())  # the client may have all it needs
                return not conn.gone.is_set()
            if conn.gone.is_set():
                self._add(client_gone=1)
                return False
            self._add(upstream_errors=1, failed_streams=1)
            self.probe_now.set()
            if sse:
                await conn.send(
                    h11.Data(
                        data=rules.error_event("the backend stopped before the answer was complete")
                    )
                )
                await conn.send(h11.EndOfMessage())
            return False  # not an event stream: the unfinished body tells the client itself
        except (OSError, TimeoutError, h11.LocalProtocolError):
            self._add(client_gone=1)
            return False
        finally:
            conn.on_gone = None

    async def _refuse(self, conn: Conn, status: int, reason: str) -> bool:
        self._add(refused=1)
        await conn.answer(status, {"error": {"message": reason, "type": "invalid_request"}})
        return conn.h.their_state is h11.DONE

    async def _unavailable(self, conn: Conn, message: str, retry: int) -> bool:
        await conn.answer(
            503,
            {"error": {"message": message, "type": "service_unavailable"}},
            [("retry-after", str(retry))],
        )
        return conn.h.their_state is h11.DONE

    async def _fail(self, conn: Conn, status: int, message: str) -> bool:
        await conn.answer(status, {"error": {"message": message[:300], "type": "upstream_error"}})
        return False

    # the process ----------------------------------------------------------------------------

    async def run(self, *, signals: bool = True) -> int:
        """Listen, run the supervised tasks until SIGTERM/SIGINT (or ``stopping``), then stop:
        no new connections, requests in flight get ``SHUTDOWN_S`` to finish, a restart
        process is stopped. ``signals`` False: the caller sets ``stopping`` (a front run inside
        another program's thread)."""
        servers = []
        try:
            servers.append(
                await asyncio.start_server(self.on_connect, LOOPBACK, self.port, backlog=1024)
            )
        except OSError as exc:
            _log(f"cannot listen on {LOOPBACK}:{self.port}: {exc}")
            return 3
        self.listening = [f"{LOOPBACK}:{self.port}"]
        if self.cfg.ipv6:
            try:
                servers.append(
                    await asyncio.start_server(self.on_connect, LOOPBACK6, self.port, backlog=1024)
                )
                self.listening.append(f"[{LOOPBACK6}]:{self.port}")
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    _log(f"[{LOOPBACK6}]:{self.port} is held by another process; refusing to serve")
                    for server in servers:
                        server.close()
                    return 3
                _log(f"no IPv6 loopback here ({exc}); serving on {LOOPBACK} only")
        if signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
        self.poll_route()
        with contextlib.suppress(OSError):  # a full disk: the status task keeps trying
            self.write_status()
        for name, body in (
            ("route", self.route_task),
            ("status", self.status_task),
            ("probe", self.probe_task),
            ("heal", self.heal_task),
        ):
            asyncio.ensure_future(self.supervised(name, body))
        await self.stopping.wait()
        for server in servers:
            server.close()
        if self.healer is not None:
            _kill_group(self.healer.pid)
        deadline = time.monotonic() + SHUTDOWN_S
        while self.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.abort()
        with contextlib.suppress(Exception):
            self._dirty = True
            self.write_status()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        return 0


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)


def _write_volatile(path: Path, status: FrontStatus) -> None:
    """Atomic (rename) but not fsynced: telemetry; a crash may lose the last one, never leave
    half of one. Keeps the event loop free of disk flushes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(status.model_dump_json())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _raise_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_infra.procs.front")
    parser.add_argument("--home", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    home = Home(args.home)
    try:
        cfg = load_config(home).front
    except (FileNotFoundError, CorruptFile) as exc:
        _log(f"config not readable ({exc}); the front runs with default limits")
        cfg = FrontConfig()
    try:
        token = front_token(home, cfg)
    except (OSError, ValueError) as exc:
        _log(f"the configured token cannot be read ({exc}); refusing to serve without it")
        return 2
    # a connection is one descriptor, a request in flight one more: room for both, and spare
    _raise_fd_limit(2 * cfg.max_connections + 256)
    # past a file-size limit a write fails (EFBIG) instead of killing the front
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        import uvloop

        runner: Callable[[Awaitable[int]], int] = uvloop.run  # type: ignore[assignment]
    except ImportError:
        runner = asyncio.run  # type: ignore[assignment]
    return runner(Front(home, cfg, token, args.port).run())


# ---------------------------------------------------------------------------------------------
# The supervisor's side
# ---------------------------------------------------------------------------------------------


class FrontError(ServerUnavailable):
    """The front did not start, or did not confirm a route in time."""


class RouteNotAdopted(FrontError):
    """The front did not confirm a new route (adopted, and its backend seen healthy) in time.
    ``seen`` is what the front last said it does, if it said anything."""

    def __init__(self, message: str, route: FrontRoute, seen: FrontStatus | None) -> None:
        super().__init__(message)
        self.route = route
        self.seen = seen


def front_record(home: Home) -> ProcessRecord | None:
    return read_optional(record_path(home), ProcessRecord)


def read_route(home: Home) -> FrontRoute | None:
    return read_optional(route_path(home), FrontRoute)


def front_running(home: Home) -> bool:
    record = front_record(home)
    return record is not None and is_running(record)


def front_status(home: Home) -> FrontStatus | None:
    """The front's last written status, if the recorded front is running."""
    if not front_running(home):
        return None
    try:
        return read_optional(status_path(home), FrontStatus)
    except CorruptFile:
        return None


def ask_front(home: Home, timeout: float = 2.0) -> FrontStatus | None:
    """What the running front says now (``GET /health``, with the token if one is configured):
    its state in memory, not a file a full disk may keep from being written."""
    record = front_record(home)
    if record is None or not is_running(record):
        return None
    headers = {}
    with contextlib.suppress(FileNotFoundError, CorruptFile, OSError, ValueError):
        token = front_token(home, load_config(home).front)
        if token:
            headers["authorization"] = f"Bearer {token}"
    try:
        response = httpx.get(
            f"http://{LOOPBACK}:{record.port}/health",
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )
        data = response.json()
        fields = {k: v for k, v in data.items() if k in FrontStatus.model_fields}
        return FrontStatus.model_validate(fields)
    except (httpx.HTTPError, ValueError):
        return None


def current_status(home: Home) -> FrontStatus | None:
    """The front's status of this instant when it answers, else its last written one."""
    return ask_front(home) or front_status(home)


def live_request_count(home: Home) -> int | None:
    """Monotonic count of live requests the front has received (served or in flight); None if
    no front runs. Read before and after a measurement round: the difference is the live
    traffic that overlapped it."""
    status = current_status(home)
    return status.total.live_requests if status else None


def ensure_front(home: Home, config: ServiceConfig, *, timeout: float = 20.0) -> str:
    """Start the front on the stable port unless our recorded front already holds it."""
    record = front_record(home)
    if record is not None and is_running(record) and port_owner_is(record, config.port):
        return "running"
    if record is not None and is_running(record):  # ours, but not listening: replace it
        stop_server(record, grace=3.0)
    record_path(home).unlink(missing_ok=True)
    for host in (LOOPBACK, LOOPBACK6) if config.front.ipv6 else (LOOPBACK,):
        if port_open(config.port, host):
            raise PortBusy(
                f"port {config.port} on {host} is held by a process mcp-infra did not start; "
                "refusing to touch it"
            )
    log = home.logs / "front.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "mcp_infra.procs.front",
        "--home",
        str(home.root),
        "--port",
        str(config.port),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,  # argv, no shell
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    new = ProcessRecord(
        role="front",
        pid=proc.pid,
        pgid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        argv=argv,
        host=LOOPBACK,
        port=config.port,
        log_path=str(log),
        candidate_id="front",
        started_at=utcnow(),
    )
    write_model(record_path(home), new)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(httpx.HTTPError):
            url = f"http://{LOOPBACK}:{config.port}/health"
            if httpx.get(url, timeout=1.0, trust_env=False).is_success:
                return "started"
        time.sleep(0.1)
    stop_server(new, grace=2.0)
    record_path(home).unlink(missing_ok=True)
    raise FrontError(f"the front did not come up on port {config.port} within {timeout:.0f} s")


def stop_front(home: Home, grace: float = 10.0) -> str:
    record = front_record(home)
    if record is None:
        return "no front recorded"
    outcome = stop_server(record, grace=grace)
    record_path(home).unlink(missing_ok=True)
    return outcome


def set_route(
    home: Home,
    *,
    mode: Literal["serve", "hold"],
    backend_url: str | None = None,
    candidate_id: str | None = None,
    max_hold_s: float | None = None,
    scope: Any = ...,
    reason: str = "",
    wait_s: float = 10.0,
) -> FrontRoute:
    """Write the next route atomically and wait (bounded) until the running front confirms it:
    it adopted this generation and, for a serving route, has seen the backend healthy. Raises
    ``RouteNotAdopted`` otherwise (the file holds the new route; the caller puts it right)."""
    route = route_to(
        read_route(home),
        mode=mode,
        now=utcnow(),
        backend_url=backend_url,
        candidate_id=candidate_id,
        max_hold_s=max_hold_s,
        scope=scope,
        reason=reason,
    )
    write_model(route_path(home), route)
    url = route.backend_url if mode == "serve" else None
    if not wait_adopted(home, route.generation, wait_s, backend_url=url):
        seen = current_status(home)
        said = (
            f"it serves generation {seen.generation} ({seen.mode}, {seen.backend_url}, backend "
            f"healthy: {seen.backend.healthy})"
            if seen
            else "it did not answer"
            if front_running(home)
            else "no front runs"
        )
        raise RouteNotAdopted(
            f"the front did not confirm route {route.generation} ({mode}"
            f"{' ' + url if url else ''}) within {wait_s:.0f} s: {said}",
            route,
            seen,
        )
    return route


def adopted(status: FrontStatus, generation: int, backend_url: str | None = None) -> bool:
    """Does ``status`` confirm ``generation`` (and, for a serving route, a healthy backend)?"""
    if status.generation < generation:
        return False
    if backend_url is None:
        return True
    return (
        status.mode == "serve"
        and status.backend_url == backend_url
        and status.backend.url == backend_url
        and status.backend.healthy is True
    )


def wait_adopted(
    home: Home, generation: int, timeout: float, *, backend_url: str | None = None
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not front_running(home):
            return False
        status = current_status(home)
        if status is not None and adopted(status, generation, backend_url):
            return True
        time.sleep(0.05)
    return False


def drain(home: Home, backend_url: str, timeout: float) -> int:
    """Wait until the front has no request in flight on ``backend_url``; return how many were
    still in flight when the bound ran out (0: drained)."""
    deadline = time.monotonic() + timeout
    left = 0
    while True:
        status = current_status(home)
        left = status.in_flight_by_backend.get(backend_url, 0) if status else 0
        if left == 0 or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def fresh_status(home: Home, timeout: float = 1.0) -> FrontStatus | None:
    """The front's status of this instant (its counters include everything until now): asked
    of the front itself, else the last written one."""
    return ask_front(home, timeout=max(0.5, timeout)) or front_status(home)


def status_age_s(status: FrontStatus | None, now: datetime | None = None) -> float | None:
    """Seconds since the front's status last changed."""
    if status is None:
        return None
    return round(((now or utcnow()) - status.updated_at).total_seconds(), 1)


if __name__ == "__main__":
    raise SystemExit(main())
