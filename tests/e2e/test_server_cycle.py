"""One whole cycle through the MCP front, with the MCP server killed in the middle of it.

`propose_plan` returns at once; the cycle runs in the detached supervisor, which must seal it
normally although the MCP server process (and its client) are gone. Afterwards a fresh client
reads the sealed evidence, the registry's learned outcomes, the evidence resource and the
planning prompt's live context. Real `mlx_lm.server` processes on the tiny demo models.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from mcp_infra.contracts import CycleSummary, FrozenPlan
from mcp_infra.demo.homes import ONE_START, write_test_policy
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state.context import load_config
from mcp_infra.state.evidence import list_cycles, verify
from mcp_infra.state.store import Home, read_model
from tests.helpers.mcp_clients import audit, serve_processes, stdio_client, wait_for

pytestmark = pytest.mark.anyio


def injection(marker: Path) -> str:
    """Plan text that would create `marker` (a per-test temporary file) if a shell ever ran it."""
    return f"drafting helps $(touch {marker}) `touch {marker}`"


def sealed_for(home: Home, plan_id: str) -> CycleSummary | None:
    """The plan's sealed cycle, once its bundle is in place (``list_cycles`` never reads the
    hidden folder a bundle is written in, whose summary and manifest exist before the rename)."""
    for summary in list_cycles(home):
        if summary.plan_id == plan_id and home.bundle_files(summary.cycle_id).manifest.exists():
            return summary
    return None


async def test_cycle_seals_after_the_mcp_server_is_killed(
    home: Home, anyio_backend: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hypothesis = injection(marker)
    write_test_policy(home, **ONE_START)  # one round: a cycle to kill the server in, and seal
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    seen: dict = {}
    killed = False
    try:
        async with stdio_client(home, mode="legacy") as client:
            before = (await client.call_tool("status", {})).structured_content["service"]
            assert before["healthy"] is True and before["pid"] and before["since"]
            assert "healthy (GET /health" in before["health_check"]  # no completion sent

            result = await client.call_tool(
                "propose_plan",
                {"plan": {"hypothesis": hypothesis, "candidates": ["demo-tiny:draft-k2"]}},
            )
            proposal = result.structured_content
            # propose_plan returns at once: the cycle it queued is not sealed yet
            assert sealed_for(home, proposal["plan_id"]) is None
            assert proposal["accepted"] is True and proposal["queue_position"] == 1
            seen["plan_id"] = proposal["plan_id"]

            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                status = (await client.call_tool("status", {})).structured_content
                cycle = status.get("cycle")
                if cycle and cycle["state"] == "EXPERIMENT":
                    seen["status"] = status
                    break
                await anyio.sleep(0.5)
            assert "status" in seen, "the cycle never reached EXPERIMENT"
            servers = serve_processes(home)
            assert len(servers) == 1
            servers[0].kill()  # the MCP server dies mid-cycle (as when an IDE is closed)
            servers[0].wait(10)
            killed = True
    except Exception:  # the client notices its server vanished; that is the point
        if not killed:
            raise
    assert killed

    cycle = seen["status"]["cycle"]
    assert cycle["cycle_id"].startswith("c-") and cycle["plan_id"] == seen["plan_id"]
    # rounds measure the baseline recipe and the candidate in fresh starts, in alternating order
    assert cycle["candidate"] in {"baseline", "demo-tiny:draft-k2"} and cycle["total"] == 2
    assert (
        cycle["step"] == 6 and cycle["steps"] == 11 and " of 2 in this round)" in cycle["progress"]
    )
    assert "round " in cycle["progress"] and cycle["measuring"]["max_rounds"] == 1
    assert cycle["expected_downtime_s"] == 0 and "ports of their own" in cycle["downtime_note"]
    assert cycle["started_at"] and cycle["elapsed_s"] >= 0
    live = seen["status"]["service"]
    # status sends no completion: the front's last probe (GET /health) and its age
    assert live["healthy"] is True and "healthy (GET /health" in live["health_check"]
    assert live["backend_health_age_s"] is not None and live["front_pid"]
    assert seen["status"]["supervisor_running"] is True

    summary = wait_for(
        lambda: sealed_for(home, seen["plan_id"]),
        timeout=300,
        what="the cycle to be sealed by the detached supervisor",
    )
    assert not summary.interrupted and summary.recovery is None
    assert summary.outcome.value in ("promoted", "kept_baseline"), summary.reason
    bundle = home.evidence / summary.cycle_id
    checked = verify(bundle)
    assert checked.ok, (checked.failed, checked.problems)
    states = [
        json.loads(line)["state"] for line in (bundle / "journal.ndjson").read_text().splitlines()
    ]
    assert "RECOVER" not in states and states[-1] == "SEALED"
    frozen = read_model(bundle / "plan.json", FrozenPlan)
    assert frozen.proposed_by == "mcp:mcp" and frozen.proposed.hypothesis == hypothesis
    assert not marker.exists(), "plan text never reaches a shell"
    for record in home.state.glob("*.json"):
        assert "touch" not in record.read_text(), f"plan text reached {record.name}"
    assert [r.plan_id for r in audit(home)] == [seen["plan_id"]]
    wait_for(lambda: not home.lock_is_held(), timeout=60, what="the supervisor to exit")

    async with stdio_client(home) as client:  # a new client, the other protocol era
        listing = (await client.call_tool("evidence", {})).structured_content
        assert listing["cycles"][0]["cycle_id"] == summary.cycle_id
        shown = await client.call_tool("evidence", {"cycle_id": summary.cycle_id})
        ev = shown.structured_content
        assert ev["summary"]["outcome"] == summary.outcome.value
        assert {row["candidate"] for row in ev["table"]} == {"demo-tiny:draft-k2"}
        assert all(row["baseline_tps"] > 0 and row["candidate_tps"] > 0 for row in ev["table"])
        assert ev["verdict"]["candidates"][0]["candidate"] == "demo-tiny:draft-k2"
        assert summary.cycle_id in shown.content[0].text
        gates = (
            await client.call_tool("evidence", {"cycle_id": summary.cycle_id, "section": "gates"})
        ).structured_content
        assert {g["gate"] for g in gates["gates"]} >= {"lossless", "smoke"}
        journal = (
            await client.call_tool("evidence", {"cycle_id": summary.cycle_id, "section": "journal"})
        ).structured_content
        assert journal["page"] == 1 and journal["pages"] >= 1
        assert journal["journal"][0]["state"] == "QUEUED"
        assert all(len(json.dumps(row)) < 2000 for row in journal["journal"])
        beyond = await client.call_tool(
            "evidence", {"cycle_id": summary.cycle_id, "section": "journal", "page": 999}
        )
        said = beyond.content[0].text
        assert beyond.is_error and f"no page 999: pages are 1 to {journal['pages']}" in said

        learned = (
            await client.call_tool("registry", {"candidate_id": "demo-tiny:draft-k2"})
        ).structured_content["candidates"][0]["learned"]
        assert learned and learned[-1]["cycle_id"] == summary.cycle_id

        latest = json.loads(
            (await client.read_resource("mcp-infra://evidence/latest/summary")).contents[0].text
        )
        assert latest["cycle_id"] == summary.cycle_id
        prompt = (await client.get_prompt("propose_acceleration_plan", {})).messages[0]
        body = prompt.content.text
        assert f"Cycle {summary.cycle_id} measured" in body and "tok/s, TTFT p50" in body
        assert f"- {summary.cycle_id}: {summary.outcome.value}" in body
        if summary.outcome.value == "promoted":  # the live recipe now: not offered again
            assert "- demo-tiny:draft-k2: it is the live recipe" in body
        else:
            assert f"past {summary.cycle_id}: " in body

        after = (await client.call_tool("status", {})).structured_content
        assert after["cycle"] is None and after["queue"] == []
        assert after["last_cycle"]["cycle_id"] == summary.cycle_id
