"""The front: mcp-infra's reverse proxy on the stable port, and the supervisor's handle on it.

Clients talk to the front; backends (the live recipe, candidates) run on ports of their own. The
front forwards the OpenAI-compatible API (streaming included, bytes relayed as they come) to the
backend its route names, so a promotion is a route switch between two running backends, not a
restart of the port clients use.

Control is by one file, ``state/route.json`` (a ``FrontRoute``, written atomically by the
supervisor side), not by a socket: the route must survive a restart of the front anyway, so the
file is the one source of truth a restarted front resumes from, and there is no second endpoint
to secure (ordinary clients reach only the TCP port; the route file is in the user's own home).
The front polls the file's identity every 20 ms and echoes the generation it adopted, with its
counters and the backend's last probed health, in ``state/front_status.json``; the supervisor
waits for that echo before it drains or stops anything.

When the route holds (no backend can serve: an exclusive swap) or its backend refuses
connections, a request waits up to the route's ``max_hold_s`` and is then forwarded, or answered
503 with ``Retry-After``. A request is retried only when its connection failed before any
answer came (refused, or closed without a response: a stale or dying backend), never once an
answer started. ``/health`` and ``/v1/models`` always answer.

Run: ``python -m mcp_infra.procs.front --home DIR --port PORT`` (started by ``ensure_front``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx2 as httpx
import psutil
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_infra.contracts import (
    BackendHealth,
    FrontCounters,
    FrontRoute,
    FrontStatus,
    ProcessRecord,
    ServiceConfig,
)
from mcp_infra.core.admission import hold_expired, retry_after_s, route_to
from mcp_infra.procs.runtime import (
    LOOPBACK,
    PortBusy,
    is_running,
    port_open,
    port_owner_is,
    stop_server,
)
from mcp_infra.state.store import CorruptFile, Home, read_optional, utcnow, write_model

ROUTE_POLL_S = 0.02
STATUS_EVERY_S = 0.2
PROBE_EVERY_S = 2.0
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
DROP_FROM_RESPONSE = (HOP_BY_HOP - {"content-length"}) | {"date", "server"}


def route_path(home: Home) -> Path:
    return home.state / "route.json"


def status_path(home: Home) -> Path:
    return home.state / "front_status.json"


def record_path(home: Home) -> Path:
    return home.state / "front.json"


# ---------------------------------------------------------------------------------------------
# The front process
# ---------------------------------------------------------------------------------------------


class FrontState:
    """Everything the front knows, owned by its one event loop."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.route: FrontRoute | None = None
        self._route_sig: tuple[int, int, int] | None = None
        self._changed = asyncio.Event()
        self.in_flight: dict[str, int] = defaultdict(int)
        self.held_now = 0
        self.total = FrontCounters()
        self.scoped = FrontCounters()
        self.health = BackendHealth()
        self.models_body: bytes | None = None
        self.unreachable: set[str] = set()
        self._unserved_since: float | None = None
        self._dirty = True
        self._last_write = 0.0
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=2.0, read=None, write=None, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    # routing ------------------------------------------------------------------------------

    def serving_url(self) -> str | None:
        route = self.route
        return route.backend_url if route and route.mode == "serve" else None

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
        self.route = route
        self._availability()
        self._wake()
        self.write_status(force=True)
        return True

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # accounting -----------------------------------------------------------------------------

    def _availability(self) -> None:
        url = self.serving_url()
        available = self.route is None or (url is not None and url not in self.unreachable)
        now = time.monotonic()
        if available and self._unserved_since is not None:
            self._add(unserved_s=now - self._unserved_since)
            self._unserved_since = None
        elif not available and self._unserved_since is None:
            self._unserved_since = now
        self._dirty = True

    def mark(self, url: str, reachable: bool) -> None:
        if reachable == (url not in self.unreachable):
            return
        if reachable:
            self.unreachable.discard(url)
        else:
            self.unreachable.add(url)
        self._availability()

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
        open_gap = time.monotonic() - self._unserved_since if self._unserved_since else 0.0
        total = self.total.model_copy(
            update={"unserved_s": round(self.total.unserved_s + open_gap, 3)}
        )
        scoped = self.scoped.model_copy(
            update={"unserved_s": round(self.scoped.unserved_s + open_gap, 3)}
        )
        route = self.route
        return FrontStatus(
            pid=os.getpid(),
            generation=route.generation if route else 0,
            mode=route.mode if route else "hold",
            backend_url=route.backend_url if route else None,
            in_flight=sum(self.in_flight.values()),
            in_flight_by_backend={k: v for k, v in self.in_flight.items() if v},
            held_now=self.held_now,
            total=total,
            scope=route.scope if route else None,
            scoped=scoped,
            backend=self.health,
            updated_at=utcnow(),
        )

    def write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if (
            not force
            and not (self._dirty and now - self._last_write >= STATUS_EVERY_S)
            and (now - self._last_write < PROBE_EVERY_S)
        ):
            return
        _write_volatile(status_path(self.home), self.snapshot())
        self._dirty = False
        self._last_write = now

    # health ---------------------------------------------------------------------------------

    async def probe(self) -> None:
        """``GET /health`` on the backend (``/v1/models`` where a server has no ``/health``):
        cheap, sends no completion and queues nothing behind the server's generation."""
        url = self.route.backend_url if self.route else None
        if not url:
            return
        try:
            response = await self.client.get(f"{url}/health", timeout=2.0)
            path = "/health"
            if response.status_code == 404:
                path = "/v1/models"
                response = await self.client.get(f"{url}{path}", timeout=2.0)
                if response.status_code == 200:
                    self.models_body = response.content
            healthy = response.status_code == 200
            detail = f"GET {path}: HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            healthy, detail = False, f"GET /health: {type(exc).__name__}"
        self.health = BackendHealth(url=url, healthy=healthy, checked_at=utcnow(), detail=detail)
        self.mark(url, healthy)
        self._dirty = True


def _write_volatile(path: Path, status: FrontStatus) -> None:
    """Atomic (rename) but not fsynced: telemetry, rewritten every 0.2 s; a crash may lose the
    last one, never leave half of one. Keeps the event loop free of disk flushes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(status.model_dump_json())
    os.replace(tmp, path)


def _forward_headers(request: Request) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in HOP_BY_HOP]


def build_app(home: Home) -> Starlette:
    state: FrontState | None = None

    def st() -> FrontState:
        assert state is not None
        return state

    async def housekeeping() -> None:
        last_probe = 0.0
        while True:
            try:
                if st().poll_route():
                    last_probe = 0.0  # a new backend: probe it now
                if time.monotonic() - last_probe >= PROBE_EVERY_S:
                    last_probe = time.monotonic()
                    await st().probe()
                st().write_status()
            except Exception as exc:  # the front must outlive a bad poll
                print(f"front housekeeping: {type(exc).__name__}: {exc}", file=sys.stderr)
            await asyncio.sleep(ROUTE_POLL_S)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        nonlocal state
        state = FrontState(home)
        state.poll_route()
        state.write_status(force=True)
        task = asyncio.create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            await state.client.aclose()

    async def health(_: Request) -> Response:
        snap = st().snapshot()
        data = snap.model_dump(mode="json")
        checked = st().health.checked_at
        data["backend_age_s"] = round((utcnow() - checked).total_seconds(), 1) if checked else None
        return JSONResponse(data)

    async def models(request: Request) -> Response:
        url = st().serving_url()
        if url and url not in st().unreachable:
            try:
                response = await st().client.get(f"{url}/v1/models", timeout=5.0)
                if response.status_code == 200:
                    st().models_body = response.content
                    return Response(response.content, media_type="application/json")
            except httpx.HTTPError:
                pass
        if st().models_body is not None:
            return Response(st().models_body, media_type="application/json")
        cid = st().route.candidate_id if st().route else None
        return JSONResponse(
            {
                "object": "list",
                "data": []
                if not cid
                else [{"id": cid, "object": "model", "owned_by": "mcp-infra"}],
            }
        )

    async def proxy(request: Request) -> Response:
        s = st()
        body = await request.body()
        headers = _forward_headers(request)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        s._add(live_requests=1)
        start = time.monotonic()
        held = False
        try:
            while True:
                url = s.serving_url()
                if url is not None:
                    outgoing = s.client.build_request(
                        request.method, url + target, headers=headers, content=body
                    )
                    s.in_flight[url] += 1
                    try:
                        upstream = await s.client.send(outgoing, stream=True)
                    except (httpx.ConnectError, httpx.RemoteProtocolError):
                        s.in_flight[url] -= 1  # never reached a backend: safe to try again
                        s.mark(url, False)
                    except httpx.HTTPError as exc:
                        s.in_flight[url] -= 1
                        s._add(upstream_errors=1)
                        return JSONResponse(
                            {"error": f"upstream: {type(exc).__name__}"}, status_code=502
                        )
                    else:
                        s.mark(url, True)
                        if held:
                            s.note_hold(time.monotonic() - start)
                            s.held_now -= 1
                            held = False
                        return StreamingResponse(
                            _relay(s, upstream, url),
                            status_code=upstream.status_code,
                            headers={
                                k: v
                                for k, v in upstream.headers.items()
                                if k.lower() not in DROP_FROM_RESPONSE
                            },
                        )
                if not held:
                    held = True
                    s.held_now += 1
                    s._dirty = True
                waited = time.monotonic() - start
                if hold_expired(waited, s.max_hold_s()):
                    s.note_hold(waited)
                    s.held_now -= 1
                    held = False
                    s._add(rejected_503=1)
                    retry = retry_after_s(s.max_hold_s())
                    return JSONResponse(
                        {
                            "error": {
                                "message": "the service is switching backends and could not "
                                f"serve within {s.max_hold_s():.0f} s; retry shortly",
                                "type": "service_unavailable",
                            }
                        },
                        status_code=503,
                        headers={"Retry-After": str(retry)},
                    )
                await s.wait_change(min(0.1, s.max_hold_s() - waited))
        finally:
            if held:  # the client went away while held
                s.note_hold(time.monotonic() - start)
                s.held_now -= 1

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/{path:path}", proxy, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ],
        lifespan=lifespan,
    )


async def _relay(s: FrontState, upstream: httpx.Response, url: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
        s._add(served=1)
    except httpx.HTTPError:
        s._add(upstream_errors=1)
        raise
    finally:
        await upstream.aclose()
        s.in_flight[url] -= 1
        s._dirty = True


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="mcp_infra.procs.front")
    parser.add_argument("--home", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    home = Home(args.home)
    config = uvicorn.Config(
        build_app(home),
        host=LOOPBACK,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    uvicorn.Server(config).run()
    return 0


# ---------------------------------------------------------------------------------------------
# The supervisor's side
# ---------------------------------------------------------------------------------------------


class FrontError(RuntimeError):
    """The front did not start or did not adopt a route in time."""


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


def live_request_count(home: Home) -> int | None:
    """Monotonic count of live requests the front has received (served or in flight); None if
    no front runs. Read before and after a measurement round: the difference is the live
    traffic that overlapped it (at most 0.2 s stale)."""
    status = front_status(home)
    return status.total.live_requests if status else None


def ensure_front(home: Home, config: ServiceConfig, *, timeout: float = 20.0) -> str:
    """Start the front on the stable port unless our recorded front already holds it."""
    record = front_record(home)
    if record is not None and is_running(record) and port_owner_is(record, config.port):
        return "running"
    if record is not None and is_running(record):  # ours, but not listening: replace it
        stop_server(record, grace=3.0)
    record_path(home).unlink(missing_ok=True)
    if port_open(config.port):
        raise PortBusy(
            f"port {config.port} is held by a process mcp-infra did not start; refusing to touch it"
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
            if httpx.get(f"http://{LOOPBACK}:{config.port}/health", timeout=1.0).is_success:
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
    wait_s: float = 5.0,
) -> FrontRoute:
    """Write the next route atomically and wait (bounded) until a running front adopted it."""
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
    wait_adopted(home, route.generation, wait_s)
    return route


def wait_adopted(home: Home, generation: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not front_running(home):
            return False
        status = front_status(home)
        if status is not None and status.generation >= generation:
            return True
        time.sleep(0.02)
    return False


def drain(home: Home, backend_url: str, timeout: float) -> int:
    """Wait until the front has no request in flight on ``backend_url``; return how many were
    still in flight when the bound ran out (0: drained)."""
    deadline = time.monotonic() + timeout
    left = 0
    while True:
        status = front_status(home)
        left = status.in_flight_by_backend.get(backend_url, 0) if status else 0
        if left == 0 or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def fresh_status(home: Home, timeout: float = 1.0) -> FrontStatus | None:
    """A status written after this call began (so counters include everything until now)."""
    start = utcnow()
    deadline = time.monotonic() + timeout
    status = front_status(home)
    while status is not None and status.updated_at < start and time.monotonic() < deadline:
        time.sleep(0.05)
        status = front_status(home)
    return status


def status_age_s(status: FrontStatus | None, now: datetime | None = None) -> float | None:
    if status is None:
        return None
    return round(((now or utcnow()) - status.updated_at).total_seconds(), 1)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(main())
