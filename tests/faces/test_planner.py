"""Planning: extracting a plan from what a model writes, and `mcp-infra plan --local`.

`plan --local` runs as a real subprocess that starts `mcp-infra serve` over stdio, gets the
`propose_acceleration_plan` prompt, asks an OpenAI-compatible endpoint, and submits through MCP.
The demo's tiny model writes gibberish: its reply must change nothing. A test-only stand-in
endpoint (a few lines of http.server below) returns a reply that does contain a plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mcp_infra.core.extraction import extract_plan
from mcp_infra.core.gates import strip_thinking
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import audit, child_env, files_under

GOOD = {"hypothesis": "A 4-token drafter is faster", "candidates": ["demo-tiny:draft-k4"]}
DECOY = {"hypothesis": "thinking aloud", "candidates": ["demo-tiny:kv8"]}


# --------------------------------------------------------------------------------------------
# extraction (pure)
# --------------------------------------------------------------------------------------------


def test_plain_json_reply() -> None:
    got = extract_plan(json.dumps(GOOD))
    assert got.plan == GOOD and got.source == "inline"


def test_thinking_blocks_are_ignored() -> None:
    reply = f"<think>maybe {json.dumps(DECOY)} or not</think>\nHere it is: {json.dumps(GOOD)}"
    assert extract_plan(reply).plan == GOOD
    # a template that opens the block in the prompt: only the closing tag is in the reply
    assert extract_plan(f"{json.dumps(DECOY)} hmm</think>{json.dumps(GOOD)}").plan == GOOD
    # a reply cut off while thinking has no answer
    cut = extract_plan(f"<think>I will propose {json.dumps(GOOD)} soon")
    assert cut.plan is None and cut.problems
    assert strip_thinking("<THINKING>x</THINKING>answer") == "answer"
    harmony = (
        f"<|channel|>analysis<|message|>{json.dumps(DECOY)}<|end|><|start|>assistant"
        f"<|channel|>final<|message|>{json.dumps(GOOD)}"
    )
    assert extract_plan(harmony).plan == GOOD


def test_code_fences_and_prose() -> None:
    reply = (
        "Sure! Based on the context, the best experiment is below.\n\n```json\n"
        + json.dumps(GOOD, indent=2)
        + "\n```\n\nThis keeps outputs identical {as required}."
    )
    got = extract_plan(reply)
    assert got.plan == GOOD and got.source == "fenced"
    unlabeled = "Plan:\n```\n" + json.dumps(GOOD) + "\n```"
    assert extract_plan(unlabeled).plan == GOOD
    fenced_wins = f"Earlier idea {json.dumps(DECOY)}.\n```json\n{json.dumps(GOOD)}\n```"
    assert extract_plan(fenced_wins).plan == GOOD


def test_last_valid_plan_wins_and_wrappers() -> None:
    reply = f"First draft: {json.dumps(DECOY)}\nFinal answer: {json.dumps(GOOD)}"
    assert extract_plan(reply).plan == GOOD
    assert extract_plan(json.dumps({"plan": GOOD})).plan == GOOD
    nested = {
        "hypothesis": "h",
        "candidates": ["demo-tiny:draft-k2"],
        "acceptance": {"min_speedup_pct": 10},
    }
    assert extract_plan(f"ok {json.dumps(nested)} done").plan == nested
    invalid_after = f"{json.dumps(GOOD)} then {json.dumps({**GOOD, 'candidates': []})}"
    assert extract_plan(invalid_after).plan == GOOD


def test_no_usable_plan_is_said_not_guessed() -> None:
    for reply in (
        "",
        "   ",
        "speed speed nemau world di is riser",
        "{not json}",
        '{"answer": 42}',
        "[1, 2, 3]",
    ):
        got = extract_plan(reply)
        assert got.plan is None and got.problems, reply
    invalid = extract_plan(json.dumps({"hypothesis": "h", "candidates": ["a:b"] * 17}))
    assert invalid.plan is None
    assert any("candidates: at most 16 items, got 17" in p for p in invalid.problems)
    extra = extract_plan(json.dumps({**GOOD, "shell": "rm -rf /"}))
    assert extra.plan is None and any("unknown field" in p for p in extra.problems)
    assert not any("rm -rf" in p for p in extra.problems)


# --------------------------------------------------------------------------------------------
# plan --local, end to end
# --------------------------------------------------------------------------------------------


class StandIn(BaseHTTPRequestHandler):
    """A test-only OpenAI-compatible endpoint that answers every chat with `reply`.

    Stand-in, and why: the planner's job is to turn a model's reply into a plan and submit it
    over MCP. A real model that writes a valid plan for this registry does not run on this CPU
    (the demo models write gibberish by design; see test_tiny_model_reply_changes_nothing for a
    real one), so the reply is fixed here; everything after the HTTP reply is the real code."""

    reply = ""
    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        data = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": type(self).reply},
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[tuple[str, type[StandIn]]]:
    handler = type("Handler", (StandIn,), {"reply": "", "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def run_plan(home: Home, *args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcp_infra",
            "--home",
            str(home.root),
            "plan",
            "--local",
            "--json",
            *args,
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, json.loads(result.stdout), result.stderr


def test_tiny_model_reply_changes_nothing(home: Home) -> None:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    plans_before = files_under(home.plans)
    code, result, stderr = run_plan(home, "--max-tokens", "48")
    assert code == 1, stderr
    assert result["submitted"] is False and result["accepted"] is False
    assert result["endpoint"] == f"http://127.0.0.1:{config.port}/v1"
    assert "no usable plan" in result["message"] and "nothing was proposed" in result["message"]
    assert result["reply_excerpt"], "the tiny model did answer (with gibberish)"
    assert result["extraction"]["plan"] is None
    assert files_under(home.plans) == plans_before and not home.queued()
    assert audit(home) == [], "propose_plan was never called"
    assert not home.lock_is_held()


def test_a_reply_with_a_plan_is_submitted_through_mcp(
    home: Home, stand_in: tuple[str, type[StandIn]]
) -> None:
    url, handler = stand_in
    handler.reply = (
        f"<think>Let me consider {json.dumps(DECOY)}… no, lossy.</think>\n"
        "Given the measurements, I propose:\n```json\n"
        + json.dumps(GOOD)
        + "\n```\nIt should pass the lossless gate."
    )
    code, result, stderr = run_plan(
        home, "--endpoint", url, "--no-supervisor", "--goal", "faster decoding"
    )
    assert code == 0, stderr
    assert result["submitted"] is True and result["accepted"] is True
    assert result["extraction"]["source"] == "fenced"
    proposal = result["proposal"]
    assert proposal["candidates"] == ["baseline", "demo-tiny:draft-k4"]
    assert proposal["queue_position"] == 1
    [entry] = home.queued()
    frozen = json.loads(entry.read_text())
    assert frozen["proposed_by"] == "mcp:mcp-infra-plan"
    assert frozen["proposed"] == {**GOOD, "acceptance": None, "notes": ""}
    [record] = audit(home)
    assert record.client == "mcp:mcp-infra-plan" and record.plan_id == proposal["plan_id"]
    [request] = handler.requests
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert body["temperature"] == 0 and "model" not in body
    prompt = body["messages"][0]["content"]
    assert "Goal: faster decoding" in prompt and "- demo-tiny:draft-k4:" in prompt
    assert "## Policy test" in prompt and "propose_plan" in prompt


def test_dry_run_and_refused_plans_queue_nothing(
    home: Home, stand_in: tuple[str, type[StandIn]]
) -> None:
    url, handler = stand_in
    handler.reply = json.dumps(GOOD)
    code, result, _ = run_plan(home, "--endpoint", url, "--dry-run")
    assert code == 0 and result["submitted"] and result["dry_run"]
    assert result["proposal"]["dry_run"] is True and not home.queued()
    handler.reply = json.dumps({"hypothesis": "warp", "candidates": ["demo-tiny:warp-drive"]})
    code, result, _ = run_plan(home, "--endpoint", url)
    assert code == 1 and result["submitted"] and not result["accepted"]
    assert "not a candidate of the registry" in json.dumps(result["proposal"]["problems"])
    assert not home.queued()
    handler.reply = "I cannot help with that."
    code, result, _ = run_plan(home, "--endpoint", url)
    assert code == 1 and not result["submitted"]
    assert [r.accepted for r in audit(home)] == [True, False]


def test_unreachable_model_changes_nothing(home: Home) -> None:
    from mcp_infra.procs.runtime import free_port

    code, result, _ = run_plan(
        home, "--endpoint", f"http://127.0.0.1:{free_port()}/v1", "--timeout", "5"
    )
    assert code == 1 and not result["submitted"]
    assert "did not answer" in result["message"]
    assert not home.queued() and audit(home) == []


def test_plan_without_local_prints_the_prompt(home: Home) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcp_infra",
            "--home",
            str(home.root),
            "plan",
            "--goal",
            "short answers",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert "Goal: short answers" in result.stdout and "## Your answer" in result.stdout
