"""What stands in front of the SDK: every tools/call and prompts/get checked with our own words.

The SDK would silently drop unknown top-level arguments, accept ``"yes"`` for a boolean and echo
an offending value back in its validation message. ``ArgumentGuard`` validates each call against
a strict copy of the tool's own argument model (the one the SDK builds from the tool's
signature, so the input schema and this check are one definition) and answers with messages
that never repeat the input. Every ``propose_plan`` attempt it refuses is audited.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict, ValidationError

from mcp_infra.contracts import AuditRecord
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.sanitize import (
    MAX_PLAN_BYTES,
    PlanRefused,
    check_shape,
    has_non_finite,
    limit_words,
    shown_name,
)
from mcp_infra.faces import render
from mcp_infra.flows import api as app
from mcp_infra.state.store import Home, utcnow

logger = logging.getLogger("mcp_infra.server")

_KINDS = {
    "missing": "required",
    "string_pattern_mismatch": "not a well-formed id",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "dict_type": "must be a JSON object",
    "finite_number": "must be a finite number",
}


def one_line_logging() -> None:
    """Refusals are logged as one plain line on stderr (the SDK's Rich handler wraps long lines;
    stdout is the stdio wire)."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)


def strict(model: type[BaseModel]) -> type[BaseModel]:
    """The same arguments, strictly: no unknown key, no coercion (``"yes"`` is not a boolean)."""
    config = ConfigDict(**{**model.model_config, "extra": "forbid", "strict": True})
    return type(f"Strict{model.__name__}", (model,), {"model_config": config})


def _kind(err: Any) -> str:
    """One validation error in our words, with the limit it broke."""
    kind = err["type"]
    return limit_words(kind, err.get("ctx") or {}) or _KINDS.get(kind, f"invalid ({kind})")


def argument_problems(model: type[BaseModel], arguments: Any) -> list[str]:
    """What is wrong with a call's arguments, in our words; empty when they are fine."""
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


def protocol_error(message: str) -> MCPError:
    """JSON-RPC -32602 with our own short message, logged as one WARNING line (the message is
    ours: it never repeats what the client sent)."""
    logger.warning("refused request: %s", message)
    return MCPError(code=INVALID_PARAMS, message=message)


def refused_plan(message: str, problems: list[str], dry_run: bool) -> CallToolResult:
    """The one shape of every invalid plan, wrong arguments included: a tool error
    (``isError: true``) whose structured content is the proposal view with ``accepted: false``
    and the problems, so a model sees an error and a program reads the same fields."""
    view = app.ProposalView(accepted=False, dry_run=dry_run, message=message, problems=problems)
    return refusal(view)


def refusal(view: app.ProposalView, person_fix: str | None = None) -> CallToolResult:
    """A refused proposal as a tool error; ``person_fix``: what a person runs where the caller
    cannot fix it (the text then says so, and the message too)."""
    text = render.proposal_text(view, person_fix)
    if person_fix:
        view = view.model_copy(update={"message": text})
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=view.model_dump(mode="json"),
        is_error=True,
    )


class ArgumentGuard:
    """Server middleware: refuse a tools/call whose arguments are not exactly right, and answer
    protocol mistakes (unknown tool or prompt, malformed params) with JSON-RPC -32602 and one
    WARNING line, never a traceback.

    ``models``: each offered tool's strict argument model. Every ``propose_plan`` attempt is
    audited here or in ``app.propose``: refused arguments, and, in read-only mode (where the tool
    is not offered), the attempt itself."""

    def __init__(
        self, home: Home, models: Mapping[str, type[BaseModel]], prompts: Iterable[str] = ()
    ) -> None:
        self.home = home
        self.models = dict(models)
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
        name, arguments = params["name"], params.get("arguments")
        refused = self._refused(ctx, name, arguments)
        return refused if refused is not None else await call_next(ctx)

    def _refused(
        self, ctx: ServerRequestContext[Any, Any], name: str, arguments: Any
    ) -> CallToolResult | None:
        """The refusal of a call, or None when it may go on to the SDK."""
        if name not in self.models:
            if name == "propose_plan":  # read-only mode: refused, and audited like any attempt
                text = "refused: propose_plan is not offered: the server runs in read-only mode"
                self._audit_refusal(ctx, arguments, text)
                raise protocol_error(text)
            raise protocol_error(f"unknown tool; this server has: {', '.join(sorted(self.models))}")
        if arguments is not None and not isinstance(arguments, Mapping):
            if name == "propose_plan":
                self._audit_refusal(ctx, None, "refused: arguments must be a JSON object")
            raise protocol_error("tools/call arguments must be a JSON object")
        dry_run = isinstance(arguments, Mapping) and arguments.get("dry_run") is True
        if name == "propose_plan" and isinstance(arguments, Mapping):
            try:  # before the SDK parses a plan string (a recursive parser) or walks the object
                check_shape(arguments.get("plan"))
            except PlanRefused as exc:
                self._audit_refusal(ctx, None, str(exc))
                return refused_plan(str(exc), exc.problems, dry_run)
        problems = argument_problems(self.models[name], arguments)
        if not problems:
            return None
        text = f"refused: invalid arguments for {name}: " + "; ".join(problems)
        if name == "propose_plan":
            self._audit_refusal(ctx, arguments, text)
            return refused_plan(text, problems, dry_run)
        text = render.agent_can_fix(text)
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
