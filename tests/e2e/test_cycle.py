"""Whole cycles on real parts: a stdio MCP client, a detached supervisor, real mlx_lm servers.

Promotion is proven by what the stable port serves afterwards, not by what the code says it did.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_infra.contracts import CycleSummary, Outcome, Verdict
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, write_test_policy
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs import bench
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.context import active_recipe, load_config, service_record
from mcp_infra.state.store import Home, read_model
from tests.helpers.run import run_env

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Write a haiku about harbours."}]


def stdio_params(home: Home) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_infra", "--home", str(home.root), "serve"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", ""),
            "HF_HUB_OFFLINE": "1",
            **run_env(),
        },
    )


async def wait_sealed(client: Client, plan_id: str, timeout: float = 1200) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = (await client.call_tool("status", {})).structured_content
        last = status.get("last_cycle") or {}
        if last.get("plan_id") == plan_id and not status["supervisor_running"]:
            return status
        time.sleep(1)
    raise AssertionError("cycle did not seal in time")


def greedy_ids(port: int) -> list[int] | None:
    return bench.greedy_chat(
        f"http://127.0.0.1:{port}",
        MESSAGES,
        max_tokens=24,
        timeout=60,
        candidate="check",
        prompt_id="p",
    ).token_ids


async def test_cycle_over_stdio_promotes_and_the_stable_port_serves_the_winner(home: Home) -> None:
    # A promotion by policy, not by speed, of 12-token answers (tests/helpers/faultkit.FAST).
    write_test_policy(home, thresholds=PROMOTE_ANY_GAIN, max_tokens=12)
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    before = greedy_ids(config.port)
    async with Client(stdio_params(home)) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {"status", "registry", "evidence", "propose_plan"}
        # A cycle that kept the baseline all the same is proposed once more, as
        # tests/helpers/faultkit.until_not_kept does in process: any gain promotes, but a loaded
        # 2-core machine can measure both drafters without one.
        for again in (False, True):
            result = await client.call_tool(
                "propose_plan",
                {
                    "plan": {
                        "hypothesis": "a drafter speeds up greedy decoding",
                        "candidates": ["demo-tiny:draft-k4", "demo-tiny:draft-k2"],
                    }
                },
            )
            proposal = result.structured_content
            assert not result.is_error and proposal["accepted"], proposal
            assert proposal["candidates"] == [
                "baseline",
                "demo-tiny:draft-k4",
                "demo-tiny:draft-k2",
            ]
            status = await wait_sealed(client, proposal["plan_id"])
            cycle_id = status["last_cycle"]["cycle_id"]
            ev = (await client.call_tool("evidence", {"cycle_id": cycle_id})).structured_content
            summary = CycleSummary.model_validate(ev["summary"])
            if again or summary.outcome != Outcome.KEPT_BASELINE:
                break
            print(f"a try kept the baseline: {summary.reason}")  # shown if the test fails

    assert summary.outcome == Outcome.PROMOTED, summary.reason
    assert summary.selected in {"demo-tiny:draft-k4", "demo-tiny:draft-k2"}
    assert summary.speedup_pct is not None and summary.speedup_pct >= 0  # any measured gain
    # Promotion proven on the wire: the stable port now runs the drafter and gives the
    # baseline's greedy tokens.
    record = service_record(home)
    assert record is not None and "--draft-model" in record.argv
    assert active_recipe(home).candidate_id == summary.selected
    assert greedy_ids(config.port) == before
    # The evidence is complete and re-verifiable.
    bundle = evidence.bundle_path(home, cycle_id)
    names = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    assert {
        "plan.json",
        "environment.json",
        "verdict.json",
        "journal.ndjson",
        "summary.json",
        "MANIFEST.json",
        "runs/baseline.json",
    } <= names
    verdict = read_model(bundle / "verdict.json", Verdict)
    winner = next(c for c in verdict.candidates if c.candidate == summary.selected)
    assert {g.gate: g.passed for g in winner.gates}["lossless"] is True
    assert evidence.verify(bundle).ok
    events, problems = home.read_journal(cycle_id)
    assert not problems
    states = [e.state.value for e in events]
    for state in (
        "PREFLIGHT",
        "BASELINE",
        "EXPERIMENT",
        "SELECT",
        "PROMOTE",
        "VERIFY",
        "COMMIT",
        "SEALED",
    ):
        assert state in states
    # One changed byte in a raw sample file and verification fails.
    sample_file = bundle / "runs" / "baseline.json"
    data = bytearray(sample_file.read_bytes())
    index = data.index(b"decode_tps") + 14
    data[index] = ord("9") if data[index] != ord("9") else ord("8")
    sample_file.write_bytes(bytes(data))
    result = evidence.verify(bundle)
    assert not result.ok and any("runs/baseline.json" in p for p in result.problems)


async def test_refused_plans_change_nothing(home: Home) -> None:
    async with Client(build_server(home, start_supervisor=False)) as client:
        cases = [
            {"plan": {"hypothesis": "x", "candidates": ["demo-tiny:nope"]}},
            {"plan": {"hypothesis": "x", "candidates": ["demo-tiny:draft-k4; rm -rf ~"]}},
            {
                "plan": {"hypothesis": "x", "candidates": ["demo-tiny:draft-k4"]},
                "run_as_root": True,
            },
            {
                "plan": {
                    "hypothesis": "x",
                    "candidates": ["demo-tiny:draft-k4"],
                    "launch": {"argv": ["sh", "-c", "id"]},
                }
            },
        ]
        for arguments in cases:
            result = await client.call_tool("propose_plan", arguments)
            content = result.structured_content or {}
            assert result.is_error or content.get("accepted") is False, arguments
            text = json.dumps(content) + "".join(getattr(c, "text", "") for c in result.content)
            assert "rm -rf" not in text and "sh -c" not in text
    assert home.queued() == []
    assert not any(home.cycles.iterdir())
    assert not (home.state / "service.json").exists()  # the service was never touched
    audit = [json.loads(line) for line in home.audit_log.read_text().splitlines()]
    assert len(audit) == 4 and not any(r["accepted"] for r in audit)  # every call is audited


async def test_candidate_that_cannot_start_is_rejected_and_the_baseline_keeps_serving(
    home: Home, demo_models: dict[str, Path]
) -> None:
    # A real models folder whose draft is broken (an unreadable config), target intact.
    home.models.unlink()
    home.models.mkdir()
    (home.models / "target").symlink_to(demo_models["target"], target_is_directory=True)
    shutil.copytree(demo_models["draft"], home.models / "draft")
    (home.models / "draft" / "config.json").write_text("{ not json")
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    async with Client(build_server(home, start_supervisor=False)) as client:
        result = await client.call_tool(
            "propose_plan",
            {"plan": {"hypothesis": "broken drafter", "candidates": ["demo-tiny:draft-k2"]}},
        )
        assert result.structured_content["accepted"]
    (summary,) = supervise(home)
    assert summary.outcome == Outcome.KEPT_BASELINE
    bundle = evidence.bundle_path(home, summary.cycle_id)
    verdict = read_model(bundle / "verdict.json", Verdict)
    (candidate,) = verdict.candidates
    assert candidate.decision.value == "rejected"
    assert any("server did not start" in r for r in candidate.reasons), candidate.reasons
    record = service_record(home)
    assert record is not None and "--draft-model" not in record.argv
    assert greedy_ids(config.port)  # the baseline still answers
    assert not list((home.state / "candidates").glob("*.json"))  # no candidate left running
    assert evidence.verify(bundle).ok
