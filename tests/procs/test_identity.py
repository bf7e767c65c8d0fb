"""Process identity: a recorded pid is ours while it lives and started when recorded.

The clock-step case is reproduced by shifting the recorded start by the whole second that Linux's
integer boot time can move by (see ``mcp_infra.procs.identity``); CI once read two healthy
servers as dead that way."""

from __future__ import annotations

import subprocess
import sys

from mcp_infra.procs.identity import is_alive, same_start, start_time, started_by


def test_a_start_read_a_second_off_is_the_same_start_and_two_seconds_off_is_not() -> None:
    assert same_start(100.0, 100.0) and same_start(101.0, 100.0) and same_start(99.0, 100.0)
    assert not same_start(102.0, 100.0) and not same_start(98.0, 100.0)
    assert started_by(99.0, 100.0) and started_by(500.0, 100.0) and not started_by(98.0, 100.0)


def test_a_live_child_is_alive_under_a_boot_time_flip_and_dead_once_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        created = start_time(child.pid)
        assert created is not None
        assert is_alive(child.pid, created)
        assert is_alive(child.pid, created + 1.0) and is_alive(child.pid, created - 1.0)
        assert not is_alive(child.pid, created - 5.0)  # another process that had this pid
    finally:
        child.kill()
        child.wait()
    assert not is_alive(child.pid, created) and start_time(child.pid) is None
