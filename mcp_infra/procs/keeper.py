"""``python -m mcp_infra.procs.keeper --home DIR --port PORT``: the process that holds the stable
port, and watches the proxy that serves it.

It binds the stable port (127.0.0.1, and [::1] unless ``front.ipv6`` is off), runs the proxy
(``python -m mcp_infra.procs.proxy``) as its child on those sockets, and does nothing else: no
request is read in it, so nothing a client sends can stop it, and it outlives every cycle. The
proxy's event loop writes a byte on a pipe every ``proxy.BEAT_EVERY_S``; a proxy that misses
its heartbeat for ``HEARTBEAT_S`` (a stuck event loop, a SIGSTOP) is killed and replaced on the
same sockets, and so is one that exits. Clients that connect meanwhile wait in the kernel's
listen queue: none is refused. nginx's master process and gunicorn's arbiter keep their
listening socket the same way, and systemd's ``WatchdogSec`` restarts a service that stops
answering, not only one that exits.

A replacement resumes the counters and healing of the last status its predecessor wrote and
says how often the proxy was replaced and why (``FrontStatus.watchdog``). ``state/front.json``
records the keeper; the proxy's pid is in the front's status. Both write their output into one
log relay (``procs.logpipe``), started by ``front.ensure_front``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from mcp_infra.contracts import FrontConfig
from mcp_infra.procs.front import PortTaken, bind_stable_port, front_token, raise_fd_limit
from mcp_infra.state.context import load_config
from mcp_infra.state.store import CorruptFile, Home, utcnow

HEARTBEAT_S = 5.0  # a proxy silent this long is replaced
FIRST_BEAT_S = 60.0  # a new proxy's first beat (its imports, on a loaded machine)
STOP_S = 10.0  # a proxy's own shutdown lets requests in flight finish within 5 s
QUICK_S = 10.0  # a proxy replaced within this of its start counts towards the backoff
BACKOFF_MAX_S = 5.0


def say(message: str) -> None:
    """A line in the front's log; never raises."""
    with contextlib.suppress(Exception):
        print(f"{utcnow():%Y-%m-%d %H:%M:%S} keeper: {message}", file=sys.stderr, flush=True)


@dataclass
class Keeper:
    """The keeper's state: the sockets it holds, its signal pipe, and what it replaced."""

    home: Home
    port: int
    sockets: list[socket.socket]
    wake: int  # the read end of the signal wake-up pipe
    stop: list[int] = field(default_factory=list)  # signals that asked the keeper to stop
    replaced: int = 0
    why: str = ""

    def spawn(self) -> tuple[subprocess.Popen[bytes], int]:
        """The proxy on the held sockets (argv, no shell), in the keeper's process group, with
        the write end of its heartbeat pipe; returns it and the read end."""
        beat_read, beat_write = os.pipe()
        fds = [s.fileno() for s in self.sockets]
        argv = [sys.executable, "-m", "mcp_infra.procs.proxy", "--home", str(self.home.root)]
        argv += ["--port", str(self.port), "--heartbeat-fd", str(beat_write)]
        for fd in fds:
            argv += ["--listen-fd", str(fd)]
        if self.replaced:
            argv += ["--replaced", str(self.replaced), "--why", self.why[:300]]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(beat_write, *fds))
        except BaseException:
            os.close(beat_read)
            raise
        finally:
            os.close(beat_write)
        return proc, beat_read

    def watch(self, proc: subprocess.Popen[bytes], beat: int) -> str:
        """Wait until the proxy misses its heartbeat or exits (why, for the log and the status),
        or the keeper is asked to stop ("")."""
        silent_for = FIRST_BEAT_S
        deadline = time.monotonic() + silent_for
        while not self.stop:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the proxy (pid {proc.pid}) missed its heartbeat for {silent_for:.0f} s"
            ready, _, _ = select.select([beat, self.wake], [], [], left)
            if self.wake in ready:
                with contextlib.suppress(OSError):
                    os.read(self.wake, 512)
            if beat not in ready:
                continue
            if not os.read(beat, 4096):  # the write end closed: the proxy is gone
                try:
                    code = proc.wait(timeout=STOP_S)
                except subprocess.TimeoutExpired:
                    return f"the proxy (pid {proc.pid}) closed its heartbeat"
                return f"the proxy (pid {proc.pid}) exited ({code})"
            silent_for = HEARTBEAT_S
            deadline = time.monotonic() + silent_for
        return ""

    def end(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop the proxy: asked first (its requests in flight finish), then killed."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)  # a stopped proxy must run to hear it
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def run(self) -> int:
        quick = 0
        while True:
            started = time.monotonic()
            proc, beat = self.spawn()
            try:
                why = self.watch(proc, beat)
            finally:
                os.close(beat)
            if self.stop:
                self.end(proc)
                return 0
            proc.kill()  # SIGKILL reaches a stopped process too
            proc.wait()
            if proc.returncode == 2:
                say("the proxy refuses to serve with this configuration (see above); stopping")
                return 2
            self.replaced += 1
            self.why = f"{why} at {utcnow():%Y-%m-%d %H:%M:%S} UTC"
            say(f"{why}; replacing it (replacement {self.replaced})")
            quick = quick + 1 if time.monotonic() - started < QUICK_S else 0
            if quick:  # a proxy that keeps dying at once: back off, interruptibly
                select.select([self.wake], [], [], min(0.1 * 2**quick, BACKOFF_MAX_S))
            if self.stop:
                return 0


def _front_config(home: Home) -> FrontConfig:
    try:
        return load_config(home).front
    except (FileNotFoundError, CorruptFile) as exc:
        say(f"config not readable ({exc}); the front runs with default limits")
        return FrontConfig()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_infra.procs.keeper")
    parser.add_argument("--home", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    home = Home(args.home)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past a file-size limit a write fails
    cfg = _front_config(home)
    try:
        front_token(home, cfg)
    except (OSError, ValueError) as exc:
        say(f"the configured token cannot be read ({exc}); refusing to serve without it")
        return 2
    # a connection is one descriptor, a request in flight one more: room for both, and spare
    raise_fd_limit(2 * cfg.max_connections + 256)
    try:
        sockets = bind_stable_port(args.port, cfg.ipv6, say)
    except PortTaken as exc:
        say(str(exc))
        return 3
    wake, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    keeper = Keeper(home, args.port, sockets, wake)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: keeper.stop.append(signum))
    return keeper.run()


if __name__ == "__main__":
    raise SystemExit(main())
