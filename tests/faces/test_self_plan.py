"""The served model plans for itself (issue 37 item 4), fast: the menu prompt, the retry with
the error quoted, and the fallback, over real HTTP.

The model is a real local HTTP server (http.server) that answers the OpenAI chat API with
scripted replies, in order: what a small model writes is fixed here so every branch runs (the
real SmolLM2 is in the last test, slow, and benchmarks/self_plan.py). The questions go out
through the product's own ``ask_model``; plans go to the product's own ``propose`` on a real
home (in process: the MCP round trip is the slow tests' part, here and in
tests/faces/test_planner.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_infra.contracts import FrozenPlan, JSONValue
from mcp_infra.core.menu import Menu, MenuItem
from mcp_infra.demo.homes import make_home, stop_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.demo.smollm import RealModel
from mcp_infra.faces.planner import (
    Conversation,
    LocalPlanOptions,
    ModelUnreachable,
    Outcome,
    Submitted,
    asker,
    converse,
)
from mcp_infra.faces.render import menu_prompt, plan_example
from mcp_infra.flows import api as app
from mcp_infra.flows.own import init_model
from mcp_infra.flows.planning import build_context, menu_of
from mcp_infra.procs.runtime import free_port
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, read_model
from tests.helpers.mcp_clients import child_env


class ScriptedModel(BaseHTTPRequestHandler):
    """Answers each chat completion with the next scripted reply (the last one repeats); a
    reply of None is an HTTP 500."""

    replies: list[str | None] = []
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        cls.bodies.append(body)
        reply = cls.replies[min(len(cls.bodies), len(cls.replies)) - 1]
        if reply is None:
            self.send_error(500, "scripted failure")
            return
        message = {"role": "assistant", "content": reply}
        data = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def model() -> Iterator[tuple[str, type[ScriptedModel]]]:
    handler = type("Scripted", (ScriptedModel,), {"replies": [], "bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def planning_home(tmp_path: Path) -> Home:
    """A home with the demo models built and nothing started (no server is needed to plan)."""
    return make_home(tmp_path / "home", build_demo_models(tmp_path / "models"))


def run(home: Home, url: str, form: str = "menu") -> tuple[Outcome, list[FrozenPlan]]:
    context = build_context(home)
    menu = menu_of(context)

    async def submit(plan: dict[str, JSONValue]) -> Submitted:
        view = app.propose(home, plan, proposed_by="test", start_supervisor=False)
        return Submitted(view.accepted, view.message, view.model_dump(mode="json"), view.problems)

    ask = asker(home, url, LocalPlanOptions(endpoint=url), 64, lambda _m: None)
    talk = Conversation(ask, submit, form, menu, plan_example(context))  # type: ignore[arg-type]
    first = menu_prompt(menu) if form == "menu" else "Answer with a JSON plan."
    outcome = anyio.run(converse, talk, [{"role": "user", "content": first}])
    return outcome, [read_model(p, FrozenPlan) for p in home.queued()]


def test_the_menu_prompt_is_one_line_per_candidate(planning_home: Home) -> None:
    context = build_context(planning_home)
    menu = menu_of(context)
    prompt = menu_prompt(menu, "short chat turns")
    assert [i.id for i in menu.items] == [c.id for c in context.runnable]
    for n, c in enumerate(context.runnable, 1):
        kind = "lossy" if c.semantics == "lossy" else "lossless"
        assert f"\n{n}. {c.id}: {c.title} ({c.candidate_class}, {kind}, untried)\n" in prompt
    assert "Goal: short chat turns." in prompt
    assert prompt.endswith("Answer with 1 to 3 numbers from the menu and nothing else.")
    assert len(prompt) < 1500, "a small model's prompt stays short"
    seen = MenuItem(
        id="m:a", title="A", candidate_class="kv_cache", lossy=True, last_verdict="rejected -4.1%"
    )
    assert "1. m:a: A (kv_cache, lossy, last rejected -4.1%)" in menu_prompt(Menu(items=[seen]))


def test_a_menu_answer_is_the_plan(
    planning_home: Home, model: tuple[str, type[ScriptedModel]]
) -> None:
    url, handler = model
    handler.replies = ["Candidates: 2 and 5"]
    outcome, queued = run(planning_home, url)
    ids = [i.id for i in menu_of(build_context(planning_home)).items]
    assert outcome.planner == "model" and len(handler.bodies) == 1
    [frozen] = queued
    assert frozen.candidates == ["baseline", ids[1], ids[4]]
    assert frozen.proposed.notes.startswith("planner: served model (menu answer)")
    assert handler.bodies[0]["temperature"] == 0 and handler.bodies[0]["max_tokens"] == 64


def test_one_retry_quotes_the_error(
    planning_home: Home, model: tuple[str, type[ScriptedModel]]
) -> None:
    url, handler = model
    handler.replies = ["I like the fast ones.", "1"]
    outcome, [frozen] = run(planning_home, url)
    assert outcome.planner == "model" and len(handler.bodies) == 2
    question = handler.bodies[1]["messages"]
    assert [m["role"] for m in question] == ["user", "assistant", "user"]
    assert question[1]["content"] == "I like the fast ones."
    assert question[2]["content"].startswith(
        "Your answer could not be used: expected the numbers (or ids) of 1 to 3 candidates "
        "from the menu (1 to 5)"
    )
    assert [a.problems != [] for a in outcome.attempts] == [True, False]
    assert len(frozen.candidates) == 2


def test_after_the_retry_the_fallback_is_proposed_and_recorded(
    planning_home: Home, model: tuple[str, type[ScriptedModel]]
) -> None:
    url, handler = model
    handler.replies = ["speed speed nemau", "JSON schemas are " + "very " * 400 + "useful"]
    outcome, [frozen] = run(planning_home, url)
    assert outcome.planner == "fallback" and len(handler.bodies) == 2
    runnable = [c.id for c in build_context(planning_home).runnable]
    assert frozen.candidates == ["baseline", *runnable[:3]]  # untried all: catalog order
    notes = frozen.proposed.notes
    assert notes.startswith("planner: fallback\nwhy: expected the numbers (or ids) of 1 to 3")
    assert "\nmodel answer 1: speed speed nemau\n" in notes
    answer_2 = notes.split("\nmodel answer 2: ", 1)[1]
    assert answer_2.startswith("JSON schemas are very") and answer_2.endswith("…")
    assert len(answer_2) == 501, "the raw answer is kept, bounded"
    assert frozen.proposed_by == "test" and frozen.proposed.hypothesis.startswith("fallback:")


def test_a_refused_plan_is_asked_again_with_the_refusal(
    planning_home: Home, model: tuple[str, type[ScriptedModel]]
) -> None:
    url, handler = model
    warp = json.dumps({"hypothesis": "warp", "candidates": ["demo-tiny:warp-drive"]})
    good = "{'hypothesis': 'drafts', 'candidates': ['demo-tiny:draft-k4',],}"  # a Python dict
    handler.replies = [warp, good]
    outcome, [frozen] = run(planning_home, url, form="json")
    assert outcome.planner == "model"
    retry = handler.bodies[1]["messages"][2]["content"]
    assert "not a candidate of the registry" in retry
    assert '"candidates": ["demo-tiny:' in retry, "the JSON form's retry shows an example"
    assert frozen.candidates == ["baseline", "demo-tiny:draft-k4"]


def test_no_answer_proposes_nothing(
    planning_home: Home, model: tuple[str, type[ScriptedModel]]
) -> None:
    url, handler = model
    handler.replies = [None]
    outcome, queued = run(planning_home, url)
    assert outcome.planner == "none" and outcome.submitted is None and queued == []
    assert outcome.failure.startswith("the model did not answer: HTTPStatusError")


def test_a_model_nobody_serves_is_unavailable_with_a_hint(planning_home: Home) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    messages = [{"role": "user", "content": "1?"}]
    served = asker(planning_home, url, LocalPlanOptions(), 8, lambda _m: None)
    with pytest.raises(ModelUnreachable, match=r"service start` \(`mcp-infra status`"):
        anyio.run(served, messages)
    other = asker(planning_home, url, LocalPlanOptions(endpoint=url), 8, lambda _m: None)
    with pytest.raises(ModelUnreachable, match="check --endpoint"):
        anyio.run(other, messages)


def test_the_served_smollm2_plans_from_the_menu_or_the_fallback_is_recorded(
    real_model: RealModel, tmp_path: Path
) -> None:
    """Slow, the real model: SmolLM2-135M-Instruct (its bf16 conversion, made the home's own
    model by `init --model`) answers the menu through `mcp-infra plan --local`; its answer is a
    valid plan of its generated catalog, or the fallback is proposed and recorded as such.
    benchmarks/self_plan.py counts five tries (docs/benchmarks.md)."""
    home = make_home(tmp_path / "home", build_demo_models(tmp_path / "models"))
    init_model(home, str(real_model.source))
    config = load_config(home)
    command = [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "plan", "--local"]
    try:
        ensure_serving(home, config.baseline, config)
        done = subprocess.run(
            [*command, "--json", "--no-supervisor"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        stop_home(home)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["form"] == "menu" and result["accepted"], result["message"]
    [entry] = home.queued()
    frozen = read_model(entry, FrozenPlan)
    assert frozen.proposed_by == "mcp:mcp-infra-plan"
    assert all(c.startswith("own-") for c in frozen.candidates[1:]), "the generated catalog"
    if result["planner"] == "model":
        assert frozen.proposed.notes.startswith("planner: served model (menu answer)")
    else:
        assert result["planner"] == "fallback" and len(result["attempts"]) == 2
        assert frozen.proposed.notes.startswith("planner: fallback\nwhy: ")
