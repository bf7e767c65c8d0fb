"""The front's proxy process: the reverse proxy on the stable port, owned by one event loop.

Clients talk to the front; backends (the live recipe, candidates) run on ports of their own. The
proxy forwards the OpenAI-compatible API (streaming included, bytes relayed as they come) to the
backend its route names, so a promotion is a route switch between two running backends, not a
restart of the port clients use.

It makes the service more reliable than the bare server, not only movable:
- **Bounded, queued.** At most ``max_per_backend`` requests go to one backend at a time (and at
  most four connection attempts at once: mlx_lm.server's listen backlog is 5); the rest wait in
  one first-come queue, up to ``max_queue``, past which a client gets 503 with ``Retry-After``.
  A client waits instead of being reset.
- **Limits everywhere.** Header time, idle time, body size, time to read an answer, and the
  number of connections (``proxy_conn``).
- **Honest failures.** A request is retried only when no byte of it reached a backend; a
  backend that ends an event stream before ``data: [DONE]`` ends the client's stream with an
  error event, and the answer counts as failed (``proxy_conn``, ``proxy_upstream``).
- **Exposure.** Only the OpenAI-compatible paths and ``/health`` are served, read strictly
  (``core.frontrules.classify``); CORS headers from backends are dropped unless
  ``allow_origins`` is configured; an optional bearer token; 127.0.0.1 and ::1 are both held.
- **Self-healing.** When the live backend's recorded process is gone, or it runs but answers
  its health check with an error or not at all (hung) for long, the proxy asks for a restart
  (``python -m mcp_infra.procs.heal``) with bounded backoff; a backend that keeps dying raises
  needs-operator.
- **Supervised tasks.** Route polling, status writing, probing and healing each restart after a
  failure (logged, counted, visible in the status as ``tasks``).
- **Watched.** The proxy runs on sockets its keeper (``procs.keeper``) holds, and beats a pipe
  to it from this event loop every ``BEAT_EVERY_S``: a loop that stops turning is replaced. A
  keeper that is gone (the pipe broken) stops the proxy.
- **Logging that cannot stop it.** Its output goes through a log relay (``procs.logpipe``);
  it says in its status when logging is degraded (the home's disk full, its status file not
  written) and since when, from memory.

Control is by one file, ``state/route.json`` (``procs.front`` writes it). The proxy polls the
file's identity every 20 ms and echoes the generation it adopted, with its counters, the
backend's health and its healing, in ``state/front_status.json`` (written only when its content
changed) and in ``GET /health``.

Run: ``python -m mcp_infra.procs.proxy --home DIR --port PORT`` (started by the keeper with
``--listen-fd`` and ``--heartbeat-fd``; alone, it binds the port itself).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from mcp_infra.contracts import (
    BackendHealth,
    FrontConfig,
    FrontCounters,
    FrontRoute,
    FrontStatus,
    HealState,
    LogHealth,
    ProcessRecord,
    TaskHealth,
    Watchdog,
)
from mcp_infra.core import frontrules as rules
from mcp_infra.procs.front import (
    PortTaken,
    bind_stable_port,
    front_token,
    raise_fd_limit,
    route_path,
    status_path,
)
from mcp_infra.procs.logpipe import room_problem
from mcp_infra.procs.proxy_conn import ClientGone, Conn, HoldExpired, QueueFull, log, on_connect
from mcp_infra.procs.proxy_upstream import Slow, Unreachable, UpstreamBroken, get_once
from mcp_infra.procs.runtime import backend_url, is_running, service_lock_held
from mcp_infra.state.context import load_config, mark_needs_operator, service_record
from mcp_infra.state.store import CorruptFile, Home, read_optional, utcnow

ROUTE_POLL_S = 0.02
STATUS_EVERY_S = 0.2
PROBE_EVERY_S = 2.0
PROBE_DOWN_S = 0.5
CONNECTS_PER_BACKEND = 4  # below mlx_lm.server's listen backlog of 5
HEAL_TIMEOUT_S = 240.0
SICK_AFTER_S = 10.0  # a running backend that answers /health with an error this long is restarted
HUNG_AFTER_S = 15.0  # ... or that answers it not at all (each probe waits 2 s) this long
SHUTDOWN_S = 5.0
BEAT_EVERY_S = 0.25  # the keeper replaces a proxy silent for keeper.HEARTBEAT_S


class Waiter:
    """A request waiting for a slot: ``held`` while no backend can serve (counted as a hold)."""

    __slots__ = ("future", "held", "since")

    def __init__(self, future: asyncio.Future[str], held: bool) -> None:
        self.future = future
        self.held = held
        self.since = time.monotonic()


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
        self.silent_since: float | None = None
        self.unserved_since: datetime | None = None
        self._unserved_mono: float | None = None
        self.tasks: dict[str, TaskHealth] = {}
        self.healing = HealState(state="ok" if cfg.heal else "off")
        self.logging = LogHealth()
        self.status_error: str | None = None
        self.watchdog = Watchdog()
        self.counted_scope: str | None = None
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
        if route.scope != self.counted_scope:
            self.scoped = FrontCounters()
            self.counted_scope = route.scope
        if route.backend_url != (self.route.backend_url if self.route else None):
            self.health = BackendHealth(url=route.backend_url)
            self.unreachable.discard(route.backend_url or "")
            self.sick_since = self.silent_since = None
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
            self.count(unserved_s=time.monotonic() - self._unserved_mono)
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

    def count(self, **counts: float) -> None:
        for counters in (self.total, self.scoped):
            for name, value in counts.items():
                setattr(counters, name, getattr(counters, name) + value)
        self._dirty = True

    def note_hold(self, seconds: float) -> None:
        self.count(held=1)
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
            logging=self.logging,
            watchdog=self.watchdog,
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
        try:
            _write_volatile(status_path(self.home), snap)
        except OSError as exc:  # logging is degraded (``check_logging``); the task restarts
            self.status_error = f"the front's status file cannot be written: {exc.strerror}"
            raise
        self.status_error = None
        self._written = content

    def resume(self, replaced: int, why: str) -> None:
        """A replacement proxy goes on from the counters and healing of the last status its
        predecessor wrote (what it counted after that is lost), and says it was replaced."""
        self.watchdog = Watchdog(replaced=replaced, last=why[:400])
        try:
            last = read_optional(status_path(self.home), FrontStatus)
        except CorruptFile:
            last = None
        if last is not None:
            self.total, self.scoped, self.counted_scope = last.total, last.scoped, last.scope
            self.healing = last.healing if self.cfg.heal else self.healing

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
            self.count(queued=1)
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
        nothing unless no answer comes for ``HUNG_AFTER_S`` (hung: ``check_death``); a refused
        connection or an error answer makes the backend unready (requests wait) and, if it
        lasts, sick."""
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
            if url == (self.route.backend_url if self.route else None):
                self.silent_since = self.silent_since or time.monotonic()
            return
        except (Unreachable, UpstreamBroken) as exc:
            healthy, detail = False, f"GET /health: {str(exc)[:120]}"
        if url != (self.route.backend_url if self.route else None):
            return  # the route moved while this probe ran
        self.silent_since = None
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
        generation thread can die of one bad request; or has not answered it at all for
        ``HUNG_AFTER_S``: hung, or stopped): ask for a restart (or, past the rules' bounds,
        for an operator)."""
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
        detail = self._dead(record)
        if detail is None:
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
        log(self.healing.note)
        self._dirty = True
        self.heal_now.set()

    def _dead(self, record: ProcessRecord) -> str | None:
        """How the recorded live backend stopped serving, or None while it serves."""
        now = time.monotonic()
        who = f"{record.candidate_id}, pid {record.pid},"
        if not is_running(record):
            return f"{who} exited"
        if self.sick_since is not None and now - self.sick_since >= SICK_AFTER_S:
            return (
                f"{who} runs but failed its health check for {SICK_AFTER_S:.0f} s "
                f"({self.health.detail})"
            )
        if self.silent_since is not None and now - self.silent_since >= HUNG_AFTER_S:
            return f"{who} runs but has not answered its health check for {HUNG_AFTER_S:.0f} s"
        return None

    def check_logging(self) -> None:
        """Logging is degraded while the home's disk is full or the status file cannot be
        written; since when is kept here, in memory, and said in the status."""
        problem = room_problem(self.home.root) or self.status_error
        if problem is None:
            if self.logging.state != "ok":
                log(f"logging is back (degraded since {self.logging.since:%H:%M:%S} UTC)")
                self.logging = LogHealth()
                self._dirty = True
            return
        if self.logging.state == "ok":
            self.logging = LogHealth(state="degraded", since=utcnow(), detail=problem[:300])
            log(f"logging is degraded: {problem}")
            self._dirty = True
        elif self.logging.detail != problem[:300]:
            self.logging = self.logging.model_copy(update={"detail": problem[:300]})
            self._dirty = True

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
            log(f"restart: {outcome}: {message}")
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
                log(f"task {name} failed ({health.last_error}); restarting in {pause:.2f} s")
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
            self.check_logging()
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

    # the process ----------------------------------------------------------------------------

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

    async def heartbeat(self, fd: int) -> None:
        """A byte for the keeper every ``BEAT_EVERY_S`` from this event loop, so a loop that
        stops turning stops the beat. A keeper that is gone (the pipe broken) stops the proxy:
        the port's sockets are the keeper's to hold."""
        os.set_blocking(fd, False)
        while True:
            try:
                os.write(fd, b".")
            except BlockingIOError:  # the keeper has a backlog of beats: it lives
                pass
            except OSError:
                log("the keeper is gone; stopping")
                self.stopping.set()
                return
            await asyncio.sleep(BEAT_EVERY_S)

    async def run(
        self,
        *,
        signals: bool = True,
        sockets: list[socket.socket] | None = None,
        heartbeat: int | None = None,
    ) -> int:
        """Serve on ``sockets`` (the keeper's; None: bind the stable port here), run the
        supervised tasks until SIGTERM/SIGINT (or ``stopping``), then stop: no new
        connections, requests in flight get ``SHUTDOWN_S`` to finish, a restart process is
        stopped. ``heartbeat``: the pipe to the keeper. ``signals`` False: the caller sets
        ``stopping`` (a front run inside another program's thread)."""
        if sockets is None:
            try:
                sockets = bind_stable_port(self.port, self.cfg.ipv6, log)
            except PortTaken as exc:
                log(str(exc))
                return 3
        serve = functools.partial(on_connect, self)
        servers = [await asyncio.start_server(serve, sock=s, backlog=1024) for s in sockets]
        self.listening = [_address(s) for s in sockets]
        if signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
        if heartbeat is not None:
            asyncio.ensure_future(self.heartbeat(heartbeat))
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


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_infra.procs.proxy")
    parser.add_argument("--home", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, action="append", default=[])
    parser.add_argument("--heartbeat-fd", type=int)
    parser.add_argument("--replaced", type=int, default=0)
    parser.add_argument("--why", default="")
    args = parser.parse_args(argv)
    home = Home(args.home)
    try:
        cfg = load_config(home).front
    except (FileNotFoundError, CorruptFile) as exc:
        log(f"config not readable ({exc}); the front runs with default limits")
        cfg = FrontConfig()
    try:
        token = front_token(home, cfg)
    except (OSError, ValueError) as exc:
        log(f"the configured token cannot be read ({exc}); refusing to serve without it")
        return 2
    # a connection is one descriptor, a request in flight one more: room for both, and spare
    raise_fd_limit(2 * cfg.max_connections + 256)
    # past a file-size limit a write fails (EFBIG) instead of killing the front
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    front = Front(home, cfg, token, args.port)
    if args.replaced:
        front.resume(args.replaced, args.why)
    sockets = [socket.socket(fileno=fd) for fd in args.listen_fd] or None
    try:
        import uvloop

        runner: Callable[[Awaitable[int]], int] = uvloop.run  # type: ignore[assignment]
    except ImportError:
        runner = asyncio.run  # type: ignore[assignment]
    return runner(front.run(sockets=sockets, heartbeat=args.heartbeat_fd))


if __name__ == "__main__":
    raise SystemExit(main())
