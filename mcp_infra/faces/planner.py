"""Planning: the live context a planner needs, the prompt built from it, and `plan --local`.

A planner (Claude Code, an IDE agent, or the served model itself) gets the prompt
``propose_acceleration_plan`` from the MCP server: instructions plus what this machine can run,
how fast the live service is, what past cycles found (failures included) and the policy's bounds.
It answers with one JSON plan; code then decides everything else.

``plan --local`` asks the served model (OpenAI-compatible chat API, temperature 0). A small
model (``core.menu.prompt_form``: under a billion parameters or an 8,192-token context, or of
unknown size) gets a numbered menu of the candidate ids and answers with numbers; a large one
gets the MCP prompt and answers with a JSON plan. The plan is extracted from whatever the model
wrote (``core.extraction``) and submitted with a real MCP client call to ``propose_plan``. An
answer without a usable plan, or one ``propose_plan`` refuses, is asked again once with the
problem quoted; after that a deterministic fallback (untried candidates first, in catalog
order) is proposed, its notes saying ``planner: fallback`` with the model's answers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp_infra import __version__
from mcp_infra.contracts import JSONValue
from mcp_infra.core.extraction import Extraction, extract_plan
from mcp_infra.core.menu import Menu, PromptForm, fallback_plan, prompt_form
from mcp_infra.errors import ServerUnavailable, UsageError
from mcp_infra.faces.render import (
    local_plan_text,
    menu_prompt,
    plan_example,
    planning_prompt,
    retry_prompt,
)
from mcp_infra.flows.planning import (
    CLIENT_NAME,
    MAX_GOAL,
    PROMPT_NAME,
    Attempt,
    LocalPlanResult,
    build_context,
    menu_of,
    served_model_size,
)
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home

QUESTIONS = 2  # the first question, and one retry with the problem quoted
MAX_TOKENS: dict[PromptForm, int] = {"menu": 64, "json": 2048}
EXCERPT = 600


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


async def ask_model(
    endpoint: str,
    messages: list[dict[str, str]],
    *,
    model: str | None,
    max_tokens: int,
    timeout: float,
) -> str:
    """One chat completion at temperature 0; returns the message content ('' if none)."""
    import httpx2

    body: dict[str, Any] = {
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "stream": False,
    }
    if model:
        body["model"] = model
    async with httpx2.AsyncClient(timeout=timeout) as http:
        response = await http.post(endpoint.rstrip("/") + "/chat/completions", json=body)
        response.raise_for_status()
        data = response.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices, list):
        return ""
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


class ModelUnreachable(ServerUnavailable):
    """Nothing listens where the model should answer: the service is down (exit code 6)."""


@dataclass(frozen=True)
class LocalPlanOptions:
    """The options of `mcp-infra plan --local`, one per flag."""

    dry_run: bool = False
    endpoint: str | None = None
    model: str | None = None
    max_tokens: int | None = None  # None: MAX_TOKENS of the prompt's form
    timeout: float = 600.0
    goal: str | None = None
    start_supervisor: bool = True
    form: Literal["auto", "menu", "json"] = "auto"


@dataclass
class Submitted:
    """What ``propose_plan`` said about one plan."""

    accepted: bool
    message: str
    proposal: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


Ask = Callable[[list[dict[str, str]]], Awaitable[str]]
Submit = Callable[[dict[str, JSONValue]], Awaitable[Submitted]]


@dataclass(frozen=True)
class Conversation:
    """How to ask the model and submit a plan, and what to ask with."""

    ask: Ask
    submit: Submit
    form: PromptForm
    menu: Menu
    example: dict[str, Any] | None = None


@dataclass
class Outcome:
    planner: Literal["model", "fallback", "none"]
    attempts: list[Attempt]
    submitted: Submitted | None = None
    extraction: Extraction | None = None
    reply: str = ""
    failure: str = ""


async def converse(talk: Conversation, messages: list[dict[str, str]]) -> Outcome:
    """Ask; take the plan from the answer and submit it; on no usable plan (or a refusal)
    ask once more with the problem quoted; then submit the fallback plan. A failure to get
    an answer at all ends it with nothing proposed (``ModelUnreachable`` is raised)."""
    menu = talk.menu if talk.form == "menu" else None
    attempts: list[Attempt] = []
    answers: list[str] = []
    problems: list[str] = []
    extraction: Extraction | None = None
    for question in range(QUESTIONS):
        try:
            reply = await talk.ask(messages)
        except ModelUnreachable:
            raise
        except Exception as exc:  # a timeout or an HTTP error: report it, propose nothing
            why = f"the model did not answer: {type(exc).__name__}: {str(exc)[:200]}"
            return Outcome("none", attempts, extraction=extraction, failure=why)
        answers.append(reply)
        extraction = extract_plan(reply, menu)
        problems = extraction.problems
        if extraction.plan is not None:
            submitted = await talk.submit(extraction.plan)
            if submitted.accepted:
                attempts.append(Attempt(reply_excerpt=reply[:EXCERPT]))
                return Outcome("model", attempts, submitted, extraction, reply)
            problems = submitted.problems or [submitted.message]
        attempts.append(Attempt(reply_excerpt=reply[:EXCERPT], problems=problems))
        if question + 1 < QUESTIONS:
            retry = retry_prompt(problems, menu, talk.example)
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": retry},
            ]
    plan = fallback_plan(talk.menu, answers, "; ".join(problems))
    if plan is None:
        why = "the model gave no usable plan and no candidate is runnable for a fallback"
        return Outcome("none", attempts, extraction=extraction, reply=answers[-1], failure=why)
    submitted = await talk.submit(plan)
    return Outcome("fallback", attempts, submitted, extraction, answers[-1])


def choose_form(home: Home, options: LocalPlanOptions) -> PromptForm:
    """The option's form; for `auto`, by the served model's size (an --endpoint's model is
    not the served one: its size is unknown, so it gets the menu)."""
    if options.form != "auto":
        return options.form
    return prompt_form(None if options.endpoint else served_model_size(home))


async def plan_local(
    home: Home,
    options: LocalPlanOptions | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> LocalPlanResult:
    """Ask the served model for a plan (menu or MCP prompt); submit it through MCP."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    options = options or LocalPlanOptions()
    config = load_config(home)
    url = options.endpoint or f"http://{config.host}:{config.port}/v1"
    context = build_context(home)
    menu, form = menu_of(context), choose_form(home, options)
    if not menu.items:
        return LocalPlanResult(
            endpoint=url,
            dry_run=options.dry_run,
            form=form,
            message="no candidate can be proposed now (`mcp-infra plan` says why); "
            "the model was not asked",
        )
    command = server_command(home, start_supervisor=options.start_supervisor)
    params = StdioServerParameters(command=command[0], args=command[1:], env=_child_env())
    unreachable: ModelUnreachable | None = None
    async with Client(
        params, client_info=Implementation(name=CLIENT_NAME, version=__version__)
    ) as client:
        if form == "menu":
            first = menu_prompt(menu, options.goal)
        else:
            goal = {"goal": options.goal} if options.goal else {}
            prompt = await client.get_prompt(PROMPT_NAME, goal)
            first = "\n".join(getattr(m.content, "text", "") for m in prompt.messages)

        async def submit(plan: dict[str, JSONValue]) -> Submitted:
            return await submit_over_mcp(client, plan, options.dry_run, log)

        ask = asker(home, url, options, MAX_TOKENS[form], log)
        talk = Conversation(ask, submit, form, menu, plan_example(context))
        try:
            outcome = await converse(talk, [{"role": "user", "content": first}])
        except ModelUnreachable as exc:
            unreachable = exc
    if unreachable is not None:  # raised here, outside the MCP client's task group
        raise unreachable
    return _result(url, options, form, outcome)


def asker(
    home: Home, url: str, options: LocalPlanOptions, default_tokens: int, log: Callable[[str], None]
) -> Ask:
    """Questions to the model at ``url``; nothing listening there is ``ModelUnreachable``,
    with the command a person runs next."""
    import httpx2

    max_tokens = options.max_tokens or default_tokens

    async def ask(messages: list[dict[str, str]]) -> str:
        log(f"asking the model at {url} (temperature 0, up to {max_tokens} tokens)")
        try:
            return await ask_model(
                url, messages, model=options.model, max_tokens=max_tokens, timeout=options.timeout
            )
        except httpx2.ConnectError as exc:
            raise unreachable_hint(home, url, options.endpoint is None, exc) from exc

    return ask


async def submit_over_mcp(
    client: Any, plan: dict[str, JSONValue], dry_run: bool, log: Callable[[str], None]
) -> Submitted:
    """``propose_plan`` over the MCP session: accepted or not, with the refusal's problems."""
    from mcp_types import TextContent

    log("submitting a plan to propose_plan over MCP")
    result = await client.call_tool("propose_plan", {"plan": plan, "dry_run": dry_run})
    proposal = result.structured_content  # a refused plan: isError, accepted=false
    first = result.content[0] if result.content else None
    text = first.text if isinstance(first, TextContent) else ""
    return Submitted(
        accepted=bool(proposal and proposal.get("accepted")),
        message=(proposal or {}).get("message") or text,
        proposal=proposal,
        problems=[str(p) for p in (proposal or {}).get("problems") or []],
    )


def _result(
    url: str, options: LocalPlanOptions, form: PromptForm, outcome: Outcome
) -> LocalPlanResult:
    submitted = outcome.submitted
    if submitted is None:
        message = outcome.failure or "the model's answers have no usable plan"
        if outcome.attempts:
            message += " (" + "; ".join(outcome.attempts[-1].problems)[:400] + ")"
        message += "; nothing was proposed"
    else:
        message = submitted.message
    return LocalPlanResult(
        endpoint=url,
        submitted=submitted is not None,
        accepted=bool(submitted and submitted.accepted),
        dry_run=options.dry_run,
        message=message,
        reply_excerpt=outcome.reply[:EXCERPT],
        extraction=outcome.extraction,
        proposal=submitted.proposal if submitted else None,
        form=form,
        planner=outcome.planner if submitted else "none",
        attempts=outcome.attempts,
    )


def prompt_for(home: Home, goal: str | None = None, form: PromptForm = "json") -> str:
    """The prompt the MCP server gives (or the menu a small served model gets), for a person
    to paste into any model."""
    context = build_context(home)
    return menu_prompt(menu_of(context), goal) if form == "menu" else planning_prompt(context, goal)


__all__ = [
    "LocalPlanOptions",
    "ask_model",
    "cli_plan",
    "converse",
    "plan_local",
    "prompt_for",
    "server_command",
]


def unreachable_hint(home: Home, url: str, managed: bool, exc: Exception) -> ModelUnreachable:
    """The error for a model nobody answers for, with what a person runs next."""
    if managed:
        return ModelUnreachable(
            f"plan --local: the served model at {url} does not answer ({exc}); start the "
            f"service with `mcp-infra --home {home.root} service start` (`mcp-infra status` "
            "says what serves), or ask another model with --endpoint URL"
        )
    return ModelUnreachable(f"plan --local: nothing answers at {url} ({exc}); check --endpoint")


def cli_plan(home: Home, args: Any) -> int:
    """`mcp-infra plan [--local] …`: print the prompt, or plan with the served model."""
    if args.goal is not None and (len(args.goal) > MAX_GOAL or "\n" in args.goal):
        raise UsageError(f"plan: --goal must be one line of at most {MAX_GOAL} characters")
    if not args.local:
        text = prompt_for(home, args.goal, "menu" if args.prompt == "menu" else "json")
        print(json.dumps({"prompt": text}) if args.json else text)
        return 0
    import anyio

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = LocalPlanOptions(
        dry_run=args.dry_run,
        endpoint=args.endpoint,
        model=args.model,
        max_tokens=args.max_tokens,
        timeout=args.timeout,
        goal=args.goal,
        start_supervisor=not args.no_supervisor,
        form=args.prompt,
    )

    async def run() -> LocalPlanResult:
        return await plan_local(home, options, log)

    result = anyio.run(run)
    print(result.model_dump_json(indent=2) if args.json else local_plan_text(result))
    return 0 if result.accepted else 1
