"""The MCP front: four tools, four resources and one prompt over the functions the CLI calls.

The server reads state and queues frozen plans; it never touches the service. Everything a client
sends is untrusted: ``ArgumentGuard`` validates every tool call's arguments before the SDK sees
them (unknown top-level arguments, which the SDK would silently drop, wrong types, unbounded
strings, non-finite numbers) and answers with messages written here that never repeat the input.
Plan content is judged by ``policy.parse_plan`` and ``policy.sanitize``; nothing in a plan ever
reaches a command line. Every ``propose_plan`` call, refused ones included, is audited.

Modes: ``read-only`` (no ``propose_plan``), ``propose`` (plans are queued; the supervisor runs
them when the policy's window allows), ``autonomous`` (the same, and a watching supervisor is
kept running).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
import yaml
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    Completion,
    ResourceTemplateReference,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from mcp_infra import __version__
from mcp_infra.contracts import AuditRecord, text_problem
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.preflight import manifest_hash
from mcp_infra.core.sanitize import (
    MAX_PLAN_BYTES,
    PlanRefused,
    check_shape,
    has_non_finite,
    limit_words,
    policy_hash,
    shown_name,
)
from mcp_infra.faces import render
from mcp_infra.faces.live_status import STATUS_URI, StatusNotifier
from mcp_infra.faces.read_cache import ReadCache, registry_inputs
from mcp_infra.flows import api as app
from mcp_infra.flows import planning
from mcp_infra.state.catalog import RegistryError, load_registry
from mcp_infra.state.context import HomeContext
from mcp_infra.state.store import CorruptFile, Home, utcnow

Mode = Literal["read-only", "propose", "autonomous"]
MODES: tuple[str, ...] = ("read-only", "propose", "autonomous")
URI = "mcp-infra://"
CYCLE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
logger = logging.getLogger("mcp_infra.server")


def _one_line_logging() -> None:
    """Refusals are logged as one plain line on stderr (the SDK's Rich handler wraps long lines;
    stdout is the stdio wire)."""
    if not logger.handlers:
        import sys

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)


READ_ONLY = ToolAnnotations(
    title=None,
    read_only_hint=True,
    destructive_hint=False,
    idempotent_hint=True,
    open_world_hint=False,
)
PROPOSE = ToolAnnotations(
    title=None,
    read_only_hint=False,
    destructive_hint=True,
    idempotent_hint=False,
    open_world_hint=False,
)


def instructions(mode: str) -> str:
    text = (
        "mcp-infra measures and switches the configuration of a local LLM service (a local "
        "OpenAI-compatible server). Read `status` (what serves now, any cycle in progress), "
        "`registry` (candidate configurations, whether each passes preflight on this machine, "
        "what past cycles learned) and `evidence` (sealed results of past cycles). The prompt "
        "`propose_acceleration_plan` gives planning instructions with the live context."
    )
    if mode == "read-only":
        return text + " This server is read-only: it cannot queue experiments."
    return text + (
        " `propose_plan` queues an experiment of 1-16 registry candidates; deterministic code then "
        "measures them against the live baseline, gates them, and promotes a winner only if it "
        "qualifies (a plan of 4 or more is screened first: every gate and one short start each "
        "drop the clear losers). Keeping the baseline is a valid result. Plans run when the "
        "policy's maintenance window allows; `propose_plan` returns at once."
    )


# ---------------------------------------------------------------------------------------------
# Argument validation (before the SDK, with our own messages)
# ---------------------------------------------------------------------------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StatusArgs(_Args):
    pass


class RegistryArgs(_Args):
    candidate_id: str | None = Field(None, min_length=1, max_length=130)


class EvidenceArgs(_Args):
    cycle_id: str | None = Field(None, min_length=1, max_length=80, pattern=CYCLE_ID)
    section: app.Section | None = None
    page: int = Field(1, ge=1, le=10_000)


class ProposeArgs(_Args):
    plan: dict[str, Any] | str
    dry_run: bool = False
    follow_s: int = Field(0, ge=0, le=3600)


ARGUMENTS: dict[str, type[_Args]] = {
    "status": StatusArgs,
    "registry": RegistryArgs,
    "evidence": EvidenceArgs,
    "propose_plan": ProposeArgs,
}

_KINDS = {
    "missing": "required",
    "string_pattern_mismatch": "not a well-formed id",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "dict_type": "must be a JSON object",
    "finite_number": "must be a finite number",
}


def _kind(err: Any) -> str:
    """One validation error in our words, with the limit it broke."""
    kind = err["type"]
    return limit_words(kind, err.get("ctx") or {}) or _KINDS.get(kind, f"invalid ({kind})")


def argument_problems(tool: str, arguments: Any) -> list[str]:
    """What is wrong with a call's arguments, in our words; empty when they are fine."""
    model = ARGUMENTS[tool]
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return ["arguments must be a JSON object"]
    allowed = set(model.model_fields)
    unknown = [k for k in arguments if k not in allowed]
    if unknown:
        shown = ", ".join(sorted({shown_name(k) for k in unknown})[:5])
        return [f"unknown argument(s): {shown}; allowed: {', '.join(sorted(allowed)) or 'none'}"]
    if has_non_finite({k: v for k, v in arguments.items() if k != "plan"}):
        return ["numbers must be finite"]
    try:
        model.model_validate(dict(arguments))
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:5]:
            first = err["loc"][:1]
            where = ".".join(shown_name(p) if isinstance(p, str) else str(p) for p in first)
            kind = _kind(err)
            if where == "plan" and err["type"] in ("dict_type", "string_type"):
                kind = "must be a JSON object (or a JSON string of one)"
            problems.append(f"{where or '(arguments)'}: {kind}")
        return sorted(set(problems))
    return []


def client_name(session: Any) -> str:
    """`mcp:<name the client gave>`, bounded and reduced to safe characters."""
    params = getattr(session, "client_params", None)
    info = getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    if not isinstance(name, str) or not name.strip():
        return "mcp:unknown-client"
    return "mcp:" + (re.sub(r"[^A-Za-z0-9 ._@/+-]", "?", name)[:64] or "unknown-client")


class ArgumentGuard:
    """Server middleware: refuse a tools/call whose arguments are not exactly right, and answer
    protocol mistakes (unknown tool or prompt, malformed params) with JSON-RPC -32602 and one
    WARNING line, never a traceback.

    Every ``propose_plan`` attempt is audited here or in ``app.propose``: refused arguments, and,
    in read-only mode (where the tool is not offered), the attempt itself."""

    def __init__(self, home: Home, tools: set[str], prompts: Iterable[str] = ()) -> None:
        self.home = home
        self.tools = tools
        self.prompts = set(prompts)

    def _audit_refusal(
        self, ctx: ServerRequestContext[Any, Any], arguments: Any, text: str
    ) -> None:
        try:
            raw = canonical_json(arguments)[: MAX_PLAN_BYTES * 4] if arguments is not None else b""
        except (ValueError, TypeError, RecursionError):  # hashed by what it is, not walked
            raw = b"unhashable arguments: " + text.encode()
        self.home.append_audit(
            AuditRecord(
                ts=utcnow(),
                client=client_name(ctx.session),
                plan_hash=sha256_bytes(raw),
                accepted=False,
                detail=text[:300],
            )
        )

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "prompts/get":
            return await self._prompt(ctx, call_next)
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params
        if not isinstance(params, Mapping) or not isinstance(params.get("name"), str):
            raise protocol_error("tools/call needs params {name: string, arguments?: object}")
        name = params["name"]
        arguments = params.get("arguments")
        if name not in self.tools:
            if name == "propose_plan":  # read-only mode: refused, and audited like any attempt
                text = "refused: propose_plan is not offered: the server runs in read-only mode"
                self._audit_refusal(ctx, arguments, text)
                raise protocol_error(text)
            raise protocol_error(f"unknown tool; this server has: {', '.join(sorted(self.tools))}")
        if arguments is not None and not isinstance(arguments, Mapping):
            if name == "propose_plan":
                self._audit_refusal(ctx, None, "refused: arguments must be a JSON object")
            raise protocol_error("tools/call arguments must be a JSON object")
        if name == "propose_plan" and isinstance(arguments, Mapping):
            try:  # before the SDK parses a plan string (a recursive parser) or walks the object
                check_shape(arguments.get("plan"))
            except PlanRefused as exc:
                self._audit_refusal(ctx, None, str(exc))
                return refused_plan(str(exc), exc.problems, arguments.get("dry_run") is True)
        problems = argument_problems(name, arguments)
        if not problems:
            return await call_next(ctx)
        text = f"refused: invalid arguments for {name}: " + "; ".join(problems)
        if name == "propose_plan":
            self._audit_refusal(ctx, arguments, text)
            return refused_plan(text, problems, (arguments or {}).get("dry_run") is True)
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    async def _prompt(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params
        if not isinstance(params, Mapping) or not isinstance(params.get("name"), str):
            raise protocol_error("prompts/get needs params {name: string, arguments?: object}")
        if params["name"] not in self.prompts:
            raise protocol_error(
                "unknown prompt; this server has: " + ", ".join(sorted(self.prompts))
            )
        arguments = params.get("arguments")
        if arguments is not None and not (
            isinstance(arguments, Mapping) and all(isinstance(v, str) for v in arguments.values())
        ):
            raise protocol_error("prompt arguments must be an object of strings")
        try:
            return await call_next(ctx)
        except MCPError:
            raise
        except Exception as exc:  # the SDK would answer code 0 and log a traceback per request
            raise protocol_error(f"prompt refused: {type(exc).__name__}") from None


def refused_plan(message: str, problems: list[str], dry_run: bool) -> CallToolResult:
    """The one shape of every invalid plan, wrong arguments included: a tool error
    (``isError: true``) whose structured content is the proposal view with ``accepted: false``
    and the problems, so a model sees an error and a program reads the same fields."""
    view = app.ProposalView(accepted=False, dry_run=dry_run, message=message, problems=problems)
    return _refusal(view)


def _refusal(view: app.ProposalView) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=render.proposal_text(view))],
        structured_content=view.model_dump(mode="json"),
        is_error=True,
    )


def protocol_error(message: str) -> MCPError:
    """JSON-RPC -32602 with our own short message, logged as one WARNING line (the message is
    ours: it never repeats what the client sent)."""
    logger.warning("refused request: %s", message)
    return MCPError(code=INVALID_PARAMS, message=message)


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------

PlanArgument = Annotated[
    dict[str, Any] | str,
    WithJsonSchema(
        {
            "anyOf": [
                planning.plan_schema(),
                {
                    "type": "string",
                    "maxLength": MAX_PLAN_BYTES,
                    "description": "the same plan as a JSON string",
                },
            ]
        }
    ),
    Field(
        description="The plan: {hypothesis: one line (at most 300 characters), candidates: 1-16 "
        "candidate ids from `registry` (manifest:variant), acceptance?: {min_speedup_pct?, "
        "max_peak_memory_gb?}, notes?}. No other field is accepted."
    ),
]


BROKEN = (CorruptFile, RegistryError, ValidationError, yaml.YAMLError, OSError)


def _broken(exc: BaseException) -> ToolError:
    """A file of the home or of the registry/policy folders does not load: say which (the
    message is the project's; the files are the operator's, not the caller's)."""
    return ToolError(f"mcp-infra cannot read its own files: {type(exc).__name__}: {str(exc)[:300]}")


def _result(view: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=view.model_dump(mode="json"),
    )


def build_server(  # noqa: C901  its tools are small closures; mccabe sums them into this one
    home: Home, mode: Mode = "propose", start_supervisor: bool = True
) -> MCPServer:
    """The MCP server for one home directory. ``start_supervisor=False`` only queues plans
    (someone runs `mcp-infra supervise`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    _one_line_logging()
    reads = ReadCache()
    tools = {"status", "registry", "evidence"} | (
        {"propose_plan"} if mode != "read-only" else set()
    )
    server = MCPServer(
        "mcp-infra",
        version=__version__,
        instructions=instructions(mode),
        middleware=[ArgumentGuard(home, tools, {planning.PROMPT_NAME})],
        log_level="WARNING",
    )

    def tool(title: str, annotations: ToolAnnotations) -> Any:
        """`server.tool` with the docstring as a one-paragraph description."""

        def register(fn: Any) -> Any:
            return server.tool(
                title=title, annotations=annotations, description=_paragraph(fn.__doc__)
            )(fn)

        return register

    @tool(title="Service status", annotations=READ_ONLY)
    def status() -> Annotated[CallToolResult, app.StatusView]:
        """What serves now and what mcp-infra is doing. Returns: the managed service (endpoint,
        healthy or not, active recipe with its knobs, since when); the cycle in progress, if any
        (id, state, candidate being measured, progress, elapsed time, expected downtime); the
        queue of plan ids; the last sealed cycle's outcome; the policy's name and maintenance
        window; this server's mode; and anything that needs a person. Takes no arguments.
        Cheap: call it to follow a cycle after propose_plan."""
        try:
            view = app.status(home)
        except BROKEN as exc:
            raise _broken(exc) from exc
        view = view.model_copy(update={"server_mode": mode})
        return _result(view, render.status_text(view))

    @tool(title="Candidate registry", annotations=READ_ONLY)
    def registry(
        candidate_id: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=130,
                description="one candidate id (manifest:variant, e.g. demo-tiny:draft-k4); omit to "
                "list every candidate",
            ),
        ] = None,
    ) -> Annotated[CallToolResult, app.RegistryView]:
        """The configurations mcp-infra can measure. Each candidate (id manifest:variant) comes
        with its class (acceleration_plugin, server_tuning, kv_cache, quantization,
        runtime_upgrade, model_change), semantics (lossless: greedy output must equal the
        baseline's token for token; lossy: must pass a quality budget), launch knobs, every
        preflight check on this machine with why it passed or failed, whether the policy lets it
        be promoted automatically, and what past cycles decided about it. Only candidates with
        preflight_passed=true can run. Use these ids in propose_plan."""
        try:
            view = reads.get(
                ("registry", candidate_id),
                registry_inputs(home),
                lambda: app.registry_view(home, candidate_id, wait_costs=False),
            )
        except BROKEN as exc:
            raise _broken(exc) from exc
        if candidate_id and not view.candidates:
            raise ToolError(app.unknown_candidate(home, candidate_id))
        return _result(view, render.registry_text(view))

    @tool(title="Cycle evidence", annotations=READ_ONLY)
    def evidence(
        cycle_id: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=80,
                pattern=CYCLE_ID,
                description="a cycle id (c-...) or latest (the newest sealed cycle); omit to "
                "list sealed cycles, newest first",
            ),
        ] = None,
        section: Annotated[
            app.Section | None,
            Field(
                description="with cycle_id: summary (default: outcome, verdict, per-prompt table), "
                "table, gates (with the first divergence of any greedy output), verdict, plan "
                "(the frozen plan and every change), journal (paginated)"
            ),
        ] = None,
        page: Annotated[
            int, Field(ge=1, le=10_000, description="page of the cycle list or of the journal")
        ] = 1,
    ) -> Annotated[CallToolResult, app.EvidenceView]:
        """Sealed evidence of past cycles. Without cycle_id: the cycles (id, outcome, selected
        candidate, speedup, reason), 20 per page, newest first. With cycle_id: one cycle's
        summary, per-prompt decode speed table (baseline vs candidate tok/s), gates, verdict with
        reasons and confidence interval, frozen plan, or journal (40 events per page; `pages`
        says how many). Results are bounded in size; the bundle path is given for the rest."""
        try:
            view = app.evidence_view(home, cycle_id, section, page)
            if cycle_id and section in (None, "summary"):
                view = _with_verification(home, view)
        except FileNotFoundError as exc:
            raise ToolError(f"{exc}; call evidence without arguments to list cycles") from exc
        except BROKEN as exc:
            raise _broken(exc) from exc
        return _result(view, render.evidence_text(view))

    if mode != "read-only":

        @tool(title="Propose an experiment plan", annotations=PROPOSE)
        async def propose_plan(
            plan: PlanArgument,
            dry_run: Annotated[
                bool, Field(description="true: sanitize and explain without queuing anything")
            ] = False,
            follow_s: Annotated[
                int,
                Field(
                    ge=0,
                    le=MAX_FOLLOW_S,
                    description="0 (default): return at once. Up to 3600: follow the cycle "
                    "for at most this many seconds, sending MCP progress notifications (step, "
                    "round, time left) when the call carries a progress token, and return "
                    "once it is sealed (or when the time is up; the cycle goes on)",
                ),
            ] = 0,
            ctx: Context | None = None,
        ) -> Annotated[CallToolResult, app.ProposalView]:
            """Queue an experiment: 1-16 candidate ids from `registry` to measure against the live
            baseline (from 4 on, screened first: every gate and one short start each drop the
            clear losers, the rest are decided in full), e.g. {"hypothesis": "a 4-token drafter
            speeds up decoding", "candidates": ["demo-tiny:draft-k4"]}. Code sanitizes the
            plan: unknown or non-runnable ids are refused with a reason, the baseline is
            measured first, duplicates are dropped, thresholds (acceptance.min_speedup_pct,
            acceptance.max_peak_memory_gb) are clamped to the policy's range and can only be
            tightened, never loosened. Returns at once
            (or, with follow_s, after following the cycle with progress notifications):
            accepted or not, plan id, the sanitized candidates and thresholds, every change
            with its reason, refused candidates, queue position, when it may run (the policy's
            maintenance window) and how to follow it. The cycle runs in a background supervisor
            that does not depend on this connection. dry_run=true explains without queuing.
            Every invalid or refused plan, wrong arguments included, is a tool error
            (isError: true) with the same structured content: accepted=false, message, and
            problems naming each field and limit (and the nearest valid ids); nothing is
            queued. Fix what the problems name and call again."""
            session = ctx.request_context.session if ctx is not None else None

            def run() -> app.ProposalView:
                return app.propose(
                    home,
                    plan,
                    proposed_by=client_name(session),
                    dry_run=dry_run,
                    start_supervisor=start_supervisor,
                )

            try:
                view = await anyio.to_thread.run_sync(run)
            except BROKEN as exc:
                raise _broken(exc) from exc
            if not view.accepted:
                return _refusal(view)
            if mode == "autonomous" and start_supervisor and not dry_run:
                app.ensure_watcher(home)  # restarted if it died; the plan itself runs now
            if follow_s and not dry_run and view.plan_id:
                view = await follow_cycle(home, view, follow_s, ctx)
            return _result(view, render.proposal_text(view))

    _add_resources(server, home)

    @server.resource(
        STATUS_URI,
        name="status",
        title="Live status",
        mime_type="application/json",
        description="The same view as the status tool. Subscribe to it "
        "(resources/subscribe) to be told when a cycle changes state or finishes, "
        "the queue changes or the live recipe changes.",
    )
    def status_resource() -> str:
        return _json(status_view().model_dump(mode="json"))

    def status_view() -> app.StatusView:
        return app.status(home).model_copy(update={"server_mode": mode})

    server.status_notifier = StatusNotifier(server, home, status_view)  # type: ignore[attr-defined]
    server.status_notifier.install()  # type: ignore[attr-defined]
    for name in tools:  # extra arguments are refused (ArgumentGuard): say so in the schema
        registered = server._tool_manager.get_tool(name)
        assert registered is not None, name  # registered above
        registered.parameters["additionalProperties"] = False

    @server.prompt(
        name=planning.PROMPT_NAME,
        title="Plan an acceleration experiment",
        description="Instructions for a planner with the live context: candidates "
        "that pass preflight, the baseline's figures, what past cycles found "
        "(failures included) and the policy's bounds; the answer is one JSON plan "
        "for propose_plan.",
    )
    def propose_acceleration_plan(
        goal: Annotated[
            str | None,
            Field(
                description="optional, one line: what to optimize, e.g. 'lower latency for short "
                "chat turns' (at most 500 characters)"
            ),
        ] = None,
    ) -> list[UserMessage]:
        """Instructions for a planner with the live context: candidates that pass preflight,
        the baseline's figures, what past cycles found (failures included) and the policy's
        bounds. Optional goal: one line on what to optimize (at most 500 characters)."""
        if goal is not None and len(goal) > planning.MAX_GOAL:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"goal is too long (at most {planning.MAX_GOAL} characters)",
            )
        if goal is not None and (problem := text_problem(goal)):
            raise protocol_error(f"goal {problem}")
        try:
            context = planning.build_context(home)
        except FileNotFoundError as exc:
            raise MCPError(
                code=INVALID_PARAMS,
                message="no managed service is configured in this home (config.yaml missing)",
            ) from exc
        except BROKEN as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(_broken(exc))) from exc
        return [UserMessage(render.planning_prompt(context, goal, can_propose=mode != "read-only"))]

    return server


MAX_FOLLOW_S = 3600
FOLLOW_POLL_S = 1.0


def _fraction(cycle: app.CycleView) -> float:
    """How far a cycle is, 0 to 1: its step among the nominal ones, and within EXPERIMENT
    its round of the maximum and start within the round."""
    steps = cycle.steps or len(app.NOMINAL_STATES)
    done: float = (cycle.step or 1) - 1
    where = cycle.measuring
    if where and where.phase == "measure" and where.round and where.max_rounds:
        starts = where.starts_in_round or 1
        inside = ((where.round - 1) + ((where.start_in_round or 1) - 1) / starts) / where.max_rounds
        done += min(inside, 0.99)
    return min(done / steps, 0.99)


async def follow_cycle(
    home: Home, view: app.ProposalView, follow_s: int, ctx: Context | None
) -> app.ProposalView:
    """Follow the proposal's cycle until it is sealed or ``follow_s`` passes, sending a
    progress notification (0..1, with the status's progress text) whenever it moves."""
    deadline = anyio.current_time() + follow_s
    sent, said = 0.0, ""

    async def tell(progress: float, message: str) -> None:
        nonlocal sent, said
        if ctx is None or (progress <= sent and message == said):
            return
        sent, said = max(progress, sent), message
        with contextlib.suppress(Exception):  # a client without a progress token: nothing sent
            await ctx.report_progress(sent, 1.0, message)

    while anyio.current_time() < deadline:
        status = await anyio.to_thread.run_sync(app.status, home)
        last = status.last_cycle
        if last is not None and last.plan_id == view.plan_id and not status.cycle:
            await tell(1.0, f"sealed {last.cycle_id}: {last.outcome.value}")
            return view.model_copy(
                update={
                    "follow": f"cycle {last.cycle_id} sealed: {last.outcome.value}"
                    + (f", selected {last.selected}" if last.selected else "")
                    + f"; call `evidence` with cycle_id {last.cycle_id} for the evidence"
                }
            )
        cycle = status.cycle
        if cycle is not None and cycle.plan_id == view.plan_id:
            await tell(_fraction(cycle), f"{cycle.cycle_id}: {cycle.progress or cycle.state}")
        else:
            await tell(0.0, "queued: " + (status.window_now or "waiting for the supervisor"))
        await anyio.sleep(FOLLOW_POLL_S)
    return view.model_copy(
        update={
            "follow": f"followed for {follow_s} s; the cycle goes on: call `status` for "
            "progress and `evidence` once it is sealed"
        }
    )


def _with_verification(home: Home, view: app.EvidenceView) -> app.EvidenceView:
    """Add the HTML report (path and resource URI); the view already carries every check of
    `evidence verify` (cached while the bundle's files are unchanged)."""
    from mcp_infra.faces import evidence_cli

    if not view.path:
        return view
    report = evidence_cli.current_report(home, Path(view.path))
    return view.model_copy(
        update={
            "report_path": str(report),
            "report_uri": f"{URI}evidence/{view.cycle_id}/report",
        }
    )


def _paragraph(doc: str | None) -> str:
    return " ".join((doc or "").split())


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str, ensure_ascii=False)


def _add_resources(server: MCPServer, home: Home) -> None:  # noqa: C901  small closures, summed
    @server.resource(
        f"{URI}policy",
        name="policy",
        title="Effective policy",
        mime_type="application/json",
        description="The policy that judges plans here: thresholds with the range a "
        "plan may move them in, protocol, auto-promotion per class, window, budgets.",
    )
    def policy_resource() -> str:
        policy = HomeContext(home).policy
        return _json({"policy": policy.model_dump(mode="json"), "hash": policy_hash(policy)})

    @server.resource(
        f"{URI}plan-schema",
        name="plan-schema",
        title="Plan JSON schema",
        mime_type="application/json",
        description="The JSON schema of what propose_plan accepts (nothing else).",
    )
    def plan_schema_resource() -> str:
        return _json(planning.plan_schema())

    def manifest_json(manifest_id: str) -> str:
        manifests = load_registry(extra=home.user_registry)
        manifest = manifests.get(manifest_id) if isinstance(manifest_id, str) else None
        if manifest is None:
            raise ResourceNotFoundError("no such manifest; see the registry tool for ids")
        return _json(
            {
                "manifest": manifest.model_dump(mode="json", by_alias=True),
                "hash": manifest_hash(manifest),
                "candidates": [f"{manifest.id}:{v.id}" for v in manifest.variants],
            }
        )

    @server.resource(
        f"{URI}manifests/{{manifest_id}}",
        name="manifest",
        title="Candidate manifest",
        mime_type="application/json",
        description="One registry manifest (the part of a candidate id before ':').",
    )
    def manifest_resource(manifest_id: str) -> str:
        return manifest_json(manifest_id)

    try:
        known = list(load_registry(extra=home.user_registry))
    except Exception:  # a broken home manifest must not stop the server; the template remains
        known = []

    def reader(manifest_id: str) -> Any:
        def read() -> str:
            return manifest_json(manifest_id)

        return read

    @server.resource(
        f"{URI}candidates/{{candidate_id}}",
        name="candidate",
        title="One candidate",
        mime_type="application/json",
        description="One registry candidate (manifest:variant) as the registry tool shows it: "
        "class, semantics, knobs, every preflight check here, what past cycles decided. "
        "Candidate ids complete (completion/complete).",
    )
    def candidate_resource(candidate_id: str) -> str:
        view = app.registry_view(home, candidate_id)
        if not view.candidates:
            raise ResourceNotFoundError(app.unknown_candidate(home, candidate_id))
        return _json(view.candidates[0].model_dump(mode="json"))

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        """Candidate, manifest and cycle ids (with `latest`) for the resource templates."""
        if not isinstance(ref, ResourceTemplateReference):
            return None
        return Completion(values=completions(home, argument.name, argument.value)[:100])

    for manifest_id in known:  # listed by resources/list; the template serves later additions
        server.resource(
            f"{URI}manifests/{manifest_id}",
            name=f"manifest-{manifest_id}",
            title=f"Manifest {manifest_id}",
            mime_type="application/json",
            description=f"The registry manifest {manifest_id}.",
        )(reader(manifest_id))

    @server.resource(
        f"{URI}evidence/{{cycle_id}}/summary",
        name="evidence-summary",
        title="Cycle evidence summary",
        mime_type="application/json",
        description="A sealed cycle's summary, compact: outcome, verification and the "
        "verify command, held-out confirmation and online check, each candidate's decision "
        "and figures, the per-prompt table, service impact and cost. The whole view (every "
        "reason, cell and check) is in pages of at most 20,000 characters: "
        "mcp-infra://evidence/{cycle_id}/summary/1, /2, … (`pages` here says how many). "
        "cycle_id 'latest' names the newest sealed cycle.",
    )
    def evidence_resource(cycle_id: str) -> str:
        view = _summary_view(cycle_id)
        full = _json(view.model_dump(mode="json", exclude_none=True))
        compact = compact_summary(view)
        compact["pages"] = pages_of(full, SUMMARY_PAGE)
        return _json(compact)

    @server.resource(
        f"{URI}evidence/{{cycle_id}}/summary/{{page}}",
        name="evidence-summary-page",
        title="Cycle evidence summary, one page",
        mime_type="text/plain",
        description="One page (at most 20,000 characters) of a sealed cycle's whole summary "
        "view as JSON text; concatenated in order, the pages are that JSON document.",
    )
    def evidence_summary_page(cycle_id: str, page: str) -> str:
        view = _summary_view(cycle_id)
        return page_of(_json(view.model_dump(mode="json", exclude_none=True)), page, SUMMARY_PAGE)

    @server.resource(
        f"{URI}evidence/{{cycle_id}}/report",
        name="evidence-report",
        title="Cycle evidence report (HTML)",
        mime_type="text/html",
        description="A sealed cycle's report as one self-contained HTML page (no "
        "network fetch): the decision, speedup charts with intervals, gates, cost, "
        "environment and verification. Large (charts inline): read it in pages of at most "
        "50,000 characters at mcp-infra://evidence/{cycle_id}/report/1, /2, …",
    )
    def evidence_report(cycle_id: str) -> str:
        return _report(cycle_id)

    # Paged like the summary pages above, at the report's own page size: another document.
    @server.resource(
        f"{URI}evidence/{{cycle_id}}/report/{{page}}",
        name="evidence-report-page",
        title="Cycle evidence report, one page",
        mime_type="text/plain",
        description="One page (at most 50,000 characters) of the report's HTML; "
        "concatenated in order, the pages are the page.",
    )
    def evidence_report_page(cycle_id: str, page: str) -> str:
        return page_of(_report(cycle_id), page, REPORT_PAGE)

    def _report(cycle_id: str) -> str:
        from mcp_infra.faces import evidence_cli
        from mcp_infra.state.evidence import bundle_path

        if not re.fullmatch(CYCLE_ID, cycle_id):
            raise ResourceNotFoundError("not a cycle id")
        try:
            bundle = bundle_path(home, cycle_id)
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        return evidence_cli.current_report(home, bundle).read_text(encoding="utf-8")

    def _summary_view(cycle_id: str) -> app.EvidenceView:
        if not re.fullmatch(CYCLE_ID, cycle_id):
            raise ResourceNotFoundError("not a cycle id")
        try:
            return app.evidence_view(home, cycle_id, "summary")
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(str(exc)) from exc


def completions(home: Home, name: str, prefix: str) -> list[str]:
    """Values for a template variable that begin with ``prefix``: candidate ids, manifest ids,
    cycle ids newest first (after `latest`), pages."""
    from mcp_infra.state.evidence import LATEST, list_cycles

    if name == "candidate_id":
        manifests = load_registry(extra=home.user_registry).values()
        values = [f"{m.id}:{v.id}" for m in manifests for v in m.variants]
    elif name == "manifest_id":
        values = list(load_registry(extra=home.user_registry))
    elif name == "cycle_id":
        values = [LATEST, *(c.cycle_id for c in list_cycles(home))]
    elif name == "page":
        values = [str(n) for n in range(1, 10)]
    else:
        values = []
    return [v for v in values if v.startswith(prefix)]


SUMMARY_PAGE = 20_000
REPORT_PAGE = 50_000


def pages_of(text: str, size: int) -> int:
    return max(1, -(-len(text) // size))


def page_of(text: str, page: str, size: int) -> str:
    """Page ``page`` (1-based) of ``text``; a page that does not exist names how many do."""
    count = pages_of(text, size)
    if not page.isdigit() or not 1 <= int(page) <= count:
        raise ResourceNotFoundError(f"no such page: pages are 1 to {count}")
    start = (int(page) - 1) * size
    return text[start : start + size]


def compact_summary(view: app.EvidenceView) -> dict[str, Any]:
    """The summary resource's default content: what a model needs to answer "what happened",
    without every reason, cell and check (those are in the pages)."""
    verdict = view.verdict
    candidates = [
        {
            "candidate": c.candidate,
            "decision": c.decision.value,
            "speedup": c.speedup_estimate,
            "interval": [c.ci_low, c.ci_high],
            "worst_prompt": c.worst_prompt,
            "worst_speedup": c.worst_speedup,
            "gates": {g.gate: g.passed for g in c.gates},
            "reason": render.plain(c.reasons[0]) if c.reasons else None,
        }
        for c in (verdict.candidates if verdict else [])
    ]
    data: dict[str, Any] = {
        "cycle_id": view.cycle_id,
        "summary": view.summary.model_dump(mode="json") if view.summary else None,
        "verified": view.verified,
        "failed_checks": view.failed_checks,
        "verify_command": view.verify_command,
        "heldout": view.heldout,
        "online_check": view.online_check,
        "selected": verdict.selected if verdict else None,
        "candidates": candidates,
        "table": view.table,
        "service_impact": view.service_impact.model_dump(mode="json")
        if view.service_impact
        else None,
        "cost_wall_s": view.cost.wall_s if view.cost else None,
        "path": view.path,
    }
    if view.verified is False:  # the figures of a bundle that does not verify are withheld
        data.update(candidates=[], table=None, selected=None, summary=None)
    return {k: v for k, v in data.items() if v is not None}


def serve(  # noqa: PLR0913  keyword-only options, one per flag of `mcp-infra serve`
    home: Home,
    *,
    mode: Mode = "propose",
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    token_file: str | None = None,
    allowed_hosts: list[str] | tuple[str, ...] = (),
    allowed_origins: list[str] | tuple[str, ...] = (),
    start_supervisor: bool = True,
    auth: str = "token",
) -> int:
    """`mcp-infra serve`: stdio (stdout is the wire: nothing else is printed there) or HTTP."""

    server = build_server(home, mode, start_supervisor=start_supervisor)
    if mode == "autonomous" and start_supervisor:
        app.ensure_watcher(home)
    if transport == "stdio":
        import anyio

        from mcp_infra.faces.stdio_drain import run_stdio

        anyio.run(run_stdio, server)  # every request read is answered before it exits
        return 0
    from mcp_infra.faces.http_transport import HttpPlan, serve_http

    plan = HttpPlan(  # HttpConfigError: a usage error of the command line (exit 2)
        home,
        host=host,
        port=port,
        token_file=token_file,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        auth=auth,
    )
    serve_http(server, plan, mode)  # PortBusy: exit 6
    return 0
