"""Logs that never stop the service: every process the product starts writes into a pipe.

``spawn_logged`` starts a process with its stdout and stderr on a pipe whose reader is a log
relay, ``python -m mcp_infra.procs.logpipe``: a small process (standard library only) that
writes what it reads into a size-capped file, rotated into ``.1`` ... ``.<keep>``. A write
that fails (a full disk, a file-size limit, an I/O error) is dropped and counted, and the count
is written into the log, with the error and the time span, once a write succeeds again. The
writer never waits on the disk and never sees a failed write: mlx_lm.server writes a log line
before each answer and answers nothing when that write fails, so a backend writing into a file
of its own stops serving when the disk fills.

One relay per process, for exactly that process's lifetime: it ends when the pipe closes (the
process and everything that inherited its output are gone) and ignores SIGTERM, SIGINT and
SIGHUP, so stopping a server's process group never leaves the server writing into a pipe
without a reader. A relay needs no record: nothing has to find it. Why one per process and not
one shared reader (the front, say): a backend outlives a restart of the front, and a pipe
whose reader restarted cannot be handed back to the writer (docs/service.md).

``room_problem`` is the one rule for "the home's disk is full": the front reports logging as
degraded by it, and no cycle starts while it holds.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

LOG_MAX_BYTES = 4 << 20  # one log file, before it is rotated
LOG_KEEP = 2  # rotated files kept beside it: at most 12 MiB for one log
LOG_ROOM_BYTES = 1 << 20  # below this the home's disk is full: logging is degraded
CYCLE_ROOM_BYTES = 16 << 20  # a cycle's journal, run files and bundle take a few MiB
READ_CHUNK = 65_536
SETTLE_S = 2.0  # how long a reader waits for the relay of a process that ended to finish


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")


class Sink:
    """A size-capped, rotated log file that drops what it cannot write and counts it."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.fd: int | None = None
        self.size = 0
        self.dropped_bytes = 0
        self.dropped_writes = 0
        self.dropped_since: str | None = None
        self.last_error = ""

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):  # readers wait on it for a finished log (``settled``)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.size = os.fstat(fd).st_size
        self.fd = fd
        return fd

    def _rotate(self) -> None:
        self.close()
        for index in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index - 1}") if index > 1 else self.path
            with contextlib.suppress(FileNotFoundError):
                os.replace(older, self.path.with_name(f"{self.path.name}.{index}"))
        if self.keep == 0:
            self.path.unlink(missing_ok=True)

    def _put(self, data: bytes) -> None:
        """Write all of ``data``; ``size`` counts what was written, also when an error stops
        it part way."""
        fd = self.fd if self.fd is not None else self._open()
        view = memoryview(data)
        while view:
            done = os.write(fd, view)
            self.size += done
            view = view[done:]

    def write(self, data: bytes) -> None:
        """Write ``data`` (after the note of what was dropped before, if anything was), or
        drop it and count it. Never raises."""
        if not data and not self.dropped_writes:
            return
        try:
            if self.size and self.size + len(data) > self.max_bytes:
                self._rotate()
            if self.dropped_writes:
                self._put(self._note())
                self.dropped_bytes = self.dropped_writes = 0
                self.dropped_since = None
        except OSError as exc:
            self._dropped(len(data), exc)
            return
        before = self.size
        try:
            self._put(data)
        except OSError as exc:
            self._dropped(len(data) - (self.size - before), exc)

    def _dropped(self, size: int, exc: OSError) -> None:
        self.dropped_bytes += size
        self.dropped_writes += 1
        self.dropped_since = self.dropped_since or _now()
        self.last_error = exc.strerror or type(exc).__name__
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            self.close()  # a file removed or a folder gone: opened anew next time

    def _note(self) -> bytes:
        return (
            f"[mcp-infra log: {self.dropped_bytes} bytes in {self.dropped_writes} writes dropped "
            f"from {self.dropped_since} to {_now()} UTC: {self.last_error}]\n"
        ).encode()

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def relay(source: int, sink: Sink) -> None:
    """Copy ``source`` into ``sink`` until the pipe closes."""
    while True:
        try:
            data = os.read(source, READ_CHUNK)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        sink.write(data)
    if sink.dropped_writes:  # a last attempt to say what was lost
        sink.write(b"")
    sink.close()


def spawn_logged(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (a list, never a shell) in its own session with its stdout and stderr on
    a pipe read by a log relay writing ``log``."""
    from mcp_infra.state.store import private_dir  # here: the relay imports the stdlib only

    private_dir(log.parent)
    # The log is there from the start, locked before the process runs: the relay inherits the
    # lock (``--hold-fd``), so a reader waiting on it (``settled``) never reads a process that
    # ended before its relay had started as a finished, empty log.
    # A full disk may refuse the file: the process starts all the same (the relay drops and
    # counts what it cannot write).
    hold = None
    with contextlib.suppress(OSError):
        hold = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fcntl.flock(hold, fcntl.LOCK_EX | fcntl.LOCK_NB)
    held = [] if hold is None else ["--hold-fd", str(hold)]
    read_end, write_end = os.pipe()
    try:
        subprocess.Popen(
            [sys.executable, "-m", "mcp_infra.procs.logpipe", "--path", str(log), *held],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            pass_fds=() if hold is None else (hold,),
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        if hold is not None:
            os.close(hold)
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            pass_fds=tuple(pass_fds),
        )
    finally:
        os.close(write_end)  # the relay ends once every writer has gone


def settled(path: str | Path, timeout: float = SETTLE_S) -> None:
    """Wait (bounded) until no relay still writes ``path``: the log of a process that ended is
    then complete."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.02)
            except OSError:
                return
    finally:
        os.close(fd)


def room_problem(folder: Path, need: int = LOG_ROOM_BYTES) -> str | None:
    """Why ``folder``'s disk has no room for ``need`` bytes, or None when it has."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return f"the disk under {folder} cannot be read: {exc.strerror or exc}"
    if free >= need:
        return None
    return f"the disk under {folder} is full ({free} bytes free, {need} needed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_infra.procs.logpipe")
    parser.add_argument("--path", required=True)
    parser.add_argument("--max-bytes", type=int, default=LOG_MAX_BYTES)
    parser.add_argument("--keep", type=int, default=LOG_KEEP)
    parser.add_argument("--hold-fd", type=int, help="the log's lock taken for this relay")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the end of the pipe ends a relay
    relay(sys.stdin.fileno(), Sink(Path(args.path), args.max_bytes, args.keep))
    if args.hold_fd is not None:  # the log is complete: readers may go on
        with contextlib.suppress(OSError):
            os.close(args.hold_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
