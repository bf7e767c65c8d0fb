"""Real fault injection into real cycles, for `benchmarks/faults.py` and the crash-safety tests.

Supervisors run as real subprocesses (`python -m mcp_infra supervise`), paused with the product's
own seam `MCP_INFRA_PAUSE_AT` and killed with SIGKILL, exactly as a power cut would. It lives in
the package (not in tests/) so the benchmark runs from a plain `pip install`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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


def supervisor(home: Home, pause_at: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MCP_INFRA_PAUSE_AT", None)
    if pause_at:
        env["MCP_INFRA_PAUSE_AT"] = pause_at
    log = (home.logs / "test-supervisor.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "supervise"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


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
