"""Launch templates and server processes.

A template turns a typed ``Recipe`` into an argv list — no shell, no free text from a plan. Servers
run in their own session (so one signal reaches the whole group), bound to 127.0.0.1, and are
recorded by pid, process group, start time and command line so that a later process can find them
again and never mistake a stranger that reused the pid for one of ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx2 as httpx
import psutil

from mcp_infra.contracts import (
    DISTRIBUTED_TEMPLATE,
    ClusterHost,
    LaunchRecord,
    ProcessRecord,
    Recipe,
)
from mcp_infra.core.distributed import backend_of, split_of
from mcp_infra.core.templates import TEMPLATES, mlx_lm_server_argv
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.bench import served_model
from mcp_infra.procs.distributed import (
    distributed_argv,
    find_ranks,
    launch_log_tail,
    live_ranks,
    plan_launch,
)
from mcp_infra.procs.identity import is_alive, is_zombie, start_time, started_by
from mcp_infra.procs.logpipe import settled, spawn_logged
from mcp_infra.state.runtimes import RuntimeEnvError, verify_recipe_runtime
from mcp_infra.state.store import Home, flock_held, utcnow

LOOPBACK = "127.0.0.1"


@functools.cache
def loopback_client() -> httpx.Client:
    """One HTTP client per process for plain-HTTP requests to loopback ports (the front's
    ``/health``, a server's readiness): the connection pool keeps a connection open between
    polls, and no TLS context is built (no request here is HTTPS; loading the CA bundle took
    about 20 ms of each new client). Thread-safe; each request passes its own timeout."""
    return httpx.Client(trust_env=False, verify=False)


class ServerStartError(ServerUnavailable):
    """A server did not become ready; the message says why (exit code, timeout, log tail)."""


class PortBusy(ServerUnavailable):
    """A process the project did not start holds the port: refused, never killed."""


class ServiceBusy(ServerUnavailable):
    """Another process is switching or restarting the service (it holds the service lock)."""


def build_argv(
    recipe: Recipe,
    port: int,
    host: str = LOOPBACK,
    python: str | None = None,
    launch: LaunchRecord | None = None,
) -> list[str]:
    """The one way a recipe becomes a command line. A recipe with its own runtime environment
    always runs that environment's interpreter; ``python`` names the control plane's (another
    process's ``sys.executable``, when an argv it recorded is compared). A split recipe
    (``mlx_lm_distributed``) is mlx.launch around the ``mlx_lm_server`` argv of one rank, with
    the ``launch`` its hosts were placed in (``distributed.plan_launch``)."""
    if host != LOOPBACK:
        raise ValueError("servers are bound to 127.0.0.1 only")
    if not 1024 <= port <= 65535:
        raise ValueError("port out of range")
    if recipe.runtime is not None:  # its own pinned environment, whatever the caller's python
        python = recipe.runtime.python
    python = python or sys.executable
    if recipe.template == DISTRIBUTED_TEMPLATE:
        knobs = recipe.knobs
        if launch is None or not knobs.ranks:
            raise ValueError("a split recipe needs ranks and a placed launch")
        placed = (launch.backend, launch.split, len(launch.hosts))
        if placed != (backend_of(knobs), split_of(knobs), knobs.ranks):
            raise ValueError(f"the launch {placed} was not placed for this recipe's knobs")
        return distributed_argv(mlx_lm_server_argv(recipe, host, port, python), python, launch)
    if recipe.knobs.ranks:
        raise ValueError(f"ranks need the {DISTRIBUTED_TEMPLATE} template")
    return TEMPLATES[recipe.template](recipe, host, port, python)


def runs_recipe(record: ProcessRecord, recipe: Recipe) -> bool:
    """Does the recorded process run exactly this recipe's command?"""
    try:
        expected = build_argv(recipe, record.port, python=record.argv[0], launch=record.launch)
    except ValueError:
        return False
    return record.argv == expected


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


LOOPBACK6 = "::1"


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """True if something accepts connections on the port (``host`` 127.0.0.1 or ::1)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no IPv6 on this machine: nobody can listen there either
        return False
    with sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def backend_url(record: ProcessRecord) -> str:
    return f"http://{record.host}:{record.port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def is_running(record: ProcessRecord) -> bool:
    """The recorded process is alive and is the same process (same start time), not a zombie."""
    return is_alive(record.pid, record.create_time)


def port_owner_is(record: ProcessRecord | None, port: int) -> bool:
    """Is the listener on ``port`` the recorded process (or one of its group)?"""
    if record is None or not is_running(record):
        return False
    try:
        procs = [psutil.Process(record.pid), *psutil.Process(record.pid).children(recursive=True)]
        for proc in procs:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return False


def server_env(hf_cache: Path | None, *, own_runtime: bool = False) -> dict[str, str]:
    """Environment for servers: offline-safe hub cache, unbuffered logs. A server from its own
    runtime environment writes no bytecode into it (its files must keep matching its lock) and
    sees no ``PYTHONPATH`` of the control plane's."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if own_runtime:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPATH", None)
    if hf_cache is not None:
        hf_cache.mkdir(parents=True, exist_ok=True)
        env.setdefault("HF_HUB_CACHE", str(hf_cache))
    return env


def start_server(
    recipe: Recipe,
    *,
    port: int,
    role: str,
    log_path: Path,
    cycle_id: str | None = None,
    hf_cache: Path | None = None,
    argv: list[str] | None = None,
    hosts: list[ClusterHost] | None = None,
) -> tuple[ProcessRecord, subprocess.Popen[bytes]]:
    """Start a server in its own session. Refuses a busy port (never kills what holds it). A
    split recipe runs its ranks on ``hosts`` (the home's configured ones) through mlx.launch;
    its local ranks share the launcher's session and process group."""
    if port_open(port):
        raise PortBusy(f"port {port} is already in use by a process mcp-infra did not start here")
    if recipe.runtime is not None:  # its own environment: the lock's bytes, or no start
        try:
            verify_recipe_runtime(recipe.runtime)
        except RuntimeEnvError as exc:
            raise ServerStartError(f"{recipe.candidate_id} not started: {exc}") from exc
    launch = None
    if recipe.template == DISTRIBUTED_TEMPLATE:
        if not hosts:
            raise ValueError("a split recipe needs the configured hosts")
        launch = plan_launch(recipe, hosts, log_path)
    command = argv or build_argv(recipe, port, launch=launch)
    env = server_env(hf_cache, own_runtime=recipe.runtime is not None)
    proc = spawn_logged(command, log_path, env=env)  # its output never waits on the disk
    created = start_time(proc.pid) or time.time()
    record = ProcessRecord(
        role=role,  # type: ignore[arg-type]
        pid=proc.pid,
        pgid=proc.pid,
        create_time=created,
        argv=command,
        host=LOOPBACK,
        port=port,
        log_path=str(log_path),
        candidate_id=recipe.candidate_id,
        cycle_id=cycle_id,
        started_at=utcnow(),
        launch=launch,
    )
    return record, proc


def pin_to_cpus(pid: int, count: int | None) -> list[int] | None:
    """Keep process ``pid``'s threads on the last ``count`` CPUs this process may use; the
    CPUs, or None where none were set (no count, a platform without CPU affinity: macOS).

    Why: a server whose threads are split over CPUs hands every token from one CPU to another,
    a wake-up a VM makes dear; on a small VM an unpinned server runs in slow spells that no load
    counter shows, and pinned its timings vary several times less (the figures are in
    docs/benchmarks.md). Called right after the start, before the server has made its worker
    threads, which inherit the main thread's CPUs; the threads already there are set one by
    one."""
    if count is None or not hasattr(os, "sched_setaffinity"):
        return None
    chosen = sorted(os.sched_getaffinity(0))[-count:]
    try:
        threads = [t.id for t in psutil.Process(pid).threads()]
    except psutil.Error:
        threads = []
    for tid in dict.fromkeys([pid, *threads]):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, chosen)
    return chosen


def with_ranks(record: ProcessRecord) -> ProcessRecord:
    """A split server's record with its ranks found (their pids, start times, environments)."""
    if record.launch is None:
        return record
    launch = record.launch.model_copy(update={"ranks": find_ranks(record)})
    return record.model_copy(update={"launch": launch})


def whole(record: ProcessRecord) -> bool:
    """The recorded server runs, and so does every recorded local rank of a split one (a
    rank that died fails the whole server, even before mlx.launch has stopped the others)."""
    if not is_running(record):
        return False
    if record.launch is None:
        return True
    recorded = [r for r in record.launch.ranks if r.pid is not None]
    return len(live_ranks(record)) == len(recorded)


def server_log_tail(record: ProcessRecord, limit: int = 600) -> str:
    """Why a server failed, from its log: a split server's names the rank that died first. The
    log of a server that ended is read once its relay has written all of it."""
    if not is_running(record):
        settled(record.log_path)
    if record.launch is not None:
        return launch_log_tail(record, limit)
    return log_tail(record.log_path, limit)


def log_tail(path: str | Path, limit: int = 1500) -> str:
    try:
        data = Path(path).read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()


class Probe:
    """Outcome of one readiness probe: ready, still starting, answered with an error, or
    accepted and dropped without an answer (``dropped``: the request failed inside it)."""

    def __init__(self, ready: bool, error: str | None = None, dropped: bool = False) -> None:
        self.ready = ready
        self.error = error
        self.dropped = dropped


def logged_error(text: str) -> str | None:
    """The exception a server's log last reported after a traceback (the runtime's own
    words, e.g. ``ValueError: [quantize] ...``); None without a traceback."""
    marker = "Traceback (most recent call last)"
    if marker not in text:
        return None
    for line in text.rsplit(marker, 1)[1].splitlines()[1:]:
        if line and not line[0].isspace() and ":" in line:
            return line.strip()[:400]
    return None


def probe(base_url: str, timeout: float = 30.0) -> Probe:
    """One-token chat completion: the only honest readiness signal (``/health`` answers early).

    A connection failure means "not yet"; an HTTP error answer means the server is up but cannot
    serve this model (mlx_lm.server answers 404 for a model path it cannot load), which no amount
    of waiting fixes.
    """
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    if model := served_model(base_url, timeout=min(timeout, 5.0)):  # mlx_vlm.server needs it
        body["model"] = model
    try:
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=timeout)
    except (httpx.ConnectError, httpx.ConnectTimeout):
        return Probe(False)
    except httpx.HTTPError:
        return Probe(False, dropped=True)
    if response.status_code == 200:
        return Probe(True)
    return Probe(False, f"HTTP {response.status_code}: {response.text[:300]}")


def probe_completion(base_url: str, timeout: float = 30.0) -> bool:
    return probe(base_url, timeout).ready


def wait_ready(record: ProcessRecord, timeout: float, poll: float = 0.25) -> float:
    """Wait until the server answers a 1-token completion; return seconds waited."""
    start = time.monotonic()
    base = f"http://{record.host}:{record.port}"
    while True:
        if not is_running(record):
            raise ServerStartError(
                f"server for {record.candidate_id} exited before it was ready; log tail: "
                f"{server_log_tail(record, 600)}"
            )
        if port_owner_is(record, record.port):
            result = probe(base)
            if result.ready:
                return time.monotonic() - start
            if result.error:
                raise ServerStartError(
                    f"server for {record.candidate_id} cannot serve: {result.error}; log tail: "
                    f"{server_log_tail(record, 400)}"
                )
            said = logged_error(server_log_tail(record, 4000)) if result.dropped else None
            if said:  # it failed the request itself: no wait will fix that
                raise ServerStartError(
                    f"server for {record.candidate_id} cannot serve: the runtime says: {said}"
                )
        if time.monotonic() - start > timeout:
            raise ServerStartError(
                f"server for {record.candidate_id} not ready after {timeout:.0f} s; log tail: "
                f"{server_log_tail(record, 600)}"
            )
        time.sleep(poll)


def stop_server(record: ProcessRecord, grace: float = 10.0) -> str:
    """TERM the recorded process group, wait, then KILL it. Only ever a process we recorded.
    A split server whose launcher is gone (killed alone) still has its recorded local ranks
    in that group: they are ended the same way."""
    if not is_running(record):
        return _stop_orphaned_ranks(record, grace) if _launch_left(record) else "not running"
    try:
        os.killpg(record.pgid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pgid, signal.SIGCONT)  # a stopped (hung) server runs to hear it
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_running(record):
            _reap(record.pid)
            if _wait_group_gone(record.pgid, 2.0):
                return "stopped (TERM)"
            break
        time.sleep(0.1)
    try:
        os.killpg(record.pgid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped (TERM)"
    for _ in range(50):
        if not is_running(record):
            break
        time.sleep(0.1)
    _reap(record.pid)
    _wait_group_gone(record.pgid, 5.0)
    return "killed (ignored TERM)"


def _launch_left(record: ProcessRecord) -> bool:
    """A split server whose launcher is gone still has members in its process group: its
    local ranks. They are its own: a recorded rank by pid and start time; any other member by
    the group id and a start after the launcher's (the kernel hands out no pid that a live
    process group still carries, so the group is the launcher's)."""
    if record.launch is None:
        return False
    if live_ranks(record):
        return True
    for proc in psutil.process_iter(["pid"]):
        try:
            if (
                _pgid(proc.pid) == record.pgid
                and started_by(proc.create_time(), record.create_time)
                and not is_zombie(proc)
            ):
                return True
        except psutil.Error:
            continue
    return False


def _stop_orphaned_ranks(record: ProcessRecord, grace: float) -> str:
    """The launcher died alone; the ranks left in its process group are ended as one."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pgid, sig)
        if _wait_group_gone(record.pgid, wait):
            return f"ranks stopped ({sig.name.removeprefix('SIG')})"
    return "ranks still running"


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no live member of the process group is left (children may hold the port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        if all(is_zombie(p) for p in members):
            return True
        time.sleep(0.05)
    return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _reap(pid: int, timeout: float = 2.0) -> None:
    """Collect our own child's exit status so it does not linger as a zombie (and its CPU time
    counts as this process's children's at once: ``core.machine`` leaves the measured server out
    of the machine's other load that way). A server tearing down a large memory map already
    shows as a zombie before it can be collected, so this waits a little for it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            collected, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child, or already collected
            return
        if collected or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


class MemorySampler:
    """Samples the resident memory of a server's process tree while it is measured.

    On Linux the kernel's high-water mark (VmHWM) of each process is also read, which catches
    peaks between samples; the source is recorded with the figure.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sample()

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _sample(self) -> None:
        total = 0
        for proc in self._tree():
            try:
                total += max(proc.memory_info().rss, vm_hwm(proc.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_bytes = max(self.peak_bytes, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / 2**30

    @property
    def source(self) -> str:
        if Path("/proc/self/status").exists():
            return "process tree: max(sampled RSS, kernel VmHWM), sampled every 0.2 s"
        return "process tree: sampled RSS every 0.2 s"


def vm_hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


# ---------------------------------------------------------------------------------------------
# The service lock
# ---------------------------------------------------------------------------------------------


class _Held:
    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle
        self.depth = 0


_service_mutex = threading.RLock()
_service_held: dict[str, _Held] = {}  # by lock path


def service_lock_path(home: Home) -> Path:
    return home.state / "service.lock"


def _flock_until(handle: IO[str], deadline: float, path: Path) -> None:
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ServiceBusy(
                    f"another process is switching or restarting the service ({path})"
                ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def service_lock(home: Home, wait_s: float = 150.0) -> Iterator[None]:
    """Held while the live service is switched, held or restarted (by a cycle, ``recover`` or
    the front's restart process), so that a restart never races a switch. An flock: it dies
    with its holder. Re-entrant within a process (a switch calls a switch). Raises
    ``ServiceBusy`` after ``wait_s``."""
    path = service_lock_path(home)
    deadline = time.monotonic() + wait_s
    got = _service_mutex.acquire(timeout=wait_s) if wait_s > 0 else _service_mutex.acquire(False)
    if not got:
        raise ServiceBusy("another thread of this process is switching the service")
    try:
        held = _service_held.get(str(path))
        if held is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("a+")
            try:
                _flock_until(handle, deadline, path)
            except BaseException:
                handle.close()
                raise
            held = _service_held[str(path)] = _Held(handle)
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
            if held.depth == 0:
                fcntl.flock(held.handle.fileno(), fcntl.LOCK_UN)
                held.handle.close()
                del _service_held[str(path)]
    finally:
        _service_mutex.release()


def service_lock_held(home: Home) -> bool:
    """Does some process hold the service lock now? (A look, never a wait.)"""
    return flock_held(service_lock_path(home))
