"""The MCP front over a real stdio subprocess, in both protocol eras: tool contracts, structured
output, dry runs, refusals of untrusted input, resources, the planning prompt, modes and audit.

No cycle runs here (plans are dry runs or queued with `--no-supervisor`); the one full cycle of
the MCP front is in tests/e2e/test_server_cycle.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError

from mcp_infra.contracts import MAX_PLAN_CANDIDATES
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import PLAN, RawStdio, audit, files_under, stdio_client

pytestmark = pytest.mark.anyio

ERAS = ["legacy", "auto"]  # 2025-11-25 with initialize, and 2026-07-28 without


async def call(client: Any, tool: str, args: dict[str, Any]) -> Any:
    return await client.call_tool(tool, args)


def text(result: Any) -> str:
    return result.content[0].text if result.content else ""


@pytest.mark.parametrize("era", ERAS)
async def test_tool_contracts_and_structured_output(
    home: Home, anyio_backend: str, era: str
) -> None:
    async with stdio_client(home, mode=era) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"status", "registry", "evidence", "propose_plan"}
        for name in ("status", "registry", "evidence"):
            hints = tools[name].annotations
            assert hints is not None
            assert (
                hints.read_only_hint,
                hints.idempotent_hint,
                hints.open_world_hint,
                hints.destructive_hint,
            ) == (True, True, False, False), name
        propose = tools["propose_plan"].annotations
        assert propose is not None and propose.read_only_hint is False
        assert propose.destructive_hint is True and propose.open_world_hint is False
        for tool in tools.values():  # extra arguments are refused, and the schema says so
            assert tool.input_schema.get("additionalProperties") is False, tool.name
        for tool in tools.values():  # a compact output schema where a client reads fields
            listed = tool.name in ("status", "propose_plan")
            assert bool(tool.output_schema) == listed, tool.name
            assert not listed or (tool.output_schema or {}).get("type") == "object"
            assert 200 < len(tool.description or "") <= 700, f"{tool.name}: a short description"
        assert tools["status"].input_schema.get("properties") == {}
        reg = tools["registry"].input_schema["properties"]["candidate_id"]
        assert {"maxLength": 130}.items() <= next(
            a for a in reg["anyOf"] if a.get("type") == "string"
        ).items()
        assert set(tools["evidence"].input_schema["properties"]) == {"cycle_id", "section", "page"}
        plan_schema = tools["propose_plan"].input_schema["properties"]["plan"]
        as_object = next(a for a in plan_schema["anyOf"] if a.get("type") == "object")
        assert as_object["additionalProperties"] is False
        assert set(as_object["properties"]) == {"hypothesis", "candidates", "acceptance", "notes"}
        assert as_object["properties"]["candidates"]["maxItems"] == MAX_PLAN_CANDIDATES
        assert tools["propose_plan"].input_schema["properties"]["dry_run"]["type"] == "boolean"
        status_out = set(tools["status"].output_schema["properties"])
        assert {
            "service",
            "cycle",
            "queue",
            "last_cycle",
            "policy",
            "window",
            "server_mode",
            "window_now",
        } <= status_out

        status = await call(client, "status", {})
        s = status.structured_content
        assert not status.is_error and s["configured"] is True
        assert s["service"]["active_recipe"] == "demo-tiny:target"
        assert s["service"]["healthy"] is False  # nothing serves in this test
        assert s["cycle"] is None and s["queue"] == [] and s["last_cycle"] is None
        assert s["policy"] == "test" and s["window"]["mode"] == "always"
        assert s["server_mode"] == "propose"
        assert "active recipe demo-tiny:target" in text(status)

        registry = await call(client, "registry", {})
        summary, pages = (
            registry.structured_content["summary"],
            registry.structured_content["pages"],
        )
        candidates = {c["id"]: c for c in registry.structured_content["candidates"]}
        for page in range(2, pages + 1):  # every page, each within its budget
            more = await call(client, "registry", {"page": page})
            candidates |= {c["id"]: c for c in more.structured_content["candidates"]}
        assert len(candidates) == summary["candidates"]
        assert "demo-tiny:draft-k2" in summary["proposable"]
        assert {"demo-tiny:draft-k2", "demo-tiny:draft-k4", "demo-tiny:kv8"} <= set(candidates)
        k2 = candidates["demo-tiny:draft-k2"]
        assert (k2["candidate_class"], k2["semantics"], k2["preflight_passed"]) == (
            "acceleration_plugin",
            "lossless",
            True,
        )
        assert k2["knobs"] == {"draft": True, "num_draft_tokens": 2, "prompt_cache_size": 0}
        assert {c["name"] for c in k2["checks"]} >= {"platform", "memory", "artifacts"}
        assert all(c["detail"] for c in k2["checks"])
        assert candidates["demo-tiny:kv8"]["auto_promote"] is False
        one = await call(client, "registry", {"candidate_id": "demo-tiny:kv8"})
        assert [c["id"] for c in one.structured_content["candidates"]] == ["demo-tiny:kv8"]

        listing = await call(client, "evidence", {})
        assert listing.structured_content["cycles"] == [] and "No sealed cycle" in text(listing)
        missing = await call(client, "evidence", {"cycle_id": "c-20990101-000000-abcdef"})
        assert missing.is_error and "no sealed evidence" in text(missing)

        dry = await call(client, "propose_plan", {"plan": PLAN, "dry_run": True})
        d = dry.structured_content
        assert not dry.is_error and d["accepted"] is True and d["dry_run"] is True
        assert d["candidates"] == ["baseline", "demo-tiny:draft-k2"]
        assert d["plan_id"].startswith("p-") and d["queue_position"] is None
        assert d["thresholds"]["min_speedup_pct"] == 5.0
        assert d["changes"][0]["value"] == "baseline" and d["changes"][0]["reason"]
        assert "may start now" in d["window"]
        assert text(dry).startswith("DRY RUN — ACCEPTED")
        as_string = await call(client, "propose_plan", {"plan": json.dumps(PLAN), "dry_run": True})
        assert as_string.structured_content["accepted"] is True
    assert not home.queued(), "a dry run queues nothing"
    records = audit(home)
    assert [r.accepted for r in records] == [True, True]
    assert all(r.client == "mcp:mcp" and r.detail.startswith("dry run") for r in records)


@pytest.mark.parametrize("era", ERAS)
async def test_untrusted_input_is_refused_in_our_words(
    home: Home, anyio_backend: str, era: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"  # created only if plan text ever reached a shell
    before = files_under(home.plans)
    async with stdio_client(home, mode=era) as client:
        # an extra top-level argument (the SDK alone would silently drop it)
        extra = await call(client, "propose_plan", {"plan": PLAN, "dry_run": True, "force": True})
        assert extra.is_error and "unknown argument(s): force" in text(extra)
        weird = await call(client, "status", {"$(reboot)": 1})
        assert weird.is_error and "$(reboot)" not in text(weird)
        typed = await call(client, "propose_plan", {"plan": PLAN, "dry_run": "yes"})
        assert typed.is_error and "dry_run: must be true or false" in text(typed)
        assert extra.structured_content["accepted"] is False, "the same shape as a bad plan"
        nested = await call(client, "propose_plan", {"plan": {**PLAN, "run_as": "root"}})
        assert nested.is_error and nested.structured_content["accepted"] is False
        assert "run_as: unknown field (allowed: " in nested.structured_content["message"]
        odd = await call(client, "propose_plan", {"plan": {**PLAN, "$(id)": "root"}})
        assert "unknown field" in text(odd) and "$(id)" not in text(odd)

        unknown = await call(
            client,
            "propose_plan",
            {"plan": {"hypothesis": "h", "candidates": ["demo-tiny:warp-drive"]}},
        )
        u = unknown.structured_content
        assert u["accepted"] is False and u["plan_id"] is None
        assert u["problems"] == ["demo-tiny:warp-drive: not a candidate of the registry"]

        shell = "demo-tiny:draft-k2; rm -rf ~ #"
        injected = await call(
            client,
            "propose_plan",
            {"plan": {"hypothesis": f"$(touch {marker})", "candidates": [shell]}},
        )
        assert injected.structured_content["accepted"] is False
        assert "rm -rf" not in text(injected) and "rm -rf" not in json.dumps(
            injected.structured_content
        )
        assert "not a well-formed id" in text(injected)

        loose = await call(
            client,
            "propose_plan",
            {
                "plan": {**PLAN, "acceptance": {"min_speedup_pct": 0.5, "max_peak_memory_gb": 64}},
                "dry_run": True,
            },
        )
        lo = loose.structured_content
        assert lo["accepted"] is True, "loosening is not applied, the plan itself is fine"
        assert lo["thresholds"]["min_speedup_pct"] == 5.0
        assert lo["thresholds"]["max_peak_memory_gb"] == 4.0
        kept = {c["field"]: c for c in lo["changes"] if c["action"] in ("kept", "clamped")}
        assert "only tighten" in kept["acceptance.min_speedup_pct"]["reason"]
        assert "acceptance.max_peak_memory_gb" in kept
        tight = await call(
            client,
            "propose_plan",
            {"plan": {**PLAN, "acceptance": {"min_speedup_pct": 12}}, "dry_run": True},
        )
        assert tight.structured_content["thresholds"]["min_speedup_pct"] == 12.0

        long_text = "x" * 5000
        oversized = await call(client, "propose_plan", {"plan": {**PLAN, "hypothesis": long_text}})
        assert oversized.structured_content["accepted"] is False
        assert "hypothesis: text is too long" in text(oversized)
        assert long_text[:100] not in text(oversized)
        many = await call(
            client,
            "propose_plan",
            {"plan": {"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"] * 17}},
        )
        assert "candidates: at most 16 items, got 17" in text(many)
        huge = await call(
            client, "propose_plan", {"plan": json.dumps({**PLAN, "notes": "n" * 20_000})}
        )
        assert "larger than 16 KiB" in text(huge)
        big_id = await call(client, "registry", {"candidate_id": "y" * 500})
        assert big_id.is_error and "text is too long" in text(big_id)
        assert "yyyy" not in text(big_id)
        bad_cycle = await call(client, "evidence", {"cycle_id": "../../etc/passwd"})
        assert bad_cycle.is_error and "passwd" not in text(bad_cycle)
        nan_string = await call(
            client,
            "propose_plan",
            {
                "plan": '{"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"], '
                '"acceptance": {"min_speedup_pct": NaN}}'
            },
        )
        assert nan_string.structured_content["accepted"] is False
        assert "finite" in nan_string.structured_content["message"]
    assert files_under(home.plans) == before, "no refusal wrote a plan"
    assert not home.queued()
    records = audit(home)
    assert len(records) == 12, "every propose_plan call is audited, refused ones included"
    refused = [r for r in records if not r.accepted]
    assert len(refused) == 10
    assert all(len(r.detail) <= 300 and "rm -rf" not in r.detail for r in refused)
    assert not marker.exists()


async def test_nan_from_a_raw_peer(home: Home, anyio_backend: str) -> None:
    """JSON-RPC peers can send NaN/Infinity literals (Python's JSON parser accepts them)."""
    peer = RawStdio(home)
    try:
        assert "result" in peer.initialize()
        nan = peer.request(
            "tools/call",
            raw_params=(
                '{"name": "propose_plan", "arguments": {"plan": {"hypothesis": "h", '
                '"candidates": ["demo-tiny:draft-k2"], "acceptance": {"min_speedup_pct": NaN}}}}'
            ),
        )
        result = nan["result"]
        assert result["structuredContent"]["accepted"] is False
        assert "finite" in result["structuredContent"]["message"]
        inf = peer.request(
            "tools/call", raw_params=('{"name": "evidence", "arguments": {"page": Infinity}}')
        )
        assert inf["result"]["isError"] is True
        assert "numbers must be finite" in inf["result"]["content"][0]["text"]
        arguments_list = peer.request("tools/call", {"name": "status", "arguments": [1, 2]})
        assert arguments_list.get("error") or arguments_list["result"]["isError"]
    finally:
        peer.close()
    assert [r.client for r in audit(home)] == ["mcp:raw-peer"]
    assert not home.queued()


async def test_resources_and_planning_prompt(home: Home, anyio_backend: str) -> None:
    async with stdio_client(home) as client:
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {
            "mcp-infra://policy",
            "mcp-infra://plan-schema",
            "mcp-infra://manifests/demo-tiny",
        } <= listed
        templates = {
            t.uri_template for t in (await client.list_resource_templates()).resource_templates
        }
        assert {
            "mcp-infra://manifests/{manifest_id}",
            "mcp-infra://evidence/{cycle_id}/summary",
        } <= templates
        policy = json.loads((await client.read_resource("mcp-infra://policy")).contents[0].text)
        assert policy["policy"]["name"] == "test" and len(policy["hash"]) == 64
        schema = json.loads(
            (await client.read_resource("mcp-infra://plan-schema")).contents[0].text
        )
        assert schema["additionalProperties"] is False and "$defs" not in schema
        manifest = json.loads(
            (await client.read_resource("mcp-infra://manifests/demo-tiny")).contents[0].text
        )
        assert "demo-tiny:draft-k4" in manifest["candidates"]
        with pytest.raises(Exception, match="no such manifest"):
            await client.read_resource("mcp-infra://manifests/nope")
        with pytest.raises(Exception, match="no sealed cycle"):
            await client.read_resource("mcp-infra://evidence/latest/summary")

        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert set(prompts) == {"propose_acceleration_plan"}
        assert [a.name for a in prompts["propose_acceleration_plan"].arguments or []] == ["goal"]
        got = await client.get_prompt("propose_acceleration_plan", {"goal": "lower latency"})
        body = got.messages[0].content.text
        assert "Goal: lower latency" in body
        assert "- demo-tiny:draft-k2:" in body and "NOT auto-promoted" in body
        assert "min_speedup_pct: default 5.0" in body and "[0.0, 200.0]" in body
        assert "Not measured yet" in body and "## Past cycles" in body and "None yet." in body
        assert "propose_plan" in body
        with pytest.raises(Exception, match="goal is too long"):
            await client.get_prompt("propose_acceleration_plan", {"goal": "g" * 600})


async def test_read_only_mode_has_no_propose_plan(home: Home, anyio_backend: str) -> None:
    async with stdio_client(home, "--mode", "read-only", mode="legacy") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {"status", "registry", "evidence"}
        with pytest.raises(MCPError, match="read-only mode") as refused:
            await client.call_tool("propose_plan", {"plan": PLAN})
        assert refused.value.error.code == -32602
        with pytest.raises(MCPError, match="unknown tool") as other:
            await client.call_tool("x" * 300, {})
        assert other.value.error.code == -32602 and "xxxx" not in str(other.value)
        status = await client.call_tool("status", {})
        assert status.structured_content["server_mode"] == "read-only"
        got = await client.get_prompt("propose_acceleration_plan", {})
        assert "read-only" in got.messages[0].content.text
    assert not home.queued()
    records = audit(home)  # the refused attempt is audited like any propose_plan call
    assert [(r.accepted, r.client) for r in records] == [(False, "mcp:mcp")]
    assert "read-only" in records[0].detail


async def test_propose_queues_and_returns_at_once(home: Home, anyio_backend: str) -> None:
    """Queued (not run: --no-supervisor), with a position and how to follow it; audited."""
    async with stdio_client(home, "--no-supervisor", mode="legacy") as client:
        first = await client.call_tool("propose_plan", {"plan": PLAN})
        assert not any(home.cycles.iterdir()), "returned at once: nothing ran"
        second = await client.call_tool(
            "propose_plan",
            {"plan": {"hypothesis": "more drafted tokens", "candidates": ["demo-tiny:draft-k4"]}},
        )
        status = await client.call_tool("status", {})
    f, s = first.structured_content, second.structured_content
    assert f["accepted"] and s["accepted"]
    assert (f["queue_position"], s["queue_position"]) == (1, 2)
    assert "status" in f["follow"] and len(f["plan_hash"]) == 64
    assert status.structured_content["queue"] == [f["plan_id"], s["plan_id"]]
    frozen = json.loads(home.queued()[0].read_text())
    assert frozen["proposed_by"] == "mcp:mcp" and frozen["plan_id"] == f["plan_id"]
    records = [r for r in audit(home) if r.accepted]
    assert [r.plan_id for r in records] == [f["plan_id"], s["plan_id"]]
    assert records[0].plan_hash == f["plan_hash"]


async def test_propose_waits_for_the_maintenance_window(home: Home, anyio_backend: str) -> None:
    """In propose mode a plan is queued at once but starts only when the policy allows."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    import yaml

    from tests.helpers.mcp_clients import supervisors, wait_for

    path = home.user_policy / "test.yaml"
    policy = yaml.safe_load(path.read_text())
    later = datetime.now(UTC).astimezone(ZoneInfo("Europe/Berlin")) + timedelta(hours=3)
    policy["window"] = {
        "mode": "window",
        "start": f"{later:%H}:00",
        "end": f"{(later + timedelta(hours=2)):%H}:00",
        "timezone": "Europe/Berlin",
    }
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    async with stdio_client(home) as client:
        result = await client.call_tool("propose_plan", {"plan": PLAN})
        status = await client.call_tool("status", {})
    proposal = result.structured_content
    assert proposal["accepted"] is True and proposal["queue_position"] == 1
    assert proposal["window"].startswith("waits: outside the window")
    assert "Europe/Berlin" in proposal["window"]
    s = status.structured_content
    assert s["window"]["timezone"] == "Europe/Berlin" and s["window_now"].startswith("waits")
    assert "A queued plan waits" in status.content[0].text
    # the supervisor that propose_plan started looks at the window and leaves the plan queued
    assert (home.logs / "supervisor.log").exists()
    wait_for(lambda: not supervisors(home), timeout=60, what="the supervisor to exit")
    assert [p.name.split("-", 1)[1][:-5] for p in home.queued()] == [proposal["plan_id"]]
    assert not any(home.cycles.iterdir())


async def test_autonomous_mode_keeps_one_watcher(home: Home, anyio_backend: str) -> None:
    from mcp_infra.flows.proposal import watcher_pid
    from tests.helpers.mcp_clients import supervisors

    for _ in range(2):  # a second server finds the first one's watcher and starts none
        async with stdio_client(home, "--mode", "autonomous") as client:
            status = await client.call_tool("status", {})
            assert status.structured_content["server_mode"] == "autonomous"
    pid = watcher_pid(home)
    assert pid is not None
    watching = [p for p in supervisors(home) if "--watch" in p.cmdline()]
    assert [p.pid for p in watching] == [pid], "exactly one watcher, outliving its servers"
