"""Planning: extracting a plan from what a model writes, and `mcp-infra plan --local`.

`plan --local` runs as a real subprocess that starts `mcp-infra serve` over stdio, gets the
`propose_acceleration_plan` prompt (or builds the numbered menu), asks an OpenAI-compatible
endpoint, and submits through MCP. The demo's tiny model writes gibberish: after one retry the
fallback plan is proposed, and recorded as such. A test-only stand-in endpoint (a few lines of
http.server below) returns a reply that does contain a plan. The table of model-written plans
is tests/core/test_extraction.py; the retry and fallback over HTTP, fast, are
tests/faces/test_self_plan.py.
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
from tests.helpers.mcp_clients import audit, child_env

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


def test_tiny_model_gibberish_ends_in_the_recorded_fallback(home: Home) -> None:
    """The demo's tiny model (random weights) gets the menu, answers gibberish twice, and the
    fallback plan is proposed over MCP: its frozen plan says `planner: fallback` with both of
    the model's answers."""
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    code, result, stderr = run_plan(home, "--max-tokens", "24", "--no-supervisor")
    assert code == 0, stderr
    assert result["form"] == "menu" and result["planner"] == "fallback"
    assert result["endpoint"] == f"http://127.0.0.1:{config.port}/v1"
    assert result["submitted"] is True and result["accepted"] is True
    assert len(result["attempts"]) == 2 and all(a["problems"] for a in result["attempts"])
    assert stderr.count("asking the model at") == 2
    [entry] = home.queued()
    frozen = json.loads(entry.read_text())
    assert frozen["proposed_by"] == "mcp:mcp-infra-plan"
    notes = frozen["proposed"]["notes"]
    assert notes.startswith("planner: fallback\nwhy: ")
    assert "\nmodel answer 1: " in notes and "\nmodel answer 2: " in notes
    [record] = audit(home)
    assert record.client == "mcp:mcp-infra-plan" and record.accepted


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
        home, "--endpoint", url, "--no-supervisor", "--goal", "faster decoding", "--prompt", "json"
    )
    assert code == 0, stderr
    assert result["submitted"] is True and result["accepted"] is True
    assert result["planner"] == "model" and result["form"] == "json"
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


def test_dry_run_then_a_refused_plan_asked_again_then_the_fallback(
    home: Home, stand_in: tuple[str, type[StandIn]]
) -> None:
    url, handler = stand_in
    handler.reply = json.dumps(GOOD)
    code, result, _ = run_plan(home, "--endpoint", url, "--dry-run", "--prompt", "json")
    assert code == 0 and result["submitted"] and result["dry_run"]
    assert result["proposal"]["dry_run"] is True and not home.queued()
    handler.reply = json.dumps({"hypothesis": "warp", "candidates": ["demo-tiny:warp-drive"]})
    code, result, _ = run_plan(home, "--endpoint", url, "--prompt", "json", "--no-supervisor")
    assert code == 0 and result["planner"] == "fallback", result["message"]
    refused = [a["problems"] for a in result["attempts"]]
    assert len(refused) == 2 and all("not a candidate of the registry" in p[0] for p in refused)
    retry = handler.requests[-1]["body"]["messages"][-1]["content"]
    assert retry.startswith("Your answer could not be used: ") and "warp-drive" in retry
    [entry] = home.queued()
    assert json.loads(entry.read_text())["proposed"]["notes"].startswith("planner: fallback")
    assert [r.accepted for r in audit(home)] == [True, False, False, True]


def test_unreachable_model_is_exit_code_6_with_a_hint(home: Home) -> None:
    from mcp_infra.procs.runtime import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    code, result, _ = run_plan(home, "--endpoint", url, "--timeout", "5")
    assert code == 6 and result["error"]["name"] == "UNAVAILABLE"
    assert "nothing answers at" in result["error"]["message"]
    assert "check --endpoint" in result["error"]["message"]
    plain = subprocess.run(  # the managed service is not started: say how to start it
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "plan", "--local"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 6 and "Traceback" not in plain.stderr
    [line] = [x for x in plain.stderr.splitlines() if x.startswith("mcp-infra: error:")]
    assert "service start" in line
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
    menu = subprocess.run(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "plan", "--prompt", "menu"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert menu.returncode == 0 and "\n1. demo-tiny:" in menu.stdout
    assert "Answer with 1 to 3 numbers from the menu" in menu.stdout
