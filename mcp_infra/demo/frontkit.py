"""Clients that probe the front: streamed chat clients in bulk, raw HTTP over a socket (for
what an HTTP library would refuse to send), slow and hostile clients; and the front's footprint
(memory and open files of its keeper and proxy). In the package (not in tests/) so
`benchmarks/faults.py` runs them from a plain install, as the front's tests do.

Everything goes to 127.0.0.1 or ::1 only, bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import psutil

from mcp_infra.procs.front import current_status, front_record
from mcp_infra.state.store import Home

CHAT = "/v1/chat/completions"


@dataclass
class StreamResult:
    status: int | None = None
    done: bool = False  # saw `data: [DONE]`
    error_event: str | None = None  # the `error` of a `data: {"error": ...}` event
    error: str | None = None  # transport failure: reset, refused, closed without an answer
    seconds: float = 0.0
    ttft_s: float | None = None
    done_s: float | None = None  # when `data: [DONE]` came (the server may close later)
    retry_after: str | None = None


def chat_body(max_tokens: int, stream: bool, content: str = "Tell me about harbours.") -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }


async def _one(client: httpx.AsyncClient, url: str, body: dict, timeout: float) -> StreamResult:
    result = StreamResult()
    start = time.monotonic()
    try:
        async with client.stream("POST", url, json=body, timeout=timeout) as resp:
            result.status = resp.status_code
            result.retry_after = resp.headers.get("retry-after")
            async for line in resp.aiter_lines():
                if result.ttft_s is None and line.startswith("data: "):
                    result.ttft_s = time.monotonic() - start
                if line.strip() == "data: [DONE]":
                    result.done = True
                    result.done_s = time.monotonic() - start
                elif line.startswith("data: {") and '"error"' in line[:20]:
                    result.error_event = str(json.loads(line[6:]).get("error"))[:200]
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.seconds = time.monotonic() - start
    return result


def streamed_clients(
    base: str, n: int, *, max_tokens: int = 4, timeout: float = 300.0
) -> list[StreamResult]:
    """``n`` streamed chat requests sent at once to ``base`` (http://127.0.0.1:PORT), each on
    its own connection; what each one saw."""

    async def run() -> list[StreamResult]:
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
            body = chat_body(max_tokens, True)
            return list(
                await asyncio.gather(*(_one(client, base + CHAT, body, timeout) for _ in range(n)))
            )

    return asyncio.run(run())


def one_stream(base: str, *, max_tokens: int = 4, timeout: float = 120.0) -> StreamResult:
    return streamed_clients(base, 1, max_tokens=max_tokens, timeout=timeout)[0]


class BackgroundStream(threading.Thread):
    """One long streamed chat request in a thread; ``started`` is set at its first event."""

    def __init__(self, base: str, *, max_tokens: int = 2000, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.url = base + CHAT
        self.body = chat_body(max_tokens, True)
        self.timeout = timeout
        self.started = threading.Event()
        self.result = StreamResult()

    def run(self) -> None:
        start = time.monotonic()
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=self.timeout) as resp:
                self.result.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: {") and '"error"' in line[:20]:
                        self.result.error_event = str(json.loads(line[6:]).get("error"))[:200]
                    elif line.strip() == "data: [DONE]":
                        self.result.done = True
                    elif line.startswith("data: "):
                        self.started.set()
        except httpx.HTTPError as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self.result.seconds = time.monotonic() - start
            self.started.set()


def served_again(base: str, timeout: float) -> float | None:
    """Seconds until a short streamed request completes through ``base`` (None: not within
    ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        left = timeout - (time.monotonic() - start)
        result = one_stream(base, max_tokens=2, timeout=max(1.0, left))
        if result.status == 200 and result.done:
            return time.monotonic() - start
        time.sleep(0.2)
    return None


def summary(results: list[StreamResult]) -> dict[str, float | int | None]:
    """Counts and latency percentiles (nearest rank) of a load run."""
    took = sorted(r.seconds for r in results)

    def pct(p: float) -> float | None:
        return round(took[min(len(took) - 1, int(p * len(took)))], 2) if took else None

    return {
        "clients": len(results),
        "complete": sum(r.status == 200 and r.done for r in results),
        "resets": sum(r.error is not None for r in results),
        "http_502": sum(r.status == 502 for r in results),
        "http_503": sum(r.status == 503 for r in results),
        "other_status": sum(r.status not in {None, 200, 502, 503} for r in results),
        "error_events": sum(r.error_event is not None for r in results),
        "p50_s": pct(0.50),
        "p99_s": pct(0.99),
        "max_s": round(took[-1], 2) if took else None,
        "mean_s": round(statistics.fmean(took), 2) if took else None,
    }


def raw(port: int, data: bytes, *, host: str = "127.0.0.1", timeout: float = 10.0) -> bytes:
    """Send bytes as they are, read until the front closes or ``timeout``; what came back."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect((host, port))
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def status_of(answer: bytes) -> int | None:
    """The status code of the first answer in ``answer`` (raw bytes), if there is one."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else None


def get(path: bytes, extra: bytes = b"") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"Connection: close\r\n\r\n"


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )


def slow_clients(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that send half a request line and then nothing (a slowloris)."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(sock)
    return socks


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Did the other side close ``sock`` within ``timeout``?"""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


@dataclass
class Footprint:
    """The front's two processes as the system sees them: the keeper (the stable port's
    sockets) and its proxy (the requests)."""

    keeper_pid: int
    proxy_pid: int
    rss_bytes: int  # resident memory, keeper + proxy
    open_files: int  # file descriptors, keeper + proxy
    fd_limit: int  # the proxy's soft open-files limit


def footprint(home: Home) -> Footprint | None:
    """The front's footprint now (None: no front, or it did not say which proxy serves)."""
    keeper, status = front_record(home), current_status(home)
    if keeper is None or status is None:
        return None
    try:
        procs = [psutil.Process(keeper.pid), psutil.Process(status.pid)]
        return Footprint(
            keeper_pid=keeper.pid,
            proxy_pid=status.pid,
            rss_bytes=sum(p.memory_info().rss for p in procs),
            open_files=sum(p.num_fds() for p in procs),
            fd_limit=procs[1].rlimit(psutil.RLIMIT_NOFILE)[0],
        )
    except psutil.Error:
        return None


class PeakMemory(threading.Thread):
    """The peak resident memory of the front (keeper + proxy, the pids of ``footprint`` when it
    starts) over a ``with`` block, sampled every ``every_s``; ``peak_bytes`` after it."""

    def __init__(self, home: Home, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        found = footprint(home)
        assert found is not None, "no front serves this home"
        self.procs = [psutil.Process(found.keeper_pid), psutil.Process(found.proxy_pid)]
        self.every_s = every_s
        self.peak_bytes = found.rss_bytes
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                rss = sum(p.memory_info().rss for p in self.procs)
            except psutil.Error:
                continue
            self.peak_bytes = max(self.peak_bytes, rss)

    def __enter__(self) -> PeakMemory:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join(5)


# Hostile inputs shared by the front's tests and benchmarks/faults.py -------------------------

POISON = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": 5}'
"""Valid JSON that kills mlx_lm.server 0.32.2's generation thread ("stop": a number): the
server still runs, answers later requests with an error and /health with 503."""

REFUSED_PATHS: list[tuple[bytes, int]] = [
    (b"/v1/../x", 400),
    (b"/v1/%2e%2e/%2e%2e/etc/passwd", 400),
    (b"/v1/models%00", 400),
    (b"/etc/passwd", 404),
    (b"/metrics", 404),
    (b"/v1/cache/reset", 404),
]
"""Request targets the front must refuse, with the status it answers."""

LEAK_WORDS = ("passwd", "/x ", "metrics", "cache/reset")
"""What a backend's log would show had one of ``REFUSED_PATHS`` reached it."""


def posts_logged(log_path: str) -> int:
    """Chat requests a backend logged (mlx_lm.server logs one line per request it answered)."""
    text = Path(log_path).read_text(errors="replace")
    return text.count('"POST /v1/chat/completions')


def huge_body(port: int, size: int = 200 * 2**20) -> tuple[int | None, int]:
    """A ``size`` body two ways: declared up front (the status answered before a byte of it
    went), then chunked without a length (how many bytes went before the front closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n"
        )
        declared = status_of(sock.recv(4096))
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n" % 2**20 + b"a" * 2**20 + b"\r\n"
        try:
            while sent < size:
                sock.sendall(chunk)
                sent += 2**20
        except OSError:
            pass
    return declared, sent
