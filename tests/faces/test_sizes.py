"""What an agent pays to read: `tools/list` and every read tool's largest answer, measured.

Over real MCP sessions (in-memory): `tools/list` is at most 10,000 characters; every answer of a
read tool (each page of the registry, the cycle list, a sealed cycle's summary and each page of
each section) keeps its structured content within the tools' budget, a registry page within
8,000 characters; a page out of range is an error that says the range. The fast test reads a
bare home with the shipped bundle; the slow one the demo home (demo models built, every demo
candidate passing preflight, with its projected cost).
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import jsonschema
import pytest
from mcp import Client

from mcp_infra.faces.mcp_server import build_server
from mcp_infra.faces.mcp_tools import READ_BUDGET, REGISTRY_PAGE, TOOLS
from mcp_infra.state.store import Home
from tests.helpers.paths import SHIPPED

pytestmark = pytest.mark.anyio
TOOLS_LIST = 10_000
SECTIONS = ["summary", "table", "gates", "verdict", "plan", "journal"]


def size(data: Any) -> int:
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False))


async def answers(client: Client) -> dict[str, list[Any]]:
    """Every answer of every read tool, each page of each, by a label."""
    seen: dict[str, list[Any]] = {"status": [await client.call_tool("status", {})]}
    for label, args in [("registry", {}), ("evidence", {})]:
        first = await client.call_tool(label, args)
        pages = first.structured_content["pages"]
        seen[label] = [first] + [
            await client.call_tool(label, {**args, "page": n}) for n in range(2, pages + 1)
        ]
    for section in SECTIONS:
        args = {"cycle_id": "latest", "section": section}
        first = await client.call_tool("evidence", args)
        assert not first.is_error, (section, first.content[0].text)
        pages = first.structured_content["pages"]
        seen[section] = [first] + [
            await client.call_tool("evidence", {**args, "page": n}) for n in range(2, pages + 1)
        ]
    return seen


async def measure(home: Home) -> dict[str, int]:
    """The sizes, checked; returns the largest structured content per label."""
    shutil.copytree(SHIPPED[0], home.evidence / SHIPPED[0].name)
    largest: dict[str, int] = {}
    async with Client(build_server(home, start_supervisor=False)) as client:
        listed = (await client.list_tools()).tools
        wire = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed]
        largest["tools/list"] = size(wire)
        assert largest["tools/list"] <= TOOLS_LIST, {t["name"]: size(t) for t in wire}
        for label, results in (await answers(client)).items():
            for result in results:
                assert not result.is_error, (label, result.content[0].text)
                assert size(result.structured_content) <= READ_BUDGET, label
                assert len(result.content[0].text) <= 12_000, label
            largest[label] = max(size(r.structured_content) for r in results)
        assert largest["registry"] <= REGISTRY_PAGE
        registry = (await client.call_tool("registry", {})).structured_content
        assert registry["summary"]["candidates"] >= len(registry["candidates"])
        assert "proposable" in registry["summary"] and registry["page"] == 1
        beyond = await client.call_tool("registry", {"page": registry["pages"] + 1})
        assert beyond.is_error
        assert f"pages are 1 to {registry['pages']}" in beyond.content[0].text
        late = await client.call_tool("evidence", {"page": 2})
        assert late.is_error and "no page 2: pages are 1 to 1" in late.content[0].text
        journal = {"cycle_id": "latest", "section": "journal", "page": 999}
        far = await client.call_tool("evidence", journal)
        assert far.is_error and "no page 999: pages are 1 to " in far.content[0].text
    print("largest answers (characters):", json.dumps(largest))
    return largest


async def test_the_tool_list_and_every_answer_fit_a_context(
    bare_home: Home, anyio_backend: str
) -> None:
    await measure(bare_home)


async def test_on_the_demo_home(home: Home, anyio_backend: str) -> None:
    largest = await measure(home)
    assert largest["registry"] > 1000, "the demo's candidates, with their checks, are listed"


async def test_schemas_listed_where_a_client_acts_on_fields(
    bare_home: Home, anyio_backend: str
) -> None:
    """status and propose_plan list a compact output schema their answers satisfy; every tool's
    full schema is a resource."""
    async with Client(build_server(bare_home, start_supervisor=False)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        listed = {spec.name for spec in TOOLS if spec.listed_schema}
        assert listed == {"status", "propose_plan"}
        assert {n for n, t in tools.items() if t.output_schema} == listed
        status = await client.call_tool("status", {})
        jsonschema.validate(status.structured_content, tools["status"].output_schema)
        plan = {"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"]}
        refused = await client.call_tool("propose_plan", {"plan": plan, "dry_run": True})
        jsonschema.validate(refused.structured_content, tools["propose_plan"].output_schema)
        for spec in TOOLS:
            read = await client.read_resource(f"mcp-infra://schemas/{spec.name}")
            full = json.loads(read.contents[0].text)
            assert full == spec.result.model_json_schema()
            compact = tools[spec.name].output_schema
            assert compact is None or set(compact["properties"]) == set(full["properties"])
