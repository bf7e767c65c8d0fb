"""Logs that never stop the service (``procs.logpipe``): a size-capped, rotated file that drops
and counts what it cannot write, and the relay process that writes it for a server.

Fast tier: the sink in this process, and the relay run as ``python -c`` (not ``-m mcp_infra``,
which the fast tier keeps for the slow one) under a real file-size limit set with prlimit, then
lifted: its writes fail as on a full disk and succeed again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mcp_infra.procs.logpipe import Sink, room_problem, settled


def test_a_log_is_capped_and_rotated(tmp_path: Path) -> None:
    sink = Sink(tmp_path / "x.log", max_bytes=100, keep=2)
    for index in range(7):
        sink.write(f"{index}".encode() * 59 + b"\n")
    sink.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["x.log", "x.log.1", "x.log.2"]
    assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())
    assert (tmp_path / "x.log").read_bytes().startswith(b"6")
    assert (tmp_path / "x.log.2").read_bytes().startswith(b"4"), "older ones are gone"


def test_a_write_that_fails_is_dropped_counted_and_said_later(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    sink = Sink(folder / "x.log")
    sink.write(b"before\n")
    sink.close()
    shutil.rmtree(folder)  # the file and its folder gone: every write fails
    sink.write(b"lost one\n")
    sink.write(b"lost two\n")
    assert (sink.dropped_writes, sink.dropped_bytes) == (2, 18)
    folder.mkdir()
    sink.write(b"after\n")
    sink.close()
    text = (folder / "x.log").read_text()
    assert text.startswith("[mcp-infra log: 18 bytes in 2 writes dropped from ")
    assert text.endswith("No such file or directory]\nafter\n")
    assert sink.dropped_writes == 0


def test_the_relay_drops_past_a_file_size_limit_and_never_blocks_its_writer(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    code = "import sys; from mcp_infra.procs.logpipe import main; sys.exit(main(sys.argv[1:]))"
    relay = subprocess.Popen(
        [sys.executable, "-c", code, "--path", str(log)], stdin=subprocess.PIPE
    )
    assert relay.stdin is not None
    proc = psutil.Process(relay.pid)
    soft, hard = proc.rlimit(psutil.RLIMIT_FSIZE)
    proc.rlimit(psutil.RLIMIT_FSIZE, (64, hard))  # writes past 64 bytes fail (EFBIG)
    started = time.monotonic()
    for _ in range(200):  # 2 MB: far more than a pipe holds, so a blocked relay would block us
        relay.stdin.write(b"x" * 10_000)
        relay.stdin.flush()
    assert time.monotonic() - started < 30
    time.sleep(1.0)  # the relay empties the pipe
    proc.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))
    relay.stdin.write(b"\nafter the limit\n")
    relay.stdin.close()
    assert relay.wait(10) == 0
    settled(log)
    text = log.read_text()
    assert text.startswith("x" * 64), "what fitted was written"
    assert "bytes in " in text and "writes dropped from" in text and "File too large]" in text
    assert text.endswith("after the limit\n")
    dropped = int(text.split("[mcp-infra log: ")[1].split(" bytes")[0])
    assert dropped + text.count("x") == 2_000_000, "every byte written or counted"


def test_room_problem_names_a_full_disk(tmp_path: Path) -> None:
    assert room_problem(tmp_path, need=1) is None
    problem = room_problem(tmp_path, need=1 << 62)
    assert problem is not None and "is full" in problem and str(tmp_path) in problem
