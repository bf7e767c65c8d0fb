"""The supervisor's handle on the front: start it, route it, ask it, drain through it.

The front is two processes: the keeper (``procs.keeper``, recorded in ``state/front.json``)
holds the stable port and replaces a proxy that misses its heartbeat; the proxy
(``procs.proxy``, its child) forwards clients to the backend its route names.

Control is by one file, ``state/route.json`` (a ``FrontRoute``, written atomically here), not by
a socket: the route must survive a restart of the front anyway, so the file is the one source of
truth a restarted front resumes from. The front echoes the generation
it adopted in ``GET /health`` and ``state/front_status.json``; ``set_route`` waits for the new
route to be adopted and its backend seen healthy before anything is drained or stopped (it
raises ``RouteNotAdopted`` otherwise). Figures of this instant are asked of the front itself
(``ask_front``), so a full disk under it (its status file unwritable) does not stop a switch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import httpx2 as httpx
import psutil

from mcp_infra.contracts import FrontConfig, FrontRoute, FrontStatus, ProcessRecord, ServiceConfig
from mcp_infra.core.admission import route_to
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.logpipe import spawn_logged
from mcp_infra.procs.runtime import (
    LOOPBACK,
    LOOPBACK6,
    PortBusy,
    is_running,
    loopback_client,
    port_open,
    port_owner_is,
    stop_server,
)
from mcp_infra.state.context import load_config
from mcp_infra.state.store import CorruptFile, Home, read_optional, utcnow, write_model


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


class FrontError(ServerUnavailable):
    """The front did not start, or did not confirm a route in time."""


class PortTaken(FrontError):
    """The stable port (or [::1] on it) is held by another process: the front refuses to
    start."""


def bind_stable_port(port: int, ipv6: bool, say: Callable[[str], None]) -> list[socket.socket]:
    """127.0.0.1 and, with ``ipv6``, [::1] on ``port``, listening, so that no other local user
    can take [::1] there (a machine without IPv6 has no [::1] to take: IPv4 only, said)."""
    try:
        held = [socket.create_server((LOOPBACK, port), backlog=1024)]
    except OSError as exc:
        raise PortTaken(f"cannot listen on {LOOPBACK}:{port}: {exc}") from exc
    if not ipv6:
        return held
    try:
        held.append(socket.create_server((LOOPBACK6, port), family=socket.AF_INET6, backlog=1024))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            held[0].close()
            raise PortTaken(
                f"[{LOOPBACK6}]:{port} is held by another process; refusing to serve"
            ) from exc
        say(f"no IPv6 loopback here ({exc}); serving on {LOOPBACK} only")
    return held


def raise_fd_limit(want: int) -> None:
    """This process's (and its children's) open-file limit raised to ``want`` where the hard
    limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


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
        response = loopback_client().get(
            f"http://{LOOPBACK}:{record.port}/health", headers=headers, timeout=timeout
        )
        data = response.json()
        fields = {k: v for k, v in data.items() if k in FrontStatus.model_fields}
        return FrontStatus.model_validate(fields)
    except (httpx.HTTPError, ValueError):
        return None


class Kept(NamedTuple):
    """A kept answer of the front (None: it did not answer)."""

    answer: FrontStatus | None


@dataclass
class FrontWatch:
    """The front's own ``GET /health``, asked every ``period`` seconds by a daemon thread while
    someone reads it, for a server whose clients read `status` over and over (an IDE polling,
    an agent following a cycle): each read takes the answer the thread got at most about
    ``period`` ago instead of a request to another process on the read's path, which on a busy
    machine waits for that process to be scheduled. An answer is only taken while it is fresh
    (``period`` plus the ask's ``timeout``); a read finding none asks in the open and starts the
    thread, which ends after ``linger`` seconds without a read. A stuck front shows as one that
    did not answer within ``timeout``, as with a direct ask."""

    home: Home
    period: float = 1.0
    timeout: float = 1.0
    linger: float = 30.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _kept: tuple[float, FrontStatus | None] | None = field(default=None, repr=False)
    _read_at: float = field(default=0.0, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __call__(self) -> FrontStatus | None:
        kept = self.kept()
        return kept.answer if kept is not None else self._ask()

    def kept(self) -> Kept | None:
        """The answer the thread got, if fresh (None: none is, ask in the open). A read: the
        thread keeps asking, or starts again."""
        now = time.monotonic()
        with self._lock:
            self._read_at, kept = now, self._kept
            running = self._thread is not None and self._thread.is_alive()
            if not running:
                self._thread = threading.Thread(target=self._run, name="front-watch", daemon=True)
                self._thread.start()
        if kept is not None and now - kept[0] <= self.period + self.timeout:
            return Kept(kept[1])
        return None

    def _ask(self) -> FrontStatus | None:
        asked = time.monotonic()
        answer = ask_front(self.home, timeout=self.timeout)
        with self._lock:
            if self._kept is None or self._kept[0] < asked:
                self._kept = (asked, answer)
        return answer

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            with self._lock:
                if time.monotonic() - self._read_at > self.linger:
                    self._thread = None
                    return
            with contextlib.suppress(Exception):  # the next read asks in the open
                self._ask()

    @property
    def watching(self) -> bool:
        """Whether the thread asks now (it ends ``linger`` seconds after the last read)."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()


def current_status(home: Home) -> FrontStatus | None:
    """The front's status of this instant when it answers, else its last written one."""
    return ask_front(home) or front_status(home)


def live_request_count(home: Home) -> int | None:
    """Monotonic count of live requests the front has received (served or in flight); None if
    no front runs. Read before and after a measurement round: the difference is the live
    traffic that overlapped it."""
    status = current_status(home)
    return status.total.live_requests if status else None


_HOLDERS: set[tuple[int, float, int]] = set()


def front_holds_port(record: ProcessRecord | None, port: int) -> bool:
    """The recorded front (its keeper) is alive and listens on ``port``. The keeper binds the
    stable port once and keeps the socket for its whole life (each proxy it starts serves on
    it), so a confirmed answer holds while that process (pid and start time) runs: it is kept,
    and `status`, polled by every IDE, does not scan the process's sockets (about 9 ms) each
    time."""
    if record is None or not is_running(record):
        return False
    key = (record.pid, record.create_time, port)
    if key in _HOLDERS:
        return True
    if port_owner_is(record, port):
        _HOLDERS.add(key)
        return True
    return False


def ensure_front(home: Home, config: ServiceConfig, *, timeout: float = 20.0) -> str:
    """Start the front (its keeper, which starts the proxy) on the stable port unless our
    recorded front already holds it."""
    record = front_record(home)
    if front_holds_port(record, config.port):
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
    argv = [sys.executable, "-m", "mcp_infra.procs.keeper", "--home", str(home.root)]
    argv += ["--port", str(config.port)]
    proc = spawn_logged(argv, log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
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
            if loopback_client().get(url, timeout=1.0).is_success:
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
