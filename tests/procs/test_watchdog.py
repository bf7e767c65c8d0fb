"""Something always watches the service, and logs never stop it: real processes, faults caused
as they happen in life.

- A proxy whose event loop stops (SIGSTOP: what a stuck loop looks like from outside) is
  replaced by the keeper that holds the stable port, without a person; clients that connect
  meanwhile wait instead of being refused.
- A live backend that stops answering (SIGSTOP) is restarted by the front.
- With the home's disk full (a real tmpfs, filled until the kernel says ENOSPC) the live model
  keeps answering, `status` says logging is degraded and since when, and no cycle starts.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from mcp_infra.demo.faults import small_disk
from mcp_infra.demo.frontkit import one_stream, served_again
from mcp_infra.demo.homes import make_home, stop_home
from mcp_infra.flows import api as app
from mcp_infra.procs.front import current_status, front_record
from mcp_infra.procs.runtime import is_running
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home
from tests.helpers.faultkit import queue_plan, run_supervisor, supervisor_log


def serve(home: Home) -> str:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    return f"http://127.0.0.1:{config.port}"


def settle(home: Home, check: Any, timeout: float) -> Any:
    """The front's status once ``check`` holds for it (None if it never did)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = current_status(home)
        if status is not None and check(status):
            return status
        time.sleep(0.2)
    return None


def _top_up(path: Path) -> None:
    """Fill the last page of ``path`` on a full tmpfs (a file's last page has room a full disk
    does not take away), so that the next write into it fails."""
    with path.open("ab", buffering=0) as handle:
        try:
            while handle.write(b"#" * 512):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_a_stopped_proxy_is_replaced_and_clients_wait_instead_of_failing(home: Home) -> None:
    base = serve(home)
    assert one_stream(base, max_tokens=2).done
    keeper = front_record(home)
    before = current_status(home)
    assert keeper is not None and before is not None
    assert before.pid != keeper.pid, "the proxy is not the process that holds the port"
    assert psutil.Process(before.pid).ppid() == keeper.pid
    os.kill(before.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    waiting: list[Any] = []
    client = threading.Thread(target=lambda: waiting.append(one_stream(base, max_tokens=2)))
    client.start()  # connects while the proxy is stopped
    back = served_again(base, 60)
    assert back is not None, "served again without a person"
    print(f"\nserved again {time.monotonic() - stopped:.1f} s after SIGSTOP")
    client.join(60)
    assert waiting and waiting[0].done and waiting[0].status == 200, waiting
    after = settle(home, lambda s: s.pid != before.pid, 10)
    assert after is not None and after.watchdog.replaced == 1
    assert "missed its heartbeat" in after.watchdog.last
    assert after.total.served >= before.total.served, "the counters went on"
    assert front_record(home) == keeper and psutil.pid_exists(keeper.pid)
    assert not psutil.pid_exists(before.pid) or psutil.Process(before.pid).status() == "zombie"
    view = app.status(home)
    assert view.service is not None and view.service.healthy
    assert view.service.front_replaced and "heartbeat" in view.service.front_replaced


def test_a_hung_live_backend_is_restarted(home: Home) -> None:
    base = serve(home)
    old = service_record(home)
    assert old is not None
    os.killpg(old.pgid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        back = served_again(base, 120)
        assert back is not None, "served again without a person"
        print(f"\nserved again {time.monotonic() - stopped:.1f} s after SIGSTOP")
    finally:
        if is_running(old):
            os.killpg(old.pgid, signal.SIGCONT)
    new = service_record(home)
    assert new is not None and new.pid != old.pid and is_running(new)
    status = settle(home, lambda s: s.healing.restarts >= 1 and s.healing.state == "ok", 30)
    assert status is not None, current_status(home)
    assert "has not answered its health check" in status.healing.note or "restarted" in (
        status.healing.note
    )
    deadline = time.monotonic() + 30
    while is_running(old) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not is_running(old), "the hung backend was stopped"


def test_a_full_disk_keeps_the_model_answering_and_starts_no_cycle(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    with small_disk(tmp_path / "home", size_mb=64) as disk:
        if disk.kind != "tmpfs":
            pytest.skip("no tmpfs can be mounted here (it needs root): no real full disk")
        home = make_home(tmp_path / "home", demo_models)
        try:
            base = serve(home)
            plan = queue_plan(home)
            record = service_record(home)
            assert record is not None
            disk.fill(os.getpid())
            _top_up(Path(record.log_path))  # its last page full too: its next line has no room
            filled = time.monotonic()
            answers = [one_stream(base, max_tokens=8) for _ in range(3)]
            assert [a.done for a in answers] == [True] * 3, answers
            status = settle(home, lambda s: s.logging.state == "degraded", 10)
            assert status is not None and "is full" in status.logging.detail
            view = app.status(home)
            assert view.service is not None and view.service.healthy
            assert view.service.logging and view.service.logging.startswith("degraded since ")
            refused = app.propose(home, {"hypothesis": "h", "candidates": ["demo-tiny:kv8"]})
            assert not refused.accepted and "is full" in refused.message
            cycles = sorted(home.cycles.iterdir()) if home.cycles.is_dir() else []
            assert run_supervisor(home, timeout=120) == 7  # ExitCode.SYSTEM
            said = supervisor_log(home).read_text()
            assert "no cycle starts" in said and "is full" in said
            assert (sorted(home.cycles.iterdir()) if home.cycles.is_dir() else []) == cycles
            assert [p.name.endswith(f"-{plan}.json") for p in home.queued()] == [True]
            print(f"\n3 answers with the disk full, {time.monotonic() - filled:.1f} s")
            disk.free()
            assert settle(home, lambda s: s.logging.state == "ok", 10) is not None
            assert one_stream(base, max_tokens=2).done
            time.sleep(0.5)
            log = Path(record.log_path).read_text(errors="replace")
            assert "[mcp-infra log: " in log and "No space left on device]" in log
        finally:
            stop_home(home)
