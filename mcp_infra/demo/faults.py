"""Real fault injection into real cycles, for `benchmarks/faults.py` and the crash-safety tests.

Supervisors run as real subprocesses (`python -m mcp_infra supervise`), paused with the product's
own seam `MCP_INFRA_PAUSE_AT` and killed with SIGKILL, exactly as a power cut would. It lives in
the package (not in tests/) so the benchmark runs from a plain `pip install`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from mcp_infra.contracts import CycleSummary, ProcessRecord
from mcp_infra.flows import api as app
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import is_running, port_open
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.context import active_recipe, load_config, service_record
from mcp_infra.state.store import Home, read_optional

PLAN = {"hypothesis": "a drafter speeds up decoding", "candidates": ["demo-tiny:draft-k4"]}


def supervisor_log(home: Home) -> Path:
    """Where a supervisor started here writes its output: beside the home, not in it, so what
    it says about a full home disk is kept."""
    return home.root.parent / f"{home.root.name}-supervisor.log"


def supervisor(home: Home, pause_at: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MCP_INFRA_PAUSE_AT", None)
    if pause_at:
        env["MCP_INFRA_PAUSE_AT"] = pause_at
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "supervise"],
        stdout=subprocess.PIPE,  # a pipe, not a file: a file-size limit on it leaves it writable
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    threading.Thread(target=_copy, args=(proc, supervisor_log(home)), daemon=True).start()
    return proc


def _copy(proc: subprocess.Popen[bytes], path: Path) -> None:
    assert proc.stdout is not None
    with path.open("ab") as log:
        for line in proc.stdout:
            log.write(line)
            log.flush()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"supervisor exited ({proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stranger(port: int) -> subprocess.Popen[bytes]:
    """A program mcp-infra did not start, listening on `port` (it must never be killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: port_open(port), 20, "the stranger to listen")
    return proc


def start_live(home: Home) -> None:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)


def queue_plan(home: Home, plan: dict[str, Any] | None = None) -> str:
    view = app.propose(home, plan or PLAN, proposed_by="faults", start_supervisor=False)
    assert view.accepted, view.message
    assert view.plan_id
    return view.plan_id


def kill_hard(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the supervisor alone: the servers it started stay, as after a real crash."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def project_servers(home: Home) -> list[int]:
    """Pids of mlx servers serving this home's models (the only servers this home starts)."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = proc.info.get("cmdline") or []
        if proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if any("mlx_lm" in part or "mlx_vlm" in part for part in cmd) and any(
            str(home.root) in part for part in cmd
        ):
            pids.append(proc.pid)
    return pids


def candidate_records(home: Home) -> list[ProcessRecord]:
    folder = home.state / "candidates"
    records = [read_optional(p, ProcessRecord) for p in sorted(folder.glob("*.json"))]
    return [r for r in records if r is not None]


@dataclass
class Aftermath:
    """What a person finds after a fault: the facts benchmarks/faults.py tabulates."""

    outcome: str | None
    serving: str | None
    healthy: bool
    orphans: list[int]
    journal_problems: list[str]
    sealed: bool
    interrupted: bool
    verified: bool
    notes: list[str] = field(default_factory=list)


def inspect(home: Home, plan_id: str | None = None) -> Aftermath:
    record = service_record(home)
    live = record is not None and is_running(record)
    healthy = False
    if live and record is not None:
        sample = bench.greedy_chat(
            f"http://127.0.0.1:{record.port}",
            [{"role": "user", "content": "ping"}],
            max_tokens=4,
            timeout=30,
            candidate="check",
            prompt_id="p",
        )
        healthy = sample.error is None
    orphans = [pid for pid in project_servers(home) if not (record and pid == record.pid)]
    summaries: list[CycleSummary] = [
        s for s in evidence.list_cycles(home) if plan_id is None or s.plan_id == plan_id
    ]
    summary = summaries[0] if summaries else None
    problems: list[str] = []
    for cycle_dir in home.cycles.iterdir() if home.cycles.is_dir() else []:
        problems += home.read_journal(cycle_dir.name)[1]
    verified = (
        summary is not None and evidence.verify(evidence.bundle_path(home, summary.cycle_id)).ok
    )
    return Aftermath(
        outcome=summary.outcome.value if summary else None,
        serving=active_recipe(home).candidate_id if live else None,
        healthy=healthy,
        orphans=orphans,
        journal_problems=problems,
        sealed=summary is not None,
        interrupted=bool(summary and summary.interrupted),
        verified=verified,
    )


def pause_and_kill(home: Home, state: str, timeout: float = 240) -> None:
    """Run a queued plan until the supervisor pauses at `state`, then SIGKILL it."""
    proc = supervisor(home, pause_at=state)
    marker = home.state / f"paused-at-{state.replace(':', '-')}"
    try:
        wait_for(marker.exists, timeout, f"pause at {state}", proc)
    finally:
        kill_hard(proc)
    marker.unlink(missing_ok=True)


def run_supervisor(home: Home, timeout: float = 300) -> int:
    proc = supervisor(home)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def release(home: Home, state: str) -> None:
    """Let a supervisor paused at ``state`` (``MCP_INFRA_PAUSE_AT``) go on."""
    (home.state / f"paused-at-{state.replace(':', '-')}").unlink()


def wait_paused(home: Home, state: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    marker = home.state / f"paused-at-{state.replace(':', '-')}"
    wait_for(marker.exists, timeout, f"the pause at {state}", proc)


def recover_command(home: Home, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`mcp-infra recover` as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "recover"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class SmallDisk:
    """The filesystem a home lives on, filled on demand. As root where mounts are allowed it is
    a real tmpfs of ``size_mb`` at the home's root, filled by a file until the kernel answers
    ENOSPC; elsewhere the supervisor's file-size limit (RLIMIT_FSIZE) drops to 0, so every
    write it makes fails as on a full disk (EFBIG instead of ENOSPC; Python ignores SIGXFSZ)."""

    def __init__(self, root: Path, size_mb: int, kind: str | None = None) -> None:
        self.root = root
        self.size_mb = size_mb
        self.kind = kind or "none"
        self.filler = root / ".filler"
        self.limited: list[tuple[int, tuple[int, int]]] = []

    def mount(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.kind == "RLIMIT_FSIZE":  # asked for: no mount is tried
            return
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.size_mb}m,mode=0700",
                "tmpfs",
                str(self.root),
            ],
            capture_output=True,
            check=False,
        )
        self.kind = "tmpfs" if done.returncode == 0 else "RLIMIT_FSIZE"

    def fill(self, pid: int) -> None:
        """No room left for process ``pid`` (the supervisor) from now on."""
        if self.kind == "tmpfs":
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while os.write(fd, b"\0" * 2**20):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            finally:
                os.close(fd)
        else:
            proc = psutil.Process(pid)
            old = proc.rlimit(psutil.RLIMIT_FSIZE)
            proc.rlimit(psutil.RLIMIT_FSIZE, (0, old[1]))
            self.limited.append((pid, old))

    def free(self) -> None:
        """Room again: the filler removed, a limit still in force lifted."""
        self.filler.unlink(missing_ok=True)
        for pid, old in self.limited:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).rlimit(psutil.RLIMIT_FSIZE, old)
        self.limited.clear()

    def unmount(self) -> None:
        self.free()
        if self.kind == "tmpfs":  # lazily: a log a stray process still holds must not block it
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True, check=False)


@contextmanager
def small_disk(root: Path, size_mb: int = 64, kind: str | None = None) -> Iterator[SmallDisk]:
    """A ``SmallDisk`` at ``root`` (make the home there inside the block; stop its processes
    before the block ends). ``kind="RLIMIT_FSIZE"``: the fallback, even where mounts work."""
    disk = SmallDisk(root, size_mb, kind)
    disk.mount()
    try:
        yield disk
    finally:
        disk.unmount()


@dataclass
class DiskFullRun:
    """What a supervisor that ran out of disk left, before and after `recover`."""

    exit_code: int
    serving_when_full: bool  # the live recipe answered while the disk was still full
    candidates_left: int  # candidate servers still running when it exited
    message: str  # its last line on stderr
    recover_code: int
    recover_notes: str


def disk_full_at(home: Home, disk: SmallDisk, state: str, timeout: float = 300) -> DiskFullRun:
    """Run the queued plan in a supervisor, fill the disk when it reaches ``state`` (a
    ``MCP_INFRA_PAUSE_AT`` point), let it go on to its end, check the service while the disk
    is still full, then free the space and run `mcp-infra recover`."""
    proc = supervisor(home, pause_at=state)
    try:
        wait_paused(home, state, proc, timeout)
        disk.fill(proc.pid)
        release(home, state)
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    serving = inspect(home).healthy
    left = [r for r in candidate_records(home) if is_running(r)]
    log = supervisor_log(home).read_text(errors="replace").strip().splitlines()
    errors = [line for line in log if line.startswith("mcp-infra: error:")]
    disk.free()
    recovered = recover_command(home, timeout)
    return DiskFullRun(
        exit_code=code,
        serving_when_full=serving,
        candidates_left=len(left),
        message=(errors or log or [""])[-1],
        recover_code=recovered.returncode,
        recover_notes=recovered.stdout.strip(),
    )
