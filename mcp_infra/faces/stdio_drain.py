"""Stdio for the MCP server that answers every request it read before it exits.

The SDK's stdio loop ends when stdin closes, cancelling whatever requests are still running: a
client that writes its requests and closes its end (a pipe, a script, a host that shuts down)
loses the last answers. Here the wire is relayed through two streams: the relay counts the
requests that came in and the answers that went out, and it passes end-of-input on to the server
only once every request read has been answered (or ``grace_s`` has passed).
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

GRACE_S = 300.0  # longest a read request may still run after stdin closed


class Relay:
    """The ids of requests read and not yet answered."""

    def __init__(self) -> None:
        self.pending: set[Any] = set()
        self.drained = anyio.Event()

    def read(self, item: SessionMessage | Exception) -> None:
        if isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCRequest):
            self.pending.add(item.message.id)

    def wrote(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            self.pending.discard(message.id)
            if not self.pending:
                self.drained.set()
                self.drained = anyio.Event()

    async def wait_drained(self, grace_s: float) -> None:
        with anyio.move_on_after(grace_s):
            while self.pending:
                await self.drained.wait()


async def run_stdio(server: MCPServer, grace_s: float = GRACE_S) -> None:
    """``server.run()`` for stdio, draining in-flight requests at end of input."""
    relay = Relay()
    async with stdio_server() as (wire_in, wire_out):
        to_server, server_in = create_context_streams[SessionMessage | Exception](0)
        server_out, from_server = create_context_streams[SessionMessage](0)

        async def pump_in() -> None:
            async with to_server:
                async for item in wire_in:
                    relay.read(item)
                    await to_server.send(item)
                await relay.wait_drained(grace_s)

        async def pump_out() -> None:
            async with from_server:
                async for item in from_server:
                    await wire_out.send(item)
                    relay.wrote(item)

        low = server._lowlevel_server
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump_in)
            tg.start_soon(pump_out)
            async with server_out:
                await low.run(server_in, server_out, low.create_initialization_options())
        await wire_out.aclose()
