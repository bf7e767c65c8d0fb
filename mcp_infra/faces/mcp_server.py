"""The MCP server: the tools (``mcp_tools``), the resources (``mcp_resources``), the live
status (``live_status``) and one prompt over the functions the CLI calls.

The server reads state and queues frozen plans; it never touches the service. Everything a client
sends is untrusted: ``mcp_guard`` checks every call before the SDK sees it and answers in our own
words; plan content is judged by ``sanitize``; nothing in a plan reaches a command line; every
``propose_plan`` call, refused ones included, is audited.

Modes: ``read-only`` (no ``propose_plan``), ``propose`` (plans are queued; the supervisor runs
them when the policy's window allows), ``autonomous`` (the same, and a watching supervisor is
kept running).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp_types import INVALID_PARAMS
from pydantic import Field

from mcp_infra import __version__
from mcp_infra.contracts import text_problem
from mcp_infra.faces import render
from mcp_infra.faces.live_status import register_status
from mcp_infra.faces.mcp_guard import ArgumentGuard, one_line_logging, protocol_error
from mcp_infra.faces.mcp_resources import register_resources
from mcp_infra.faces.mcp_tools import BROKEN, MODES, Mode, ServerEnv, Tools, register_tools
from mcp_infra.flows import api as app
from mcp_infra.flows import planning
from mcp_infra.state.store import Home

__all__ = ["MODES", "Mode", "ServeOptions", "build_server", "serve"]


def build_server(
    home: Home, mode: Mode = "propose", start_supervisor: bool = True, *, warm: bool = False
) -> MCPServer:
    """The MCP server for one home directory. ``start_supervisor=False`` only queues plans
    (someone runs `mcp-infra supervise`); ``warm`` computes the registry in the background
    as it starts (`serve`: a session's first `registry` call then finds it kept)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    one_line_logging()
    env = ServerEnv(home, mode, start_supervisor)
    guard = ArgumentGuard(home, {}, {planning.PROMPT_NAME})
    server = MCPServer(
        "mcp-infra",
        version=__version__,
        instructions=render.server_instructions(mode),
        middleware=[guard],
        log_level="WARNING",
    )
    guard.models.update(register_tools(server, env))
    register_resources(server, env)
    server.status_notifier = register_status(server, home, mode)  # type: ignore[attr-defined]
    register_prompt(server, env)
    if warm:
        Tools(env).warm()
    return server


def register_prompt(server: MCPServer, env: ServerEnv) -> None:
    @server.prompt(
        name=planning.PROMPT_NAME,
        title="Plan an acceleration experiment",
        description="Instructions for a planner with the live context (candidates that pass "
        "preflight, the baseline's figures, past cycles, the policy's bounds); the answer is "
        "one JSON plan for propose_plan.",
    )
    def propose_acceleration_plan(
        goal: Annotated[
            str | None,
            Field(description="optional, one line: what to optimize (at most 500 characters)"),
        ] = None,
    ) -> list[UserMessage]:
        if goal is not None and len(goal) > planning.MAX_GOAL:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"goal is too long (at most {planning.MAX_GOAL} characters)",
            )
        if goal is not None and (problem := text_problem(goal)):
            raise protocol_error(f"goal {problem}")
        if not env.home.config.exists():  # a fresh home: say what is missing, as the prompt
            return [UserMessage(render.unconfigured_prompt(env.home))]
        try:
            context = planning.build_context(env.home)
        except BROKEN as exc:
            raise MCPError(code=INVALID_PARAMS, message=render.cannot_read_own_files(exc)) from exc
        can_propose = env.mode != "read-only"
        return [UserMessage(render.planning_prompt(context, goal, can_propose=can_propose))]


SWITCH_INTERVAL_S = 0.0005
"""How long a thread of the server may hold the interpreter lock while another waits for it.
Reads answer while other threads compute (the registry's refresh, the warm-up): a read that
comes back from a file or a socket waits for the lock up to this long each time, and a read
makes dozens of such calls. Python's default, 5 ms, made a `registry` read that met a refresh
take 40-100 ms; a shorter interval costs the computing thread only more lock hand-overs."""


@dataclass(frozen=True)
class ServeOptions:
    """How `mcp-infra serve` runs: one field per option of the command."""

    mode: Mode = "propose"
    transport: str = "stdio"
    host: str = "127.0.0.1"
    port: int = 8765
    token_file: str | None = None
    allowed_hosts: Sequence[str] = ()
    allowed_origins: Sequence[str] = ()
    start_supervisor: bool = True
    auth: str = "token"


def serve(home: Home, options: ServeOptions) -> int:
    """`mcp-infra serve`: stdio (stdout is the wire: nothing else is printed there) or HTTP."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = build_server(home, options.mode, options.start_supervisor, warm=True)
    if options.mode == "autonomous" and options.start_supervisor:
        app.ensure_watcher(home)
    if options.transport == "stdio":
        import anyio

        from mcp_infra.faces.stdio_drain import run_stdio

        anyio.run(run_stdio, server)  # every request read is answered before it exits
        return 0
    from mcp_infra.faces.http_transport import HttpPlan, serve_http

    plan = HttpPlan(  # HttpConfigError: a usage error of the command line (exit 2)
        home,
        host=options.host,
        port=options.port,
        token_file=options.token_file,
        allowed_hosts=options.allowed_hosts,
        allowed_origins=options.allowed_origins,
        auth=options.auth,
    )
    serve_http(server, plan, options.mode)  # PortBusy: exit 6
    return 0
