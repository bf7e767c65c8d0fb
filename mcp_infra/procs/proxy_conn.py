"""The proxy's client side: one connection's h11 state machine and what is done with a request.

``on_connect`` takes a connection (evicting the oldest idle one at ``max_connections``),
``serve_connection`` reads requests within the header and idle bounds, ``handle`` answers what
the front answers itself (``/health``, ``/v1/models``, refusals, preflights) and ``forward``
sends the rest on: a slot on the serving backend first (``Front.acquire``: queued, held, or 503
with ``Retry-After``), then one connection attempt at a time, retried only while no byte reached
a backend, then ``relay`` of the answer as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import h11

from mcp_infra.contracts import FrontConfig, FrontRoute
from mcp_infra.core import frontrules as rules
from mcp_infra.core.admission import hold_expired, retry_after_s
from mcp_infra.procs.proxy_upstream import (
    READ_CHUNK,
    Outbound,
    Unreachable,
    Upstream,
    UpstreamBroken,
    get_once,
)
from mcp_infra.state.store import utcnow

BUFFER_BODY_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 10.0


def log(message: str) -> None:
    """A line in the front's log; never raises (a full disk must not kill a task's handler)."""
    with contextlib.suppress(Exception):
        print(f"{utcnow():%Y-%m-%d %H:%M:%S} front: {message}", file=sys.stderr, flush=True)


class Front(Protocol):
    """What connection handling uses of the proxy (``proxy.Front``): its limits, its route, its
    admission queue and its counters."""

    cfg: FrontConfig
    token: str | None
    route: FrontRoute | None
    conns: dict[Conn, None]
    probe_now: asyncio.Event
    models_body: bytes | None

    def count(self, **counts: float) -> None: ...
    def ready_url(self) -> str | None: ...
    def max_hold_s(self) -> float: ...
    async def acquire(self, deadline: float, gone: asyncio.Event) -> str: ...
    def release(self, url: str) -> None: ...
    def mark(self, url: str, reachable: bool) -> None: ...
    def connect_gate(self, url: str) -> asyncio.Semaphore: ...
    def health_body(self, *, full: bool) -> dict[str, Any]: ...


class BodyFailed(Exception):
    """The client's request body could not be read (too slow, too large, or the client left)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class QueueFull(Exception):
    """Past ``max_queue`` waiting requests: answered 503 at once."""


class HoldExpired(Exception):
    """No slot on a serving backend within the route's ``max_hold_s``."""


class ClientGone(Exception):
    """The client closed its connection while its request waited."""


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


async def on_connect(
    front: Front, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    conn = Conn(front, reader, writer)
    if len(front.conns) >= front.cfg.max_connections:
        victim = next((c for c in front.conns if c.evictable), None)
        front.count(dropped_connections=1)
        if victim is None:  # every connection has a request in progress
            with contextlib.suppress(Exception):
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                writer.close()
            return
        del front.conns[victim]
        victim.abort()
    front.conns[conn] = None
    try:
        await serve_connection(front, conn)
    except asyncio.CancelledError:  # the front is shutting down
        pass
    except Exception as exc:  # a broken client connection never reaches the loop
        if not isinstance(exc, OSError | TimeoutError | h11.ProtocolError):
            log(f"connection: {type(exc).__name__}: {exc}")
    finally:
        front.conns.pop(conn, None)
        await conn.unwatch()
        with contextlib.suppress(Exception):
            writer.close()


async def serve_connection(front: Front, conn: Conn) -> None:
    first = True
    while True:
        conn.evictable = True
        try:
            event = await conn.next_event(
                front.cfg.header_timeout_s if first else front.cfg.idle_timeout_s
            )
        except TimeoutError:
            front.count(dropped_connections=1)
            return
        except h11.RemoteProtocolError as exc:
            front.count(refused=1)
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
        keep = await handle(front, conn, event)
        await conn.unwatch()
        if not keep or conn.h.our_state is not h11.DONE or conn.h.their_state is not h11.DONE:
            return
        conn.h.start_next_cycle()


async def handle(front: Front, conn: Conn, request: h11.Request) -> bool:
    """Answer one request; False: close the connection after it."""
    method = request.method.decode("ascii", "replace")
    target = rules.classify(method, bytes(request.target))
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]
    first = {k.lower(): v for k, v in reversed(headers)}
    origin = first.get("origin")
    allowed = rules.authorized(first.get("authorization"), front.token)
    if target.kind == "health":
        await conn.answer(200, front.health_body(full=allowed))
        return True
    if not allowed:
        front.count(refused=1)
        await conn.answer(
            401,
            {"error": {"message": "a valid bearer token is required", "type": "auth"}},
            [("www-authenticate", "Bearer")],
        )
        return True
    if target.kind == "refuse":
        front.count(refused=1)
        extra = [("allow", rules.ALLOWED_METHODS)] if target.status == 405 else []
        await conn.answer(
            target.status,
            {"error": {"message": target.reason, "type": "invalid_request"}},
            extra,
        )
        return True
    if target.kind == "preflight":
        cors = rules.preflight_headers(origin, front.cfg.allow_origins)
        await conn.answer(204 if cors else 403, None, cors)
        return True
    if target.kind == "models":
        body = await models_body_now(front)
        await conn.answer(200, body, rules.cors_headers(origin, front.cfg.allow_origins))
        return True
    return await forward(front, conn, method, target.path, headers, first, origin)


async def models_body_now(front: Front) -> bytes:
    url = front.ready_url()
    if url:
        with contextlib.suppress(Unreachable, UpstreamBroken):
            status, body = await get_once(url, "/v1/models", front.connect_gate(url), 5.0)
            if status == 200 and body:
                front.models_body = body
                return body
    if front.models_body is not None:
        return front.models_body
    cid = front.route.candidate_id if front.route else None
    data = [] if not cid else [{"id": cid, "object": "model", "owned_by": "mcp-infra"}]
    return json.dumps({"object": "list", "data": data}).encode()


async def forward(
    front: Front,
    conn: Conn,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    first: dict[str, str],
    origin: str | None,
) -> bool:
    front.count(live_requests=1)
    length = int(first.get("content-length", "0") or 0)
    chunked = "chunked" in first.get("transfer-encoding", "").lower()
    body: bytes | None = b""
    if method == "GET" and (length or chunked):
        return await _refuse(front, conn, 400, "a GET request has no body")
    if length > front.cfg.max_body_bytes:
        return await _refuse(
            front, conn, 413, f"the request body is larger than {front.cfg.max_body_bytes} bytes"
        )
    if method == "POST" and (chunked or length <= BUFFER_BODY_BYTES):
        try:
            body = await conn.read_body(BUFFER_BODY_BYTES if chunked else length)
        except BodyFailed as exc:
            return await _refuse(front, conn, exc.status, str(exc))
        problem = rules.body_problem(body)
        if problem:
            return await _refuse(front, conn, 400, problem)
        length = len(body)
    elif method == "POST":
        body = None  # streamed once a backend slot is taken
    if body is not None:
        conn.watch()
    upstream_headers = rules.request_headers(headers)
    start = time.monotonic()
    deadline = start + front.max_hold_s()
    attempts = 0
    while True:
        try:
            url = await front.acquire(deadline, conn.gone)
        except QueueFull:
            front.count(rejected_503=1, rejected_queue_full=1)
            return await _unavailable(conn, "the service is at capacity; retry shortly", 2)
        except HoldExpired:
            front.count(rejected_503=1)
            return await _unavailable(
                conn,
                "the service is switching backends and could not serve within "
                f"{front.max_hold_s():.0f} s; retry shortly",
                retry_after_s(front.max_hold_s()),
            )
        except ClientGone:
            front.count(client_gone=1)
            return False
        content = body if body is not None else conn.stream_body()
        try:
            up = await Upstream.open(url, front.connect_gate(url), CONNECT_TIMEOUT_S)
        except Unreachable as exc:
            front.release(url)
            front.mark(url, False)
            front.probe_now.set()
            attempts += 1
            if conn.gone.is_set():
                front.count(client_gone=1)
                return False
            if attempts >= front.cfg.max_connect_attempts or hold_expired(
                time.monotonic() - start, front.max_hold_s()
            ):
                front.count(rejected_503=1, upstream_errors=1)
                return await _unavailable(
                    conn, f"the backend could not be reached ({exc}); retry shortly", 2
                )
            front.count(connect_retries=1)
            continue
        try:
            outbound = Outbound(method, url, path, upstream_headers, content, length)
            return await relay(front, conn, up, outbound, origin)
        finally:
            up.close()
            front.release(url)


async def relay(
    front: Front, conn: Conn, up: Upstream, request: Outbound, origin: str | None
) -> bool:
    """Send the request and relay the answer as it comes. Nothing here is retried: the
    request may have reached the backend."""
    conn.on_gone = up.close
    try:
        await up.send(request)
        response = await up.response()
    except BodyFailed as exc:
        return await _refuse(front, conn, exc.status, str(exc))
    except UpstreamBroken as exc:
        if conn.gone.is_set():
            front.count(client_gone=1)
            return False
        front.count(upstream_errors=1)
        front.probe_now.set()
        return await _fail(conn, 502, f"the backend failed before it answered: {exc}")
    front.mark(request.url, True)
    if conn.gone.is_set():
        front.count(client_gone=1)
        return False
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
    declared = next((v for k, v in raw if k.lower() == "content-length"), None)
    sse = any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in raw)
    out = rules.answer_headers(raw, origin, front.cfg.allow_origins)
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
            front.count(served=1)
            with contextlib.suppress(OSError, TimeoutError):
                await conn.send(h11.EndOfMessage())  # the client may have all it needs
            return not conn.gone.is_set()
        if conn.gone.is_set():
            front.count(client_gone=1)
            return False
        front.count(upstream_errors=1, failed_streams=1)
        front.probe_now.set()
        if sse:
            await conn.send(
                h11.Data(
                    data=rules.error_event("the backend stopped before the answer was complete")
                )
            )
            await conn.send(h11.EndOfMessage())
        return False  # not an event stream: the unfinished body tells the client itself
    except (OSError, TimeoutError, h11.LocalProtocolError):
        front.count(client_gone=1)
        return False
    finally:
        conn.on_gone = None


async def _refuse(front: Front, conn: Conn, status: int, reason: str) -> bool:
    front.count(refused=1)
    await conn.answer(status, {"error": {"message": reason, "type": "invalid_request"}})
    return conn.h.their_state is h11.DONE


async def _unavailable(conn: Conn, message: str, retry: int) -> bool:
    await conn.answer(
        503,
        {"error": {"message": message, "type": "service_unavailable"}},
        [("retry-after", str(retry))],
    )
    return conn.h.their_state is h11.DONE


async def _fail(conn: Conn, status: int, message: str) -> bool:
    await conn.answer(status, {"error": {"message": message[:300], "type": "upstream_error"}})
    return False


# the process ----------------------------------------------------------------------------
