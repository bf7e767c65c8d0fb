"""The MCP front: four tools over the same functions the CLI calls (``app``).

The server reads state and queues frozen plans; it never touches the service. Every plan is
untrusted: unknown top-level arguments are refused by a middleware (the SDK would silently drop
them), and plan validation errors are written by us without echoing the input back.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, WithJsonSchema

from mcp_infra import app
from mcp_infra.contracts import Plan
from mcp_infra.store import CorruptFile, Home

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)
PROPOSE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                          open_world_hint=False)

TOOL_ARGUMENTS = {
    "status": set(),
    "registry": {"candidate_id"},
    "evidence": {"cycle_id", "section", "page"},
    "propose_plan": {"plan", "dry_run"},
}

INSTRUCTIONS = (
    "mcp-infra measures and switches the configuration of a local LLM service. Read `status` "
    "(what serves now, any cycle in progress), `registry` (candidates, whether each passes "
    "preflight on this machine, and what past cycles learned), and `evidence` (sealed results). "
    "`propose_plan` queues an experiment of 1-3 registry candidates; deterministic code then "
    "measures them against the live baseline, gates them, and promotes a winner only if it "
    "qualifies. Keeping the baseline is a valid result."
)


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A self-contained JSON schema (no $defs) for embedding as a property's schema."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(copy.deepcopy(defs[node["$ref"].split("/")[-1]]))
            return {k: resolve(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


PLAN_SCHEMA = _inline_refs(Plan.model_json_schema())
PlanArgument = Annotated[
    dict[str, Any] | str,
    WithJsonSchema({"anyOf": [PLAN_SCHEMA, {"type": "string",
                                             "description": "the same plan as a JSON string"}]}),
    Field(description="The plan: {hypothesis: one line, candidates: 1-3 registry candidate ids "
          "(manifest:variant), acceptance?: {min_speedup_pct?, max_peak_memory_gb?}, notes?}. "
          "Thresholds can only be tightened, never loosened."),
]


class RejectUnknownArguments:
    """Refuse a tools/call whose arguments name a parameter the tool does not have."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "tools/call" and isinstance(ctx.params, dict):
            name = ctx.params.get("name")
            args = ctx.params.get("arguments") or {}
            allowed = TOOL_ARGUMENTS.get(name) if isinstance(name, str) else None
            if allowed is not None and isinstance(args, dict):
                unknown = [k for k in args if k not in allowed]
                if unknown:
                    shown = ", ".join(k[:40] for k in sorted(unknown)[:5])
                    text = (f"refused: unknown argument(s) for {name}: {shown}. "
                            f"Allowed: {', '.join(sorted(allowed)) or 'none'}.")
                    return CallToolResult(content=[TextContent(type="text", text=text)],
                                          is_error=True)
        return await call_next(ctx)


def _client_name(ctx: Context | None) -> str:
    try:
        params = ctx.request_context.connection.client_params  # type: ignore[union-attr]
        info = params.client_info if params else None
        if info is not None:
            return f"mcp:{info.name}"[:200]
    except AttributeError:
        pass
    return "mcp:unknown-client"


def build_server(home: Home, mode: Literal["read-only", "propose", "autonomous"] = "propose",
                 start_supervisor: bool = True) -> MCPServer:
    server = MCPServer("mcp-infra", version="0.1.0", instructions=INSTRUCTIONS,
                       middleware=[RejectUnknownArguments()])

    @server.tool(title="Service status", annotations=READ_ONLY)
    def status() -> app.StatusView:
        """What serves on the stable port now (endpoint, health, active recipe, since when), the
        cycle in progress (state, candidate being measured), the queue, the last cycle's outcome,
        and the policy with its maintenance window."""
        try:
            return app.status(home)
        except CorruptFile as exc:
            raise ToolError(f"state file unreadable: {exc}") from exc

    @server.tool(title="Candidate registry", annotations=READ_ONLY)
    def registry(candidate_id: Annotated[str | None, Field(
            max_length=130, description="one candidate id (manifest:variant); omit for all")] = None
                 ) -> app.RegistryView:
        """Every candidate (id manifest:variant) with class, semantics (lossless: greedy output
        must equal the baseline's; lossy: quality budget), launch knobs, each preflight check on
        this machine with its reason, and what past cycles decided about it."""
        view = app.registry_view(home, candidate_id)
        if candidate_id and not view.candidates:
            raise ToolError("no such candidate; call registry without arguments to list them")
        return view

    @server.tool(title="Cycle evidence", annotations=READ_ONLY)
    def evidence(
        cycle_id: Annotated[str | None, Field(max_length=80, pattern=r"^[A-Za-z0-9_.-]+$",
                            description="a cycle id; omit to list recent cycles")] = None,
        section: Annotated[app.Section | None,
                           Field(description="which part of one cycle's evidence")] = None,
        page: Annotated[int, Field(ge=1, le=10_000, description="page of the journal")] = 1,
    ) -> app.EvidenceView:
        """Sealed evidence: without cycle_id, the recent cycles and their outcomes; with it, the
        summary, per-prompt speed table, gates (with the first divergence of any greedy output),
        verdict with reasons, frozen plan, or the journal (paginated)."""
        try:
            return app.evidence_view(home, cycle_id, section, page)
        except FileNotFoundError as exc:
            raise ToolError(str(exc)) from exc

    if mode != "read-only":

        @server.tool(title="Propose an experiment plan", annotations=PROPOSE)
        def propose_plan(plan: PlanArgument, dry_run: bool = False,
                         ctx: Context | None = None) -> app.ProposalView:
            """Queue an experiment: 1-3 registry candidates to measure against the live baseline.
            Code sanitizes the plan (unknown ids refused, baseline first, duplicates dropped,
            thresholds clamped and only ever tightened), freezes it, and a supervisor runs it in
            the background; this returns at once with the plan id, every change and why. Use
            dry_run=true to see the sanitized plan without queuing. Follow with `status`."""
            return app.propose(home, plan, proposed_by=_client_name(ctx), dry_run=dry_run,
                               start_supervisor=start_supervisor)

    return server
