"""The front's pure rules (paths, headers, CORS, token, bodies, self-healing), its status file,
and a fuzzer for its HTTP handling. Fast tier: no server process is started.

The fuzzer runs the real front (``procs.proxy.Front``, the code the front process runs) on an
event loop in a thread of this test, in front of a tiny backend made from the standard library's
``http.server``. That backend is a test double, and only here: the fast tier may not start an
mlx server, and what is checked is what the front lets through to a backend (paths, headers,
how often a request arrives), which a recording double shows exactly and an mlx server's log
would not. The same behaviour against real mlx_lm.server backends is in
tests/procs/test_front_limits.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import FrontConfig, FrontRoute, FrontStatus, HealState
from mcp_infra.core import frontrules as rules
from mcp_infra.demo.frontkit import get, post, raw, status_of
from mcp_infra.procs.front import route_path, status_path
from mcp_infra.procs.proxy import Front
from mcp_infra.procs.runtime import free_port
from mcp_infra.state.store import Home, write_model

NOW = datetime(2026, 12, 1, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "kind", "status"),
    [
        ("POST", b"/v1/chat/completions", "forward", 200),
        ("POST", b"/v1/completions?stream=1", "forward", 200),
        ("POST", b"/v1/embeddings", "forward", 200),
        ("POST", b"/v1/messages", "forward", 200),
        ("GET", b"/v1/models", "models", 200),
        ("GET", b"/v1/models/org/name", "forward", 200),
        ("GET", b"/health", "health", 200),
        ("OPTIONS", b"/v1/chat/completions", "preflight", 200),
        ("GET", b"/v1/chat/completions", "refuse", 405),
        ("POST", b"/health", "refuse", 405),
        ("DELETE", b"/v1/models", "refuse", 405),
        ("GET", b"/v1/../x", "refuse", 400),
        ("GET", b"/v1/./models", "refuse", 400),
        ("GET", b"/v1/%2e%2e/%2e%2e/etc/passwd", "refuse", 400),
        ("GET", b"/v1/%252e%252e/x", "refuse", 400),
        ("GET", b"/v1/models%00", "refuse", 400),
        ("GET", b"/v1/models/%00x", "refuse", 400),
        ("GET", b"/v1/models\\..\\x", "refuse", 400),
        ("GET", b"/v1/mod\xc3\xa9ls", "refuse", 400),
        ("GET", b"/v1/%c3%a9", "refuse", 400),
        ("GET", b"/v1/models#x", "refuse", 400),
        ("GET", b"http://evil/v1/models", "refuse", 400),
        ("GET", b"*", "refuse", 400),
        ("POST", b"/v1//chat/completions", "refuse", 404),
        ("POST", b"/v1/chat/completions/", "refuse", 404),
        ("POST", b"/v1/cache/reset", "refuse", 404),
        ("GET", b"/metrics", "refuse", 404),
        ("GET", b"/etc/passwd", "refuse", 404),
        ("GET", b"/v1/models/a/b/c", "refuse", 404),
        ("GET", b"/v1/models/..", "refuse", 400),
    ],
)
def test_paths_are_read_strictly(method: str, target: bytes, kind: str, status: int) -> None:
    found = rules.classify(method, target)
    assert (found.kind, found.status) == (kind, status), found


@given(st.sampled_from(["GET", "POST", "OPTIONS", "PUT"]), st.binary(max_size=80))
def test_a_forwarded_path_is_always_an_allowlisted_spelling(method: str, tail: bytes) -> None:
    found = rules.classify(method, b"/v1/" + tail)
    if found.kind == "forward":
        assert found.path in rules.FORWARD_POST or (
            found.path.startswith("/v1/models/")
            and rules.MODEL_ID.fullmatch(found.path[len("/v1/models/") :])
        )
        assert "/." not in found.path and "%" not in found.path and "\x00" not in found.path


# ---------------------------------------------------------------------------------------------
# headers, CORS, token, bodies
# ---------------------------------------------------------------------------------------------


def test_backend_cors_headers_never_reach_a_client_unless_allowed() -> None:
    backend = [
        ("Content-Type", "text/event-stream"),
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Allow-Methods", "*"),
        ("Connection", "close"),
        ("Server", "BaseHTTP/0.6"),
    ]
    assert rules.answer_headers(backend, "https://evil.example", []) == [
        ("Content-Type", "text/event-stream")
    ]
    allowed = rules.answer_headers(backend, "https://app.example", ["https://app.example"])
    assert ("access-control-allow-origin", "https://app.example") in allowed
    assert ("Access-Control-Allow-Origin", "*") not in allowed
    assert rules.cors_headers("https://evil.example", ["https://app.example"]) == []
    assert rules.cors_headers("https://x", ["*"]) == [("access-control-allow-origin", "*")]
    assert rules.preflight_headers("https://evil.example", []) == []


def test_request_headers_sent_upstream_carry_no_token_origin_or_framing() -> None:
    sent = rules.request_headers(
        [
            ("Authorization", "Bearer s3cret"),
            ("Origin", "https://evil.example"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "5"),
            ("Host", "x"),
            ("Content-Type", "application/json"),
        ]
    )
    assert sent == [("Content-Type", "application/json")]


def test_bearer_token() -> None:
    assert rules.authorized(None, None) and rules.authorized("Bearer x", None)
    assert rules.authorized("Bearer s3cret", "s3cret")
    assert not rules.authorized("Bearer s3cre", "s3cret")
    assert not rules.authorized("Basic s3cret", "s3cret") and not rules.authorized(None, "s")


def test_bodies_mlx_would_choke_on_are_named() -> None:
    assert rules.body_problem(b"\xff") == "the body is not UTF-8"
    assert rules.body_problem(b"[1]") == "the body must be a JSON object"
    assert (rules.body_problem(b"{") or "").startswith("the body is not JSON")
    assert rules.body_problem(b'{"messages": []}') is None


def test_an_event_stream_is_finished_only_by_done() -> None:
    assert rules.stream_finished(b'data: {"x": 1}\n\ndata: [DONE]\n\n')
    assert not rules.stream_finished(b'data: {"x": 1}\n\n')
    event = rules.error_event("gone")
    assert event.startswith(b"data: ") and json.loads(event[6:])["error"]["message"] == "gone"


# ---------------------------------------------------------------------------------------------
# self-healing rules
# ---------------------------------------------------------------------------------------------


def test_a_death_is_restarted_and_one_too_many_raises_needs_operator() -> None:
    cfg = FrontConfig(heal_max_restarts=2, heal_window_s=600)
    state = HealState()
    for i in range(2):
        state = rules.after_death(state, NOW + timedelta(seconds=i), cfg, "pid 1 exited")
        assert state.state == "restarting" and rules.attempt_due(state, NOW + timedelta(seconds=i))
        state = rules.after_attempt(
            state, "restarted", "restarted x", NOW + timedelta(seconds=i + 0.5), cfg
        )
        assert (state.state, state.restarts, state.restored_in_s) == ("ok", i + 1, 0.5)
    state = rules.after_death(state, NOW + timedelta(seconds=5), cfg, "pid 3 exited")
    assert state.state == "needs_operator" and "3 times" in state.note
    assert not rules.attempt_due(state, NOW + timedelta(days=1))
    assert rules.operator_cleared(state).state == "ok"


def test_deaths_outside_the_window_do_not_count() -> None:
    cfg = FrontConfig(heal_max_restarts=1, heal_window_s=60)
    state = rules.after_death(HealState(), NOW, cfg, "a")
    state = rules.after_attempt(state, "restarted", "ok", NOW, cfg)
    later = rules.after_death(state, NOW + timedelta(seconds=61), cfg, "b")
    assert later.state == "restarting" and len(later.recent_deaths) == 1 and later.deaths == 2


def test_failed_restarts_back_off_then_need_an_operator() -> None:
    cfg = FrontConfig(heal_max_failures=3)
    state = rules.after_death(HealState(), NOW, cfg, "x")
    state = rules.after_attempt(state, "failed", "no port", NOW, cfg)
    assert state.state == "backing_off" and state.next_attempt_at == NOW + timedelta(seconds=1)
    assert not rules.attempt_due(state, NOW) and rules.attempt_due(state, NOW + timedelta(1))
    state = rules.after_attempt(state, "failed", "no port", NOW, cfg)
    assert state.next_attempt_at == NOW + timedelta(seconds=2)
    assert rules.after_attempt(state, "busy", "switching", NOW, cfg).failures == 2
    state = rules.after_attempt(state, "failed", "no port", NOW, cfg)
    assert state.state == "needs_operator" and "3 restart attempts failed" in state.note
    assert [rules.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_no_restart_when_healing_is_off() -> None:
    state = rules.after_death(HealState(), NOW, FrontConfig(heal=False), "x")
    assert state.state == "off" and not rules.attempt_due(state, NOW)


# ---------------------------------------------------------------------------------------------
# the status file changes only when its content does
# ---------------------------------------------------------------------------------------------


def test_status_is_written_only_when_it_changed(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    front = Front(home, FrontConfig(heal=False), None, 1)
    front.write_status()
    path = status_path(home)
    first = path.stat().st_mtime_ns, path.read_bytes()
    time.sleep(0.01)
    for _ in range(3):
        front._dirty = True  # a probe that found nothing new marks the status dirty too
        front.write_status()
    assert (path.stat().st_mtime_ns, path.read_bytes()) == first
    front.count(served=1)
    front.write_status()
    assert FrontStatus.model_validate_json(path.read_text()).total.served == 1


# ---------------------------------------------------------------------------------------------
# a fuzzer for the front's HTTP handling
# ---------------------------------------------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """The test double backend: records what reached it; answers a stream, a JSON answer, or
    (for a body asking it) closes without answering, as mlx_lm.server does on a bad body."""

    seen: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self._answer(self.rfile.read(length))

    def _answer(self, body: bytes) -> None:
        Recorder.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if b"die-before-answer" in body:
            self.close_connection = True
            return
        payload = b'{"ok": true}' if self.path != "/health" else b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def front_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    home = Home(tmp_path_factory.mktemp("fuzz") / "home").ensure()
    url = f"http://127.0.0.1:{backend.server_address[1]}"
    write_model(
        route_path(home),
        FrontRoute(generation=1, mode="serve", backend_url=url, max_hold_s=2, updated_at=NOW),
    )
    port = free_port()
    cfg = FrontConfig(heal=False, ipv6=False, header_timeout_s=2, body_timeout_s=2)
    front = Front(home, cfg, "s3cret", port)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(front.run(signals=False),))
    thread.start()
    deadline = time.monotonic() + 10
    while status_of(_try(port, get(b"/health"))) != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    loop.call_soon_threadsafe(front.stopping.set)
    thread.join(15)
    backend.shutdown()


def _try(port: int, data: bytes) -> bytes:
    try:
        return raw(port, data, timeout=5)
    except OSError:
        return b""


AUTH = b"Authorization: Bearer s3cret\r\n"
METHODS = st.sampled_from([b"GET", b"POST", b"OPTIONS", b"PUT", b"HEAD", b"G\x00T", b""])
TARGETS = st.one_of(
    st.sampled_from(
        [b"/v1/chat/completions", b"/v1/models", b"/health", b"/v1/../x", b"/v1/%2e%2e/x", b"*"]
    ),
    st.binary(max_size=40).map(lambda b: b"/v1/" + b),
)
HEADERS = st.lists(
    st.sampled_from(
        [
            AUTH,
            b"Authorization: Bearer wrong\r\n",
            b"Content-Length: 4\r\n",
            b"Content-Length: 99999999999\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Origin: https://evil.example\r\n",
            b"Expect: 100-continue\r\n",
            b"X-Junk: \x00\x01\r\n",
            b"no colon\r\n",
            b"Host: a\r\nHost: b\r\n",
        ]
    ),
    max_size=4,
)
BODIES = st.one_of(
    st.sampled_from([b"", b"{}", b"\xff", b'{"die-before-answer": 1}', b"0\r\n\r\n"]),
    st.binary(max_size=64),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(METHODS, TARGETS, HEADERS, BODIES)
def test_fuzzed_requests_never_break_the_front_or_reach_a_backend_unchecked(
    front_port: int, method: bytes, target: bytes, headers: list[bytes], body: bytes
) -> None:
    Recorder.seen.clear()
    request = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(headers)
    answer = _try(front_port, request + b"Connection: close\r\n\r\n" + body)
    status = status_of(answer)
    assert answer == b"" or status is not None, answer[:200]  # an answer, or a closed connection
    # 501 is the parser's deliberate refusal of a transfer coding it does not take (RFC 9112
    # 6.1); 502 and 503 are the front's own answers for a backend; any other 5xx is a bug.
    assert status is None or status < 500 or status in {501, 502, 503}, answer[:300]
    assert b"access-control-allow-origin" not in answer.lower()
    for seen in Recorder.seen:
        assert seen["path"] in rules.FORWARD_POST | {"/health", "/v1/models"} or seen[
            "path"
        ].startswith("/v1/models/")
        assert "Authorization" not in seen["headers"] and "Origin" not in seen["headers"]
    if AUTH not in headers and Recorder.seen:
        assert {s["path"] for s in Recorder.seen} <= {"/health", "/v1/models"}  # probes only
    posts = [s for s in Recorder.seen if s["path"] == "/v1/chat/completions"]
    assert len(posts) <= 1, "a request is sent to a backend at most once"
    assert status_of(_try(front_port, get(b"/health"))) == 200, "the front still answers"


def test_a_request_that_reached_the_backend_is_not_sent_again(front_port: int) -> None:
    Recorder.seen.clear()
    answer = raw(front_port, post(b"/v1/chat/completions", b'{"die-before-answer": 1}', AUTH))
    assert status_of(answer) == 502
    assert [s["path"] for s in Recorder.seen if s["path"] != "/health"] == ["/v1/chat/completions"]


def test_a_slow_client_is_closed_after_the_header_time(front_port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", front_port), timeout=5)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    sock.settimeout(6)
    started = time.monotonic()
    assert sock.recv(100) == b""  # closed, with nothing sent upstream
    assert 1.5 <= time.monotonic() - started < 6
    sock.close()
