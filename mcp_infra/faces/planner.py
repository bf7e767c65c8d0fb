"""Planning: the live context a planner needs, the prompt built from it, and `plan --local`.

A planner (Claude Code, an IDE agent, or the served model itself) gets the prompt
``propose_acceleration_plan`` from the MCP server: instructions plus what this machine can run,
how fast the live service is, what past cycles found (failures included) and the policy's bounds.
It answers with one JSON plan; code then decides everything else.

``plan --local`` asks the served model (OpenAI-compatible chat API, temperature 0) with that
prompt, extracts the JSON plan from whatever the model wrote (thinking blocks, code fences, prose),
and submits it with a real MCP client call to ``propose_plan``. A reply without a usable plan
changes nothing: there is no fallback plan.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp_infra import __version__
from mcp_infra.core.extraction import extract_plan
from mcp_infra.errors import UsageError
from mcp_infra.faces.render import local_plan_text, planning_prompt
from mcp_infra.flows.planning import (
    CLIENT_NAME,
    MAX_GOAL,
    PROMPT_NAME,
    LocalPlanResult,
    build_context,
)
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home


@dataclass(frozen=True)
class ModelAsk:
    """How the served model is asked: where, which model, how long it may write and wait."""

    endpoint: str | None = None  # OpenAI-compatible base URL ending in /v1; None: the service's
    model: str | None = None
    max_tokens: int = 2048
    timeout: float = 600.0


def server_command(home: Home, *, start_supervisor: bool = True) -> list[str]:
    args = ["-m", "mcp_infra", "--home", str(home.root), "serve"]
    return [sys.executable, *args, *([] if start_supervisor else ["--no-supervisor"])]


def _child_env() -> dict[str, str]:
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "HF_HUB_OFFLINE",
        "HF_HOME",
        "LD_PRELOAD",
        "VIRTUAL_ENV",
        "PYTHONPATH",
    )
    return {k: v for k, v in os.environ.items() if k in keep} | {"PYTHONUNBUFFERED": "1"}


async def ask_model(endpoint: str, messages: list[dict[str, str]], ask: ModelAsk) -> str:
    """One chat completion at temperature 0; returns the message content ('' if none)."""
    import httpx2

    body: dict[str, Any] = {
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": ask.max_tokens,
        "stream": False,
    }
    if ask.model:
        body["model"] = ask.model
    async with httpx2.AsyncClient(timeout=ask.timeout) as http:
        response = await http.post(endpoint.rstrip("/") + "/chat/completions", json=body)
        response.raise_for_status()
        data = response.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices, list):
        return ""
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


async def plan_local(
    home: Home,
    ask: ModelAsk,
    *,
    dry_run: bool = False,
    goal: str | None = None,
    start_supervisor: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> LocalPlanResult:
    """Ask the served model for a plan through the MCP prompt; submit it through MCP."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation, TextContent

    config = load_config(home)
    url = ask.endpoint or f"http://{config.host}:{config.port}/v1"
    command = server_command(home, start_supervisor=start_supervisor)
    params = StdioServerParameters(command=command[0], args=command[1:], env=_child_env())
    async with Client(
        params, client_info=Implementation(name=CLIENT_NAME, version=__version__)
    ) as client:
        prompt = await client.get_prompt(PROMPT_NAME, {"goal": goal} if goal else {})
        messages = [
            {"role": m.role, "content": getattr(m.content, "text", "")} for m in prompt.messages
        ]
        log(f"asking the model at {url} (temperature 0, up to {ask.max_tokens} tokens)")
        try:
            reply = await ask_model(url, messages, ask)
        except Exception as exc:  # any transport or HTTP failure: report it, change nothing
            return LocalPlanResult(
                endpoint=url,
                dry_run=dry_run,
                message=f"the model did not answer: {type(exc).__name__}: "
                f"{str(exc)[:200]}; nothing was proposed",
            )
        extraction = extract_plan(reply)
        excerpt = reply[:600]
        if extraction.plan is None:
            return LocalPlanResult(
                endpoint=url,
                dry_run=dry_run,
                reply_excerpt=excerpt,
                extraction=extraction,
                message="the model's reply has no usable plan; nothing was proposed ("
                + "; ".join(extraction.problems)
                + ")",
            )
        log(f"plan found ({extraction.source}); submitting it to propose_plan over MCP")
        result = await client.call_tool(
            "propose_plan", {"plan": extraction.plan, "dry_run": dry_run}
        )
        proposal = result.structured_content  # a refused plan: isError, accepted=false
        first = result.content[0] if result.content else None
        text = first.text if isinstance(first, TextContent) else ""
        accepted = bool(proposal and proposal.get("accepted"))
        message = (proposal or {}).get("message") or text
        return LocalPlanResult(
            endpoint=url,
            submitted=True,
            accepted=accepted,
            dry_run=dry_run,
            message=message,
            reply_excerpt=excerpt,
            extraction=extraction,
            proposal=proposal,
        )


def prompt_for(home: Home, goal: str | None = None) -> str:
    """The same prompt the MCP server gives, for a person to paste into any model."""
    return planning_prompt(build_context(home), goal)


__all__ = ["ModelAsk", "ask_model", "cli_plan", "plan_local", "prompt_for", "server_command"]


def cli_plan(home: Home, args: Any) -> int:
    """`mcp-infra plan [--local] …`: print the prompt, or plan with the served model."""
    if args.goal is not None and (len(args.goal) > MAX_GOAL or "\n" in args.goal):
        raise UsageError(f"plan: --goal must be one line of at most {MAX_GOAL} characters")
    if not args.local:
        text = prompt_for(home, args.goal)
        print(json.dumps({"prompt": text}) if args.json else text)
        return 0
    import anyio

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    async def run() -> LocalPlanResult:
        return await plan_local(
            home,
            ModelAsk(args.endpoint, args.model, args.max_tokens, args.timeout),
            dry_run=args.dry_run,
            goal=args.goal,
            start_supervisor=not args.no_supervisor,
            log=log,
        )

    result = anyio.run(run)
    print(result.model_dump_json(indent=2) if args.json else local_plan_text(result))
    return 0 if result.accepted else 1
