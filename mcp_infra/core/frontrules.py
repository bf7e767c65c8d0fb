"""Pure rules of the front: which requests it forwards and how their path is read, what a
backend's answer headers may tell a client, who may read answers from a web page, and what to do
about a live backend that died. No I/O: ``procs/proxy.py`` calls these with what it saw.

Paths are read strictly, never repaired: one percent-decoding, then an exact match against the
OpenAI-compatible paths the runtimes serve. A dot segment, a NUL or control byte, a backslash, a
second layer of percent-encoding or a non-ASCII byte is refused, so the path a backend receives is
always one of the allowlisted strings, spelled by the front, not the client's bytes.
"""

from __future__ import annotations

import hmac
import json
import re
from datetime import datetime, timedelta
from typing import Literal, NamedTuple
from urllib.parse import unquote_to_bytes

from mcp_infra.contracts import FrontConfig, HealState

# POST endpoints mlx_lm.server and mlx_vlm.server serve under /v1 that clients use (text, chat,
# responses, embeddings, Anthropic messages); their admin routes (cache reset, metrics) are not.
FORWARD_POST = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/messages/count_tokens",
    }
)
MODELS = "/v1/models"
HEALTH = "/health"
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._\-]{0,127})?")
ALLOWED_METHODS = "GET, POST, OPTIONS"
PRINTABLE = re.compile(rb"[\x21-\x7e]+")

Kind = Literal["forward", "health", "models", "preflight", "refuse"]


class Target(NamedTuple):
    """What the front does with a request line. ``path`` is what goes upstream (``forward``)."""

    kind: Kind
    path: str = ""
    status: int = 200
    reason: str = ""


def _refuse(status: int, reason: str) -> Target:
    return Target("refuse", status=status, reason=reason)


def classify(method: str, raw_target: bytes) -> Target:
    """Read a request's method and target (the bytes of its request line). The query string is
    never forwarded: none of the forwarded endpoints takes one."""
    if not raw_target.startswith(b"/"):
        return _refuse(400, "the request target must be a path")
    if not PRINTABLE.fullmatch(raw_target) or b"#" in raw_target or b"\\" in raw_target:
        return _refuse(400, "the request target holds a byte a path may not hold")
    raw_path = raw_target.split(b"?", 1)[0]
    decoded = unquote_to_bytes(raw_path)
    if not PRINTABLE.fullmatch(decoded) or b"\\" in decoded:
        return _refuse(400, "the path decodes to a byte a path may not hold")
    if b"%" in decoded:
        return _refuse(400, "the path is percent-encoded twice")
    path = decoded.decode("ascii")
    segments = path.split("/")[1:]
    if any(s in {".", ".."} for s in segments):
        return _refuse(400, "the path has a dot segment")
    if path == HEALTH:
        return Target("health", HEALTH) if method == "GET" else _refuse(405, "use GET")
    if path in FORWARD_POST:
        if method == "POST":
            return Target("forward", path)
        return Target("preflight", path) if method == "OPTIONS" else _refuse(405, "use POST")
    if path == MODELS or (path.startswith(MODELS + "/") and MODEL_ID.fullmatch(path[11:])):
        if method == "GET":
            return Target("models" if path == MODELS else "forward", path)
        return Target("preflight", path) if method == "OPTIONS" else _refuse(405, "use GET")
    return _refuse(404, "not an endpoint of this service")


# request and answer headers -------------------------------------------------------------------

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)
# Never sent upstream: the token is the front's business, and a backend's own CORS logic must
# not see the origin it would echo back.
DROP_FROM_REQUEST = HOP_BY_HOP | {"authorization", "origin", "cookie"}
DROP_FROM_ANSWER = HOP_BY_HOP | {"date", "server", "set-cookie"}


def request_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in DROP_FROM_REQUEST]


def answer_headers(
    headers: list[tuple[str, str]], origin: str | None, allow_origins: list[str]
) -> list[tuple[str, str]]:
    """A backend's answer headers as the client may see them: hop-by-hop and every CORS header
    the backend sent dropped (mlx_lm.server sends ``Access-Control-Allow-Origin: *``), then the
    front's own CORS answer, only for an allowed origin."""
    kept = [
        (k, v)
        for k, v in headers
        if k.lower() not in DROP_FROM_ANSWER and not k.lower().startswith("access-control-")
    ]
    return kept + cors_headers(origin, allow_origins)


def cors_headers(origin: str | None, allow_origins: list[str]) -> list[tuple[str, str]]:
    if not origin or not allow_origins:
        return []
    if "*" in allow_origins:
        return [("access-control-allow-origin", "*")]
    if origin in allow_origins:
        return [("access-control-allow-origin", origin), ("vary", "Origin")]
    return []


def preflight_headers(origin: str | None, allow_origins: list[str]) -> list[tuple[str, str]]:
    allowed = cors_headers(origin, allow_origins)
    if not allowed:
        return []
    return allowed + [
        ("access-control-allow-methods", ALLOWED_METHODS),
        ("access-control-allow-headers", "Authorization, Content-Type"),
        ("access-control-max-age", "600"),
    ]


def authorized(header: str | None, token: str | None) -> bool:
    """No token configured: everyone on loopback. Else ``Authorization: Bearer <token>``,
    compared in constant time."""
    if token is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def body_problem(body: bytes) -> str | None:
    """Why a JSON body would be refused, or None. mlx_lm.server's handler dies on a body that is
    not UTF-8 (no answer at all), so the front answers 400 before any backend sees it."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    except ValueError as exc:
        return f"the body is not JSON: {str(exc)[:120]}"
    return None if isinstance(data, dict) else "the body must be a JSON object"


SSE_DONE = b"data: [DONE]"


def stream_finished(tail: bytes) -> bool:
    """Did an event stream end as OpenAI-compatible streams end? (``tail``: its last bytes)"""
    return SSE_DONE in tail


def error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return f"data: {json.dumps(body)}\n\n".encode()


# self-healing ---------------------------------------------------------------------------------

HealOutcome = Literal["restarted", "nothing", "busy", "failed"]


def _note(current: HealState, **changes: object) -> HealState:
    return current.model_copy(update=changes)


def after_death(state: HealState, now: datetime, cfg: FrontConfig, detail: str) -> HealState:
    """The live backend was seen dead (or sick): restart it now, or, if it stopped serving more
    often than the window allows, hand it to a person."""
    recent = [t for t in state.recent_deaths if now - t < timedelta(seconds=cfg.heal_window_s)]
    recent.append(now)
    base = {"deaths": state.deaths + 1, "recent_deaths": recent, "last_death_at": now}
    if not cfg.heal:
        return _note(
            state,
            state="off",
            note=f"the live backend stopped serving ({detail}); restarting is off",
            **base,
        )
    if len(recent) > cfg.heal_max_restarts:
        return _note(
            state,
            state="needs_operator",
            next_attempt_at=None,
            note=f"the live backend stopped serving {len(recent)} times within "
            f"{cfg.heal_window_s:.0f} s (last: {detail}); not restarted again: an operator "
            "must look",
            **base,
        )
    return _note(
        state,
        state="restarting",
        failures=0,
        next_attempt_at=now,
        note=f"the live backend stopped serving ({detail}); restarting it",
        **base,
    )


def backoff_s(failures: int) -> float:
    """1, 2, 4, 8, 16, then 30 s between restart attempts that failed."""
    return float(min(30, 2 ** max(0, failures - 1)))


def after_attempt(
    state: HealState, outcome: HealOutcome, message: str, now: datetime, cfg: FrontConfig
) -> HealState:
    """What one restart attempt (the heal process's answer) changes."""
    if outcome == "restarted":
        took = (now - state.last_death_at).total_seconds() if state.last_death_at else None
        return _note(
            state,
            state="ok",
            restarts=state.restarts + 1,
            failures=0,
            last_restart_at=now,
            restored_in_s=round(took, 1) if took is not None else None,
            next_attempt_at=None,
            note=f"{message} ({took:.1f} s after it stopped serving)"
            if took is not None
            else message,
        )
    if outcome == "nothing":
        return _note(state, state="ok", failures=0, next_attempt_at=None, note=message)
    if outcome == "busy":  # a switch or another restart holds the service: ask again soon
        return _note(
            state, state="waiting", next_attempt_at=now + timedelta(seconds=1.0), note=message
        )
    failures = state.failures + 1
    if failures >= cfg.heal_max_failures:
        return _note(
            state,
            state="needs_operator",
            failures=failures,
            next_attempt_at=None,
            note=f"{failures} restart attempts failed in a row; an operator must look: {message}",
        )
    wait = backoff_s(failures)
    return _note(
        state,
        state="backing_off",
        failures=failures,
        next_attempt_at=now + timedelta(seconds=wait),
        note=f"restart attempt {failures} failed ({message}); next in {wait:.0f} s",
    )


def attempt_due(state: HealState, now: datetime) -> bool:
    return (
        state.state in {"restarting", "backing_off", "waiting"}
        and state.next_attempt_at is not None
        and now >= state.next_attempt_at
    )


def operator_cleared(state: HealState) -> HealState:
    """A person cleared needs-operator: start counting again."""
    return _note(state, state="ok", recent_deaths=[], failures=0, note="needs-operator cleared")
