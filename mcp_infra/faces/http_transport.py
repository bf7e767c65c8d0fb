"""Streamable HTTP for the MCP server, protected whatever the client does.

* Loopback by default (127.0.0.1). Every request's Host header must name an allowed host (else
  421) and an Origin header, when present, an allowed origin (else 403): a web page cannot reach
  the server through DNS rebinding.
* A bearer token is required on every request (else 401). It is read from a file: by default
  ``<home>/http-token``, generated on first use with 0600 permissions; or ``--token-file PATH``.
  A token file readable by group or others is refused. The token never appears on a command line
  or in a log: the server prints the file's path, not its content.
* Binding an address that is not loopback is refused unless a token file and the allowed Host
  names are given explicitly (``--token-file``, ``--allowed-host``).
* ``--auth none`` (for test suites such as the MCP conformance suite, which send no headers)
  drops the token check only: it is refused unless the bind address is loopback, printed as a
  warning at start, and the server is read-only unless a mode is given explicitly.
* The token is compared exactly (``Authorization: Bearer <token>``, one space, nothing around
  it); Host and Origin are compared case-insensitively (they are lower-cased for the SDK too).

The checks run in one ASGI guard in front of the SDK's app (which repeats the Host/Origin checks
with the same lists), comparing tokens with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
import socket
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_infra.errors import McpInfraError
from mcp_infra.state.store import Home

TOKEN_FILE = "http-token"
DEFAULT_PORT = 8765
MCP_PATH = "/mcp"
MIN_TOKEN = 32
LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


class HttpConfigError(McpInfraError, ValueError):
    """The HTTP settings are unsafe or unusable; the message says what to change."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_token_path(home: Home) -> Path:
    return home.root / TOKEN_FILE


def read_token(path: Path) -> str:
    """The token in ``path``; refused if the file is readable by group or others, or weak."""
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise HttpConfigError(f"token file {path} does not exist") from exc
    if not stat.S_ISREG(info.st_mode):
        raise HttpConfigError(f"token file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise HttpConfigError(
            f"token file {path} is readable by group or others: run `chmod 600 {path}`"
        )
    token = path.read_text(encoding="utf-8", errors="replace").strip()
    if len(token) < MIN_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
        raise HttpConfigError(
            f"token file {path} must hold one token of at least {MIN_TOKEN} "
            "printable characters without spaces"
        )
    return token


def ensure_token(path: Path) -> str:
    """Read the token file, creating it (0600, a 256-bit random token) if it does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return read_token(path)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
    return read_token(path)


def _host_allowed(host: str | None, allowed: Sequence[str]) -> bool:
    if not host:
        return False
    host = host.lower()  # host names are case-insensitive (RFC 3986 section 3.2.2)
    for pattern in (p.lower() for p in allowed):
        if pattern.endswith(":*"):
            base = pattern[:-2]
            if host == base or (host.startswith(base + ":") and host[len(base) + 1 :].isdigit()):
                return True
        elif host == pattern:
            return True
    return False


def _origin_allowed(origin: str, allowed: Sequence[str]) -> bool:
    return _host_allowed(origin, allowed)


class Guard:
    """ASGI middleware: Host (421), Origin (403), then bearer token (401), on every request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allowed_hosts: Sequence[str],
        allowed_origins: Sequence[str],
    ) -> None:
        """``token=None``: no token check (``--auth none``, loopback only)."""
        self.app = app
        self.token = token.encode() if token is not None else None
        self.allowed_hosts = list(allowed_hosts)
        self.allowed_origins = list(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        headers = Headers(scope=scope)
        if not _host_allowed(headers.get("host"), self.allowed_hosts):
            await PlainTextResponse("Invalid Host header", status_code=421)(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and not _origin_allowed(origin, self.allowed_origins):
            await PlainTextResponse("Invalid Origin header", status_code=403)(scope, receive, send)
            return
        if self.token is not None and not _bearer_matches(
            headers.get("authorization", ""), self.token
        ):
            await PlainTextResponse(
                "A bearer token is required (Authorization: Bearer <token from the server's "
                "token file>)",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="mcp-infra"'},
            )(scope, receive, send)
            return
        await self.app(_lower_host(scope), receive, send)


def _bearer_matches(header: str, token: bytes) -> bool:
    """``Bearer <token>`` exactly: the scheme in any case (RFC 7235), one space, the token with
    nothing before or after it."""
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.encode("utf-8", errors="replace"), token
    )


def _lower_host(scope: Scope) -> Scope:
    """The same request with Host and Origin lower-cased (the SDK compares them exactly)."""
    headers = [(k, v.lower() if k in (b"host", b"origin") else v) for k, v in scope["headers"]]
    return {**scope, "headers": headers}


class HttpPlan:
    """Validated HTTP settings: where to bind, which hosts and origins, which token file."""

    def __init__(
        self,
        home: Home,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token_file: str | Path | None = None,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        auth: str = "token",
    ) -> None:
        if not 1 <= port <= 65535:
            raise HttpConfigError("--port must be between 1 and 65535")
        if auth not in ("token", "none"):
            raise HttpConfigError("--auth must be token or none")
        self.host, self.port, self.auth = host, port, auth
        loopback = is_loopback(host)
        if auth == "none" and not loopback:
            raise HttpConfigError(
                f"refusing --auth none on {host}, which is not a loopback "
                "address: without a token anyone who can reach it could call "
                "the server"
            )
        if not loopback and (token_file is None or not allowed_hosts):
            raise HttpConfigError(
                f"refusing to bind {host}, which is not a loopback address, without both "
                "--token-file PATH (the bearer token clients must send) and --allowed-host "
                "NAME[:PORT] (the Host names clients use; repeat the option for several)"
            )
        self.token_file = Path(token_file).expanduser() if token_file else default_token_path(home)
        self.allowed_hosts = ([*LOOPBACK_HOSTS] if loopback else []) + [
            h if re.search(r":(\d+|\*)$", h) else f"{h}:*" for h in allowed_hosts
        ]
        self.allowed_origins = ([*LOOPBACK_ORIGINS] if loopback else []) + list(allowed_origins)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{MCP_PATH}"

    def app(self, server: MCPServer) -> Guard:
        token = ensure_token(self.token_file) if self.auth == "token" else None
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=self.allowed_hosts,
            allowed_origins=self.allowed_origins,
        )
        inner = server.streamable_http_app(
            streamable_http_path=MCP_PATH, host=self.host, transport_security=security
        )
        return Guard(
            inner,
            token=token,
            allowed_hosts=self.allowed_hosts,
            allowed_origins=self.allowed_origins,
        )


def serve_http(server: MCPServer, plan: HttpPlan, mode: str) -> None:
    """Run the server over streamable HTTP until interrupted (uvicorn, no access log)."""
    import uvicorn

    sock = bind(plan.host, plan.port)  # before any message: a taken port is one clear error
    app = plan.app(server)
    if plan.auth == "none":
        print(
            f"mcp-infra: WARNING: --auth none: MCP (streamable HTTP, mode {mode}) at {plan.url} "
            "WITHOUT a bearer token; any local process can call it (loopback only)",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(
            f"mcp-infra: MCP (streamable HTTP, mode {mode}) at {plan.url}; every request needs "
            f"'Authorization: Bearer <token>' with the token in {plan.token_file}",
            file=sys.stderr,
            flush=True,
        )
    config = uvicorn.Config(
        app,
        host=plan.host,
        port=plan.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a port held by another process raises ``PortBusy``."""
    from mcp_infra.procs.runtime import PortBusy

    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise PortBusy(
            f"serve: cannot listen on {host}:{port}: {exc.strerror or exc} (another process "
            "holds the port? choose one with --port)"
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def client(url: str, token: str, **kwargs: Any) -> Any:
    """An MCP client for this server over HTTP, sending the bearer token."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http), **kwargs)
