"""Several agents at once: the product's MCP server on streamable HTTP as a real process, and
sessions that propose plans over it at one moment. For `benchmarks/faults.py` ("ten agents")
and tests/e2e/test_agents.py; loopback only, bounded in count and time.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.types import Implementation

from mcp_infra.faces.http_transport import client, default_token_path, read_token
from mcp_infra.flows.status import queued_ids
from mcp_infra.procs.logpipe import spawn_logged
from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.state import evidence
from mcp_infra.state.store import Home

START_S = 60.0  # the HTTP server's start, on a loaded machine
CALL_S = 120.0  # one `propose_plan` call


@dataclass
class HttpFace:
    """`mcp-infra serve --transport http` of a home, on a free loopback port."""

    url: str
    token: str


@contextlib.contextmanager
def http_face(home: Home) -> Iterator[HttpFace]:
    """The home's MCP server on streamable HTTP (propose mode: each accepted plan makes sure of
    a supervisor, as for any agent), stopped when the block ends; its output in
    ``logs/http.log``."""
    port = free_port()
    argv = [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "serve"]
    proc = spawn_logged([*argv, "--transport", "http", "--port", str(port)], home.logs / "http.log")
    try:
        deadline = time.monotonic() + START_S
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start (see {home.logs / 'http.log'})")
            time.sleep(0.1)
        yield HttpFace(f"http://127.0.0.1:{port}/mcp", read_token(default_token_path(home)))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except Exception:
            proc.kill()
            proc.wait()


async def propose_at_once(face: HttpFace, plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One MCP session per plan (client name ``agent-<i>``), every one opened first; then each
    calls `propose_plan` at the same moment. Each answer's structured content, with
    ``is_error``, in the order of ``plans``."""
    answers: list[dict[str, Any]] = [{} for _ in plans]
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                client(
                    face.url,
                    face.token,
                    client_info=Implementation(name=f"agent-{i}", version="1"),
                    read_timeout_seconds=CALL_S,
                )
            )
            for i in range(len(plans))
        ]
        go = anyio.Event()

        async def agent(i: int) -> None:
            await go.wait()
            result = await sessions[i].call_tool("propose_plan", {"plan": plans[i]})
            answers[i] = {"is_error": result.is_error, **(result.structured_content or {})}

        async with anyio.create_task_group() as group:
            for i in range(len(plans)):
                group.start_soon(agent, i)
            await anyio.sleep(0.2)  # every agent waits at the gate
            go.set()
    return answers


def agent_plans(agents: int) -> list[dict[str, Any]]:
    """What ``agents`` agents propose: runnable plans (two drafters in turn), the last one
    naming no candidate of the registry (refused, with the reason)."""
    plans: list[dict[str, Any]] = []
    for i in range(agents - 1):
        drafter = "demo-tiny:draft-k2" if i % 2 else "demo-tiny:draft-k4"
        plans.append(
            {"hypothesis": f"agent {i}: a drafter speeds up decoding", "candidates": [drafter]}
        )
    plans.append({"hypothesis": "a drafter that does not exist", "candidates": ["demo-tiny:k99"]})
    return plans


@dataclass
class Tally:
    """Each plan the agents proposed, accounted for: refused (with the reason), queued, or run
    (sealed cycles of it), and whether anything was lost or run twice."""

    accepted: list[str]
    refused: list[str]  # the reasons
    positions: list[int]  # the queue positions the accepted were told, sorted
    runs: dict[str, int]  # sealed cycles per accepted plan id
    queued: list[str]  # accepted plan ids still waiting
    verified: int  # sealed bundles of the home that verify
    sealed: int

    @property
    def lost(self) -> list[str]:
        return [p for p in self.accepted if self.runs[p] == 0 and p not in self.queued]

    @property
    def twice(self) -> list[str]:
        return [p for p in self.accepted if self.runs[p] + self.queued.count(p) > 1]


def tally(home: Home, answers: list[dict[str, Any]]) -> Tally:
    """What became of the agents' plans (``propose_at_once``'s answers) in ``home``."""
    accepted = [a["plan_id"] for a in answers if a.get("accepted")]
    sealed = evidence.list_cycles(home)
    waiting = queued_ids(home)
    return Tally(
        accepted=accepted,
        refused=[str(a.get("message", "")) for a in answers if not a.get("accepted")],
        positions=sorted(a["queue_position"] for a in answers if a.get("accepted")),
        runs={p: sum(s.plan_id == p for s in sealed) for p in accepted},
        queued=[p for p in waiting if p in accepted],
        verified=sum(evidence.verify(evidence.bundle_path(home, s.cycle_id)).ok for s in sealed),
        sealed=len(sealed),
    )
