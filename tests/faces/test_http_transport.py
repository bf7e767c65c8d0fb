"""`mcp-infra serve --transport http` as a real subprocess: Host/Origin checks (421/403), the
bearer token on every request (401), the token file (generated 0600, or given), refusal to bind a
non-loopback address without a token file and allowed hosts, and real MCP clients of both eras.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from mcp_infra.faces.http_transport import HttpConfigError, HttpPlan, client, read_token
from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import HEADERS, PLAN, HttpServer, audit, child_env, serve_argv


@pytest.fixture
def http_server(home: Home) -> Iterator[HttpServer]:
    server = HttpServer(home)
    yield server
    server.stop()


def test_requests_are_checked_before_anything_else(home: Home, http_server: HttpServer) -> None:
    token_file = home.root / "http-token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = read_token(token_file)
    bearer = f"Bearer {token}"

    assert http_server.post().status_code == 401
    assert http_server.post(Authorization="Bearer wrong-token").status_code == 401
    assert http_server.post(Authorization=token).status_code == 401  # no scheme
    unauthorized = http_server.post()
    assert unauthorized.headers["www-authenticate"].startswith("Bearer")
    assert token not in unauthorized.text
    assert http_server.post(Authorization=bearer, Host="evil.example:80").status_code == 421
    assert http_server.post(Host="evil.example").status_code == 421  # before the token check
    assert http_server.post(Authorization=bearer, Origin="http://evil.example").status_code == 403
    assert (
        http_server.post(
            Authorization=bearer,
            Host=f"localhost:{http_server.port}",
            Origin=f"http://localhost:{http_server.port}",
        ).status_code
        == 200
    )
    other_path = httpx2.get(f"http://127.0.0.1:{http_server.port}/", timeout=10)
    assert other_path.status_code == 401, "every path needs the token"

    ok = http_server.post(Authorization=bearer)
    assert ok.status_code == 200 and "mcp-infra" in ok.text

    log = http_server.stop()
    assert token not in log, "the token never appears in a log"
    assert str(token_file) in log, "the server says where the token is"
    assert all(token not in part for part in http_server.argv)


@pytest.mark.anyio
@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_mcp_clients_over_http(
    home: Home, http_server: HttpServer, anyio_backend: str, era: str
) -> None:
    token = read_token(home.root / "http-token")
    async with client(http_server.url, token, mode=era) as mcp:
        tools = {t.name for t in (await mcp.list_tools()).tools}
        assert tools == {"status", "registry", "evidence", "propose_plan"}
        status = await mcp.call_tool("status", {})
        assert status.structured_content["server_mode"] == "propose"
        assert status.structured_content["service"]["active_recipe"] == "demo-tiny:target"
        registry = await mcp.call_tool("registry", {"candidate_id": "demo-tiny:draft-k4"})
        assert registry.structured_content["candidates"][0]["preflight_passed"] is True
        dry = await mcp.call_tool("propose_plan", {"plan": PLAN, "dry_run": True})
        assert dry.structured_content["accepted"] is True
        extra = await mcp.call_tool("propose_plan", {"plan": PLAN, "sudo": True})
        assert extra.is_error and "unknown argument(s): sudo" in extra.content[0].text
    assert not home.queued()
    assert [r.accepted for r in audit(home)] == [True, False]

    # A wrong token: the server answers 401 (the request as the client sends it), and the SDK
    # client fails with the server's error response rather than getting an answer.
    wrong = "x" * 43
    assert http_server.post(Authorization=f"Bearer {wrong}").status_code == 401
    with pytest.raises(BaseException) as refused:  # the SDK wraps it (task groups)
        async with client(http_server.url, wrong, mode=era) as mcp:
            await mcp.list_tools()
    assert "Server returned an error response" in messages(refused.value), refused.value
    assert [r.accepted for r in audit(home)] == [True, False], "the refused client did nothing"


def messages(exc: BaseException) -> str:
    """Every message in an exception, its groups, causes and contexts."""
    found, stack, seen = [], [exc], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        found.append(f"{type(e).__name__}: {e}")
        stack += [x for x in (e.__cause__, e.__context__) if x is not None]
        stack += list(getattr(e, "exceptions", ()))
    return "\n".join(found)


def test_non_loopback_needs_token_file_and_allowed_hosts(home: Home, tmp_path: Path) -> None:
    with pytest.raises(HttpConfigError, match="not a loopback address"):
        HttpPlan(home, host="0.0.0.0")
    with pytest.raises(HttpConfigError, match="--allowed-host"):
        HttpPlan(home, host="192.0.2.10", token_file=tmp_path / "t")
    with pytest.raises(HttpConfigError):
        HttpPlan(home, host="0.0.0.0", allowed_hosts=["mcp.example"])
    plan = HttpPlan(
        home,
        host="0.0.0.0",
        token_file=tmp_path / "t",
        allowed_hosts=["mcp.example", "10.0.0.5:8765"],
    )
    assert plan.allowed_hosts == ["mcp.example:*", "10.0.0.5:8765"]
    assert plan.allowed_origins == []
    assert HttpPlan(home, host="::1").allowed_hosts[-1] == "[::1]:*"

    port = str(free_port())
    refused = subprocess.run(
        serve_argv(home, "--transport", "http", "--host", "0.0.0.0", "--port", port),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "not a loopback address" in refused.stderr
    assert not port_open(int(port))


def test_token_file_is_checked(home: Home, tmp_path: Path) -> None:
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    os.chmod(weak, 0o600)
    with pytest.raises(HttpConfigError, match="at least 32"):
        read_token(weak)
    shared = tmp_path / "shared"
    shared.write_text("s" * 40 + "\n")
    os.chmod(shared, 0o644)
    with pytest.raises(HttpConfigError, match="chmod 600"):
        read_token(shared)
    result = subprocess.run(
        serve_argv(
            home, "--transport", "http", "--port", str(free_port()), "--token-file", str(shared)
        ),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "chmod 600" in result.stderr
    assert "s" * 40 not in result.stderr


def test_given_token_file_and_read_only_mode(home: Home, tmp_path: Path) -> None:
    token_file = tmp_path / "my-token"
    token = "t0k3n-" + "a" * 40
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    server = HttpServer(home, "--token-file", str(token_file), "--mode", "read-only")
    try:
        assert not (home.root / "http-token").exists(), "a given token file is used as is"
        response = server.post(Authorization=f"Bearer {token}")
        assert response.status_code == 200
        listed = httpx2.post(
            server.url,
            headers={
                **HEADERS,
                "Authorization": f"Bearer {token}",
                "Mcp-Session-Id": response.headers.get("mcp-session-id", ""),
                "Mcp-Protocol-Version": "2025-11-25",
            },
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            timeout=10,
        )
        assert listed.status_code == 200
        names = [
            t["name"]
            for t in json.loads(listed.text.split("data: ", 1)[1].split("\n")[0])["result"]["tools"]
        ]
        assert sorted(names) == ["evidence", "registry", "status"]
    finally:
        log = server.stop()
    assert token not in log
