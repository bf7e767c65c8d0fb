"""The MCP tools: each a short function over the flows, registered from ``TOOLS``.

A tool's signature is its input schema (the SDK builds it; ``mcp_guard`` checks every call
against a strict copy of the same model). Its answer is a view of the flows as structured
content plus the renderer's text, both sized for a context: every list pages (``paging``), a
read answer's structured content stays under ``READ_BUDGET`` characters and a registry page under
``REGISTRY_PAGE``. ``tools/list`` carries an output schema only for the tools whose structured
result a client acts on field by field (``status``: a status bar or a follow loop reads the
cycle's progress; ``propose_plan``: a caller reads ``accepted``, ``plan_id`` and ``problems``),
and there a compact one (top-level fields and their types); every tool's full schema is the
resource ``mcp-infra://schemas/{tool}``. ``registry`` and ``evidence`` answer a model, which reads
their text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import anyio
import anyio.to_thread
import yaml
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError, WithJsonSchema

from mcp_infra.contracts import CandidateClass, FrontStatus, GateResult
from mcp_infra.core.sanitize import MAX_PLAN_BYTES
from mcp_infra.faces import render
from mcp_infra.faces.mcp_guard import client_name, refusal, strict
from mcp_infra.faces.paging import NoSuchPage, check_page, json_size, page_of
from mcp_infra.faces.read_cache import ReadCache, registry_inputs
from mcp_infra.faces.refusals import person_fix, proposable
from mcp_infra.flows import api as app
from mcp_infra.flows import planning
from mcp_infra.procs.front import FrontWatch
from mcp_infra.state.catalog import RegistryError
from mcp_infra.state.store import CorruptFile, Home

Mode = Literal["read-only", "propose", "autonomous"]
MODES: tuple[str, ...] = get_args(Mode)
URI = "mcp-infra://"
CYCLE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
READ_BUDGET = 16_000  # characters of structured content in one read answer (about 4k tokens)
REGISTRY_PAGE = 8_000  # characters of one registry page, summary included
MAX_FOLLOW_S = 3600
FOLLOW_POLL_S = 1.0
BROKEN = (CorruptFile, RegistryError, ValidationError, yaml.YAMLError, OSError)

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


@dataclass
class ServerEnv:
    """What every tool, resource and the prompt of one server share."""

    home: Home
    mode: Mode = "propose"
    start_supervisor: bool = True
    reads: ReadCache = field(default_factory=ReadCache)
    # `status` takes the front's answer a watcher got at most a second ago (``FrontWatch``).
    front: FrontWatch = field(init=False)

    def __post_init__(self) -> None:
        self.front = FrontWatch(self.home)


def broken(exc: BaseException) -> ToolError:
    """A file of the home or of the registry/policy folders does not load: a person fixes it."""
    return ToolError(render.cannot_read_own_files(exc))


def result(view: BaseModel | dict[str, Any], text: str) -> CallToolResult:
    data = view.model_dump(mode="json") if isinstance(view, BaseModel) else view
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


class RegistrySummary(BaseModel):
    candidates: int = Field(description="candidates in the whole registry view")
    pass_preflight: int
    proposable: list[str] = Field(description="ids that pass preflight and memory would run")
    manifests: dict[str, dict[str, int]] = Field(description="per manifest: variants, pass")


class RegistryPage(app.RegistryView):
    """One page of the registry view, opened by a summary of all of it."""

    summary: RegistrySummary | None = None
    page: int = 1
    pages: int = 1


PageArgument = Annotated[
    int, Field(ge=1, le=10_000, description="page (1 to `pages` of the answer)")
]
PlanArgument = Annotated[
    dict[str, Any] | str,
    WithJsonSchema(
        {
            "anyOf": [
                planning.plan_schema(),
                {"type": "string", "maxLength": MAX_PLAN_BYTES, "description": "the plan as JSON"},
            ]
        }
    ),
    Field(description="the plan (schema: mcp-infra://plan-schema); nothing else is accepted"),
]


class Tools:
    """The tools over one home; each method is one tool and its signature the input schema."""

    def __init__(self, env: ServerEnv) -> None:
        self.env = env

    def _registry_read(
        self, candidate_id: str | None, only: app.RegistryFilter
    ) -> tuple[object, Callable[[], app.RegistryView]]:
        """The read cache's key of a registry answer, and how to compute it."""
        home = self.env.home
        key = ("registry", candidate_id, only.model_dump_json())
        return key, lambda: app.registry_view(home, candidate_id, wait_costs=False, only=only)

    def _registry(self) -> app.RegistryView:
        """The whole registry view, kept while nothing it reads has changed."""
        key, compute = self._registry_read(None, app.RegistryFilter())
        return self.env.reads.get(key, registry_inputs(self.env.home), compute)

    def warm(self) -> None:
        """What a session's first reads would pay for, done in the background as a server
        starts, in the order an agent reads: one `status` (the front's first answer with its
        HTTP client, the newest bundle's integrity check), the whole registry view (the
        costliest read, kept), then the newest sealed cycle's full verification (its summary
        recomputes the verdict; kept while the bundle is unchanged)."""
        key, compute = self._registry_read(None, app.RegistryFilter())
        home = self.env.home

        def reads() -> app.RegistryView:
            with contextlib.suppress(Exception):  # the call itself says what is wrong
                app.status(home, self.env.front)
            return compute()

        def newest_summary() -> None:
            with contextlib.suppress(Exception):
                app.evidence_view(home, "latest", None, 1)

        self.env.reads.warm(key, lambda: registry_inputs(home), reads, then=newest_summary)

    async def status(self) -> Annotated[CallToolResult, app.StatusView]:
        # With the front's answer kept by the watcher, `status` reads only the home's files
        # (about a millisecond) and answers on the event loop: no hop to a worker thread, which
        # on a busy machine waits for a core. Without one, it asks the front (up to 1 s) on a
        # worker thread, never blocking the loop.
        kept = self.env.front.kept()
        if kept is not None:
            return self._status(lambda: kept.answer)
        return await anyio.to_thread.run_sync(self._status, self.env.front)

    def _status(self, ask: Callable[[], FrontStatus | None]) -> CallToolResult:
        try:
            view = app.status(self.env.home, ask)
        except BROKEN as exc:
            raise broken(exc) from exc
        view = view.model_copy(update={"server_mode": self.env.mode})
        return result(view, render.status_text(view))

    def registry(
        self,
        candidate_id: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=130,
                description="one candidate id (manifest:variant); omit to list them",
            ),
        ] = None,
        candidate_class: Annotated[
            CandidateClass | None, Field(description="only candidates of this class")
        ] = None,
        preflight: Annotated[
            Literal["passed", "failed"] | None, Field(description="only these")
        ] = None,
        verdict: Annotated[
            Literal["untried", "qualified", "rejected", "inconclusive"] | None,
            Field(description="only candidates whose last verdict here is this"),
        ] = None,
        page: PageArgument = 1,
    ) -> CallToolResult:
        home = self.env.home
        only = app.RegistryFilter(
            candidate_class=candidate_class.value if candidate_class else None,
            preflight=preflight,
            verdict=verdict,
        )
        key, compute = self._registry_read(candidate_id, only)
        try:
            view = self.env.reads.get(key, registry_inputs(home), compute)
        except BROKEN as exc:
            raise broken(exc) from exc
        if candidate_id and not view.candidates:
            raise ToolError(render.agent_can_fix(app.unknown_candidate(home, candidate_id)))
        if candidate_id:
            return result(view, render.registry_text(view))
        try:
            shown = registry_page(view, page)
        except NoSuchPage as exc:
            raise ToolError(render.agent_can_fix(str(exc))) from exc
        return result(shown, render.registry_text(shown, shown.page, shown.pages))

    def evidence(
        self,
        cycle_id: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=80,
                pattern=CYCLE_ID,
                description="a cycle id, or latest; omit to list sealed cycles",
            ),
        ] = None,
        section: Annotated[
            app.Section | None,
            Field(description="summary (default), table, gates, verdict, plan or journal"),
        ] = None,
        page: PageArgument = 1,
    ) -> CallToolResult:
        try:
            view = app.evidence_view(self.env.home, cycle_id, section, page)
            return self._evidence(view, page)
        except FileNotFoundError as exc:
            said = f"{exc}; call evidence alone to list cycles"
            raise ToolError(render.agent_can_fix(said)) from exc
        except NoSuchPage as exc:
            raise ToolError(render.agent_can_fix(str(exc))) from exc
        except BROKEN as exc:
            raise broken(exc) from exc

    def _evidence(self, view: app.EvidenceView, page: int) -> CallToolResult:
        if view.cycles is not None or view.section == "journal":  # the flows page these
            check_page(page, view.pages)
            return result(view, render.evidence_text(view))
        if view.section == "summary":
            view = with_report(self.env.home, view)
            return result(fit_summary(view), render.evidence_text(view))
        view = paged_section(view, page)
        return result(view, render.evidence_text(view))

    async def propose_plan(
        self,
        plan: PlanArgument,
        dry_run: Annotated[bool, Field(description="true: explain, queue nothing")] = False,
        follow_s: Annotated[
            int,
            Field(
                ge=0,
                le=MAX_FOLLOW_S,
                description="seconds to follow the cycle with progress notifications (0: "
                "return at once)",
            ),
        ] = 0,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, app.ProposalView]:
        env = self.env
        session = ctx.request_context.session if ctx is not None else None

        def run() -> app.ProposalView:
            return app.propose(
                env.home,
                plan,
                proposed_by=client_name(session),
                dry_run=dry_run,
                start_supervisor=env.start_supervisor,
            )

        try:
            view = await anyio.to_thread.run_sync(run)
        except BROKEN as exc:
            raise broken(exc) from exc
        if not view.accepted:
            return refusal(view, person_fix(env.home, view, self._registry))
        if env.mode == "autonomous" and env.start_supervisor and not dry_run:
            app.ensure_watcher(env.home)  # restarted if it died; the plan itself runs now
        if follow_s and not dry_run and view.plan_id:
            view = await follow_cycle(env.home, view, follow_s, ctx)
        return result(view, render.proposal_text(view))


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name (a method of ``Tools``), title, hints, description, the model of its
    structured result, and whether ``tools/list`` shows that model's (compact) schema."""

    name: str
    title: str
    annotations: ToolAnnotations
    description: str
    result: type[BaseModel]
    listed_schema: bool = False
    writes: bool = False  # not offered in read-only mode


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "status",
        "Service status",
        READ_ONLY,
        "What serves now and what mcp-infra is doing: the managed service and its health, the "
        "cycle in progress (step, round, time left), the queue, the last sealed cycle, the "
        "policy's maintenance window, and anything that needs a person. Cheap: call it to "
        "follow a cycle.",
        app.StatusView,
        listed_schema=True,
    ),
    ToolSpec(
        "registry",
        "Candidate registry",
        READ_ONLY,
        "The configurations mcp-infra can measure here, by candidate id (manifest:variant): "
        "class, semantics (lossless: greedy tokens identical to the baseline's; lossy: a "
        "quality budget), knobs, each preflight check on this machine, auto-promotion and what "
        "past cycles decided. Page 1 opens with a summary; `pages` says how many there are. "
        "Only candidates with preflight_passed can run; they come first, untried ones first.",
        RegistryPage,
    ),
    ToolSpec(
        "evidence",
        "Cycle evidence",
        READ_ONLY,
        "Sealed results of past cycles. Without cycle_id: the cycles, newest first, a page at "
        "a time. With cycle_id (or latest): the summary (outcome, verification, each "
        "candidate's decision and figures), or a section: table, gates (first divergence of "
        "any greedy output), verdict, plan or journal; long sections come in pages.",
        app.EvidenceView,
    ),
    ToolSpec(
        "propose_plan",
        "Propose an experiment plan",
        PROPOSE,
        "Queue an experiment: 1-16 candidate ids from `registry` (4 or more are screened "
        "first: one short start each drops the clear losers), e.g. "
        '{"hypothesis": "a 4-token drafter decodes faster", "candidates": '
        '["demo-tiny:draft-k4"]}. Code '
        "sanitizes it (unknown or non-runnable ids refused, thresholds only tightened), then "
        "measures each against the live baseline, gates it and promotes only a qualified "
        "winner; keeping the baseline is a valid result. Returns at once (the cycle runs when "
        "the policy's window allows); dry_run=true explains without queuing. A refused plan "
        "is a tool error (isError: true) whose problems name each field and limit: fix them "
        "and call again.",
        app.ProposalView,
        listed_schema=True,
        writes=True,
    ),
)


def register_tools(server: MCPServer, env: ServerEnv) -> dict[str, type[BaseModel]]:
    """Register the mode's tools; return each one's strict argument model (for the guard)."""
    tools = Tools(env)
    models: dict[str, type[BaseModel]] = {}
    for spec in TOOLS:
        if spec.writes and env.mode == "read-only":
            continue
        server.add_tool(
            getattr(tools, spec.name),
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=spec.annotations,
        )
        registered = server._tool_manager.get_tool(spec.name)
        assert registered is not None, spec.name
        registered.parameters["additionalProperties"] = False  # the guard refuses extras
        meta = registered.fn_metadata
        meta.output_schema = compact_schema(spec.result) if spec.listed_schema else None
        models[spec.name] = strict(meta.arg_model)
    return models


def compact_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's top-level fields and their JSON types (a nested object is ``object``): true
    of every answer, and a few hundred characters where the full schema is thousands."""
    full = model.model_json_schema()
    defs = full.get("$defs", {})

    def types(prop: dict[str, Any]) -> list[str]:
        if "$ref" in prop:
            target = defs.get(prop["$ref"].rsplit("/", 1)[-1], {})
            return types(target) if "enum" in target else ["object"]
        if "anyOf" in prop:
            return sorted({t for option in prop["anyOf"] for t in types(option)})
        if "enum" in prop:
            return sorted({type_name(v) for v in prop["enum"]})
        kind = prop.get("type")
        return [kind] if isinstance(kind, str) else list(kind or [])

    properties = {}
    for name, prop in full["properties"].items():
        kinds = types(prop)
        properties[name] = {"type": kinds[0] if len(kinds) == 1 else kinds} if kinds else {}
    return {"type": "object", "properties": properties, "required": full.get("required", [])}


def type_name(value: Any) -> str:
    return {str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), "null" if value is None else "object"
    )


def registry_page(view: app.RegistryView, page: int) -> RegistryPage:
    """Page ``page`` of the view's candidates, opened by the summary of all of them; the page's
    other fields (what the catalog leaves out, what did not load) count against its size."""
    frame = RegistryPage.model_validate(
        {**dict(view), "candidates": [], "summary": registry_summary(view)}
    )
    got = page_of(view.candidates, page, REGISTRY_PAGE - json_size(frame) - 20)
    return frame.model_copy(update={"candidates": got.items, "page": got.page, "pages": got.pages})


def registry_summary(view: app.RegistryView) -> RegistrySummary:
    """What every page opens with: how many candidates, which pass preflight, per manifest."""
    manifests: dict[str, dict[str, int]] = {}
    for c in view.candidates:
        counts = manifests.setdefault(c.id.split(":", 1)[0], {"variants": 0, "pass": 0})
        counts["variants"] += 1
        counts["pass"] += int(c.preflight_passed)
    return RegistrySummary(
        candidates=len(view.candidates),
        pass_preflight=sum(c.preflight_passed for c in view.candidates),
        proposable=proposable(view),
        manifests=manifests,
    )


def with_report(home: Home, view: app.EvidenceView) -> app.EvidenceView:
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


def fit_summary(view: app.EvidenceView) -> dict[str, Any]:
    """The summary's structured content within ``READ_BUDGET``: each candidate's decision and
    figures without its per-prompt and per-cell rows (the summary's ``table`` has the prompts;
    section verdict has both), each gate without its comparisons (section gates), no list of
    checks (``verified`` and ``failed_checks`` stay), no per-server cost rows; and where a long
    suite still makes it too large, without the table (section table pages it)."""
    update: dict[str, Any] = {"checks": None}
    if view.verdict is not None:
        candidates = [
            c.model_copy(
                update={"gates": [bare(g) for g in c.gates], "per_prompt": [], "cells": []}
            )
            for c in view.verdict.candidates
        ]
        update["verdict"] = view.verdict.model_copy(update={"candidates": candidates})
    if view.cost is not None:
        update["cost"] = view.cost.model_copy(update={"servers": []})
    data = view.model_copy(update=update).model_dump(mode="json")
    if json_size(data) > READ_BUDGET:
        data["table"] = None
    return data


def bare(gate: GateResult) -> GateResult:
    return gate.model_copy(update={"comparisons": []})


def paged_section(view: app.EvidenceView, page: int) -> app.EvidenceView:
    """A section's list in pages that keep the answer within ``READ_BUDGET`` characters (the
    verdict by candidate, the gates by result, the table by row); a section without a list
    has one page."""
    if view.verdict is not None and view.section == "verdict":
        empty = view.verdict.model_copy(update={"candidates": []})
        got = page_of(view.verdict.candidates, page, _room(view, verdict=empty))
        verdict = view.verdict.model_copy(update={"candidates": got.items})
        return view.model_copy(update={"verdict": verdict, "page": got.page, "pages": got.pages})
    for name in ("gates", "table"):
        rows = getattr(view, name)
        if rows is not None and view.section == name:
            got = page_of(rows, page, _room(view, **{name: []}))
            return view.model_copy(update={name: got.items, "page": got.page, "pages": got.pages})
    check_page(page, 1)
    return view


def _room(view: app.EvidenceView, **emptied: Any) -> int:
    """Characters left for a section's list once the rest of the view is counted."""
    return READ_BUDGET - json_size(view.model_copy(update=emptied))


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
            await tell(1.0, render.follow_progress(status, view.plan_id))
            return view.model_copy(update={"follow": render.followed_to_the_end(last)})
        cycle = status.cycle
        moved = _fraction(cycle) if cycle is not None and cycle.plan_id == view.plan_id else 0.0
        await tell(moved, render.follow_progress(status, view.plan_id))
        await anyio.sleep(FOLLOW_POLL_S)
    return view.model_copy(update={"follow": render.followed_for(follow_s)})
