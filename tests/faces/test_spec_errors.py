"""Issue 13: spec-correct protocol errors and hardened inputs, over real client sessions
(in-memory in both protocol eras, a raw stdio peer, HTTP) and over the pure checks.

Each defect listed in the issue has a test here: unknown tool / malformed tools/call params
(JSON-RPC -32602, not an isError result), unknown prompt (-32602, not code 0, one WARNING line
without a traceback), control / bidi / separator characters in free text, strict `acceptance`,
structured refusals, read-only attempts audited, destructive hint, additionalProperties false,
the candidate-id pattern, exact bearer token, case-insensitive Host.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError

from mcp_infra.contracts import CANDIDATE_ID_PATTERN, Plan, text_problem
from mcp_infra.core.sanitize import PlanRefused, parse_plan
from mcp_infra.faces.http_transport import _bearer_matches, _host_allowed, read_token
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import (
    HEADERS,
    INIT,
    PLAN,
    HttpServer,
    RawStdio,
    audit,
    child_env,
    serve_argv,
)

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]

BAD_TEXT = {
    "ESC": "a\x1bb",
    "NUL": "a\x00b",
    "RLO U+202E": "a\u202eb",
    "LSEP U+2028": "a\u2028b",
    "PSEP U+2029": "a\u2029b",
    "NEL U+0085": "a\u0085b",
    "isolate U+2066": "a\u2066b",
    "C1 U+009B": "a\u009bb",
    "DEL": "a\x7fb",
}


@pytest.mark.parametrize("name", sorted(BAD_TEXT))
def test_free_text_refuses_control_bidi_and_separators(name: str) -> None:
    bad = BAD_TEXT[name]
    for field in ("hypothesis", "notes"):
        with pytest.raises(PlanRefused) as refused:
            parse_plan({**PLAN, field: bad})
        message = str(refused.value)
        assert f"{field}: must be plain text" in message
        assert bad not in message and bad[1] not in message  # never echoed
    assert text_problem(bad) is not None


def test_notes_keep_newlines_and_tabs() -> None:
    assert parse_plan({**PLAN, "notes": "line one\n\tline two"}).notes.endswith("two")
    with pytest.raises(PlanRefused, match="one line"):
        parse_plan({**PLAN, "hypothesis": "a\tb"})


@pytest.mark.parametrize("value", ["5", True, "NaN", [5], {"x": 1}])
def test_acceptance_is_numbers_only(value: Any) -> None:
    with pytest.raises(PlanRefused) as refused:
        parse_plan({**PLAN, "acceptance": {"min_speedup_pct": value}})
    assert "acceptance.min_speedup_pct: must be a number" in str(refused.value)
    assert "greater_than" not in str(refused.value)  # "NaN" used to get a bound message


def test_acceptance_out_of_range_is_clamped_not_refused() -> None:
    """Both fields the same way: any finite number parses; sanitize clamps it with a reason
    (the clamping is checked over MCP in test_untrusted_input_is_refused_in_our_words)."""
    plan = parse_plan({**PLAN, "acceptance": {"min_speedup_pct": 1e9, "max_peak_memory_gb": -3}})
    assert plan.acceptance is not None and plan.acceptance.max_peak_memory_gb == -3
    with pytest.raises(PlanRefused, match="finite"):
        parse_plan(
            '{"hypothesis": "h", "candidates": ["a:b"], '
            '"acceptance": {"max_peak_memory_gb": Infinity}}'
        )


def test_plan_schema_carries_the_candidate_pattern() -> None:
    items = Plan.model_json_schema()["properties"]["candidates"]["items"]
    assert items["pattern"] == CANDIDATE_ID_PATTERN
    assert Plan.model_json_schema()["additionalProperties"] is False


def test_bearer_exact_and_host_case_insensitive() -> None:
    token = b"t" * 40
    assert _bearer_matches("Bearer " + "t" * 40, token)
    assert _bearer_matches("bearer " + "t" * 40, token)  # the scheme is case-insensitive
    for header in (
        "Bearer  " + "t" * 40,
        "Bearer " + "t" * 40 + " ",
        "Bearer\t" + "t" * 40,
        "Bearer " + "t" * 40 + "\t",
        " Bearer " + "t" * 40,
    ):
        assert not _bearer_matches(header, token), repr(header)
    allowed = ["127.0.0.1:*", "localhost:*"]
    assert _host_allowed("LOCALHOST:8765", allowed) and _host_allowed("LocalHost", allowed)
    assert not _host_allowed("evil.example:80", allowed)


@pytest.mark.parametrize("era", ERAS)
async def test_protocol_mistakes_are_json_rpc_errors(
    home: Home, anyio_backend: str, era: str
) -> None:
    server = build_server(home, "propose", start_supervisor=False)
    async with Client(server, mode=era) as client:
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
        assert unknown.value.error.code == -32602 and "unknown tool" in str(unknown.value)
        with pytest.raises(MCPError) as prompt:
            await client.get_prompt("no_such_prompt", {})
        assert prompt.value.error.code == -32602 and "unknown prompt" in str(prompt.value)
        with pytest.raises(MCPError) as resource:
            await client.read_resource("mcp-infra://no-such-resource")
        assert resource.value.error.code == -32602
        with pytest.raises(MCPError) as goal:
            await client.get_prompt("propose_acceleration_plan", {"goal": "x\u202ey"})
        assert goal.value.error.code == -32602 and "\u202e" not in str(goal.value)
        # the session survives every one of them
        assert not (await client.call_tool("status", {})).is_error
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["propose_plan"].annotations.destructive_hint is True
        assert all(t.input_schema["additionalProperties"] is False for t in tools.values())
        refused = await client.call_tool(
            "propose_plan",
            {"plan": {"hypothesis": "h", "candidates": ["demo-tiny:warp-drive", "bad id;"]}},
        )
        r = refused.structured_content
        assert r["accepted"] is False
        assert {x["id"] for x in r["refused"]} == {
            "demo-tiny:warp-drive",
            "<candidate #2: not a well-formed id>",
        }
        assert all(x["reason"] for x in r["refused"])


async def test_read_only_attempts_are_audited(home: Home, anyio_backend: str) -> None:
    server = build_server(home, "read-only", start_supervisor=False)
    async with Client(server, mode="legacy") as client:
        with pytest.raises(MCPError, match="read-only") as refused:
            await client.call_tool("propose_plan", {"plan": PLAN})
        assert refused.value.error.code == -32602
    records = audit(home)
    assert len(records) == 1 and not records[0].accepted and "read-only" in records[0].detail


def test_raw_peer_errors_are_one_line_and_never_hang(home: Home) -> None:
    """Over stdio: malformed tools/call params and unknown names get -32602; the log gets one
    WARNING line per refusal and no traceback; the session answers afterwards."""
    peer = RawStdio(home)
    peer.proc.stderr = None
    try:
        assert "result" in peer.initialize()
        replies = [
            peer.request("tools/call", {"arguments": {}}),  # no name
            peer.request("tools/call", {"name": 7}),
            peer.request("tools/call", {"name": "status", "arguments": [1]}),
            peer.request("tools/call", {"name": "nope"}),
            peer.request("prompts/get", {"name": "nope"}),
            peer.request(
                "prompts/get", {"name": "propose_acceleration_plan", "arguments": {"goal": 5}}
            ),
        ]
        assert [r.get("error", {}).get("code") for r in replies] == [-32602] * len(replies)
        assert "result" in peer.request("tools/call", {"name": "status", "arguments": {}})
    finally:
        peer.close()


def test_unknown_prompt_logs_one_line(home: Home, tmp_path: Path) -> None:
    """The issue saw a ~100-line traceback at ERROR per unknown prompt (a log flood)."""
    peer = RawStdio(home)
    log = tmp_path / "stderr.log"
    peer.proc.kill()
    peer.proc.wait()
    with log.open("w") as err:
        peer.proc = subprocess.Popen(
            serve_argv(home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=child_env(),
        )
    try:
        peer.initialize()
        for i in range(10):
            reply = peer.request("prompts/get", {"name": f"x{i}"})
            assert reply["error"]["code"] == -32602
    finally:
        peer.close()
    text = log.read_text()
    warnings = [line for line in text.splitlines() if "refused request: unknown prompt" in line]
    assert len(warnings) == 10 and all(line.startswith("WARNING") for line in warnings)
    assert "Traceback" not in text and "x5" not in text


def test_http_host_case_and_exact_token(home: Home) -> None:
    server = HttpServer(home)
    try:
        token = read_token(home.root / "http-token")
        ok = httpx2.post(
            server.url,
            json=INIT,
            timeout=10,
            headers={
                **HEADERS,
                "Authorization": f"Bearer {token}",
                "Host": f"LOCALHOST:{server.port}",
            },
        )
        assert ok.status_code == 200, ok.text
        double = httpx2.post(
            server.url,
            json=INIT,
            timeout=10,
            headers={**HEADERS, "Authorization": f"Bearer  {token}"},
        )
        assert double.status_code == 401
    finally:
        server.stop()


async def test_http_unknown_tool_is_a_json_rpc_error(home: Home, anyio_backend: str) -> None:
    from mcp_infra.faces.http_transport import client

    server = HttpServer(home)
    try:
        token = read_token(home.root / "http-token")
        async with client(server.url, token) as session:
            with pytest.raises(MCPError) as unknown:
                await session.call_tool("nope", {})
            assert unknown.value.error.code == -32602
            with pytest.raises(MCPError) as prompt:
                await session.get_prompt("nope", {})
            assert prompt.value.error.code == -32602
            assert not (await session.call_tool("status", {})).is_error
    finally:
        log = server.stop()
    assert "Traceback" not in log


def test_auth_none_is_loopback_only(tmp_path: Path) -> None:
    from mcp_infra.faces.http_transport import HttpConfigError, HttpPlan

    home = Home(tmp_path / "h")
    with pytest.raises(HttpConfigError, match="not a loopback"):
        HttpPlan(
            home,
            host="0.0.0.0",
            auth="none",
            token_file=tmp_path / "t",
            allowed_hosts=["example.org"],
        )
    assert HttpPlan(home, host="127.0.0.1", auth="none").auth == "none"


def test_out_of_range_acceptance_is_clamped_with_a_reason(home: Home) -> None:
    """Both acceptance fields the same way: outside the policy's range, clamped, with why."""
    from mcp_infra.flows import api as app

    view = app.propose(
        home,
        {**PLAN, "acceptance": {"min_speedup_pct": 1e9, "max_peak_memory_gb": -3}},
        proposed_by="test",
        dry_run=True,
        start_supervisor=False,
    )
    clamped = {c.field: c.reason for c in view.changes if c.action == "clamped"}
    assert set(clamped) == {"acceptance.min_speedup_pct", "acceptance.max_peak_memory_gb"}
    assert all("clamped to the policy's range" in why for why in clamped.values())
