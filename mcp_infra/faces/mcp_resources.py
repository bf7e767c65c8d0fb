"""The MCP resources, registered from ``RESOURCES``, and the completion of their ids.

Each resource is a method of ``Resources`` over one home (a template's variables are the
method's parameters). Long documents come in pages: a sealed cycle's whole summary view in pages
of ``SUMMARY_PAGE`` characters, its HTML report in pages of ``REPORT_PAGE``; concatenated, the
pages are the document. The full JSON schema of each tool's structured result is here too
(``mcp-infra://schemas/{tool}``), as ``tools/list`` shows only compact ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp_types import Completion, ResourceTemplateReference

from mcp_infra.core.preflight import manifest_hash
from mcp_infra.core.sanitize import policy_hash
from mcp_infra.faces import render
from mcp_infra.faces.mcp_tools import CYCLE_ID, TOOLS, URI, ServerEnv
from mcp_infra.faces.paging import NoSuchPage, text_page, text_pages
from mcp_infra.flows import api as app
from mcp_infra.flows import planning
from mcp_infra.state.context import HomeContext
from mcp_infra.state.store import Home

SUMMARY_PAGE = 20_000
REPORT_PAGE = 50_000
JSON = "application/json"


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str, ensure_ascii=False)


class Resources:
    """The resources of one home; each method reads one resource."""

    def __init__(self, env: ServerEnv) -> None:
        self.home = env.home

    def policy(self) -> str:
        policy = HomeContext(self.home).policy
        return _json({"policy": policy.model_dump(mode="json"), "hash": policy_hash(policy)})

    def plan_schema(self) -> str:
        return _json(planning.plan_schema())

    def schema(self, tool: str) -> str:
        spec = next((t for t in TOOLS if t.name == tool), None)
        if spec is None:
            raise ResourceNotFoundError(f"no such tool; tools: {', '.join(t.name for t in TOOLS)}")
        return _json(spec.result.model_json_schema())

    def manifest(self, manifest_id: str) -> str:
        manifests = HomeContext(self.home).manifests
        found = manifests.get(manifest_id) if isinstance(manifest_id, str) else None
        if found is None:
            raise ResourceNotFoundError("no such manifest; see the registry tool for ids")
        return _json(
            {
                "manifest": found.model_dump(mode="json", by_alias=True),
                "hash": manifest_hash(found),
                "candidates": [f"{found.id}:{v.id}" for v in found.variants],
            }
        )

    def candidate(self, candidate_id: str) -> str:
        view = app.registry_view(self.home, candidate_id)
        if not view.candidates:
            raise ResourceNotFoundError(app.unknown_candidate(self.home, candidate_id))
        return _json(view.candidates[0].model_dump(mode="json"))

    def evidence_summary(self, cycle_id: str) -> str:
        view = self._summary_view(cycle_id)
        compact = compact_summary(view)
        compact["pages"] = text_pages(self._whole(view), SUMMARY_PAGE)
        return _json(compact)

    def evidence_summary_page(self, cycle_id: str, page: str) -> str:
        return _page(self._whole(self._summary_view(cycle_id)), page, SUMMARY_PAGE)

    def evidence_report(self, cycle_id: str) -> str:
        return self._report(cycle_id)

    def evidence_report_page(self, cycle_id: str, page: str) -> str:
        return _page(self._report(cycle_id), page, REPORT_PAGE)

    def _whole(self, view: app.EvidenceView) -> str:
        return _json(view.model_dump(mode="json", exclude_none=True))

    def _report(self, cycle_id: str) -> str:
        from mcp_infra.faces import evidence_cli
        from mcp_infra.state.evidence import bundle_path

        if not re.fullmatch(CYCLE_ID, cycle_id):
            raise ResourceNotFoundError("not a cycle id")
        try:
            bundle = bundle_path(self.home, cycle_id)
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        return evidence_cli.current_report(self.home, bundle).read_text(encoding="utf-8")

    def _summary_view(self, cycle_id: str) -> app.EvidenceView:
        if not re.fullmatch(CYCLE_ID, cycle_id):
            raise ResourceNotFoundError("not a cycle id")
        try:
            return app.evidence_view(self.home, cycle_id, "summary")
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(str(exc)) from exc


def _page(text: str, page: str, size: int) -> str:
    try:
        return text_page(text, page, size)
    except NoSuchPage as exc:
        raise ResourceNotFoundError(str(exc)) from exc


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


@dataclass(frozen=True)
class ResourceSpec:
    """One resource: its URI (a template where it has ``{variables}``), the method of
    ``Resources`` that reads it, and what ``resources/list`` says about it."""

    uri: str
    method: str
    title: str
    description: str
    mime_type: str = JSON


RESOURCES: tuple[ResourceSpec, ...] = (
    ResourceSpec(
        f"{URI}policy",
        "policy",
        "Effective policy",
        "The policy that judges plans here: thresholds with the range a plan may move them in, "
        "protocol, auto-promotion per class, window, budgets.",
    ),
    ResourceSpec(
        f"{URI}plan-schema",
        "plan_schema",
        "Plan JSON schema",
        "The JSON schema of what propose_plan accepts (nothing else).",
    ),
    ResourceSpec(
        f"{URI}schemas/{{tool}}",
        "schema",
        "A tool's result schema",
        "The full JSON schema of a tool's structured result (status, registry, evidence, "
        "propose_plan).",
    ),
    ResourceSpec(
        f"{URI}manifests/{{manifest_id}}",
        "manifest",
        "Candidate manifest",
        "One registry manifest (the part of a candidate id before ':').",
    ),
    ResourceSpec(
        f"{URI}candidates/{{candidate_id}}",
        "candidate",
        "One candidate",
        "One registry candidate (manifest:variant) as the registry tool shows it. Candidate "
        "ids complete (completion/complete).",
    ),
    ResourceSpec(
        f"{URI}evidence/{{cycle_id}}/summary",
        "evidence_summary",
        "Cycle evidence summary",
        "A sealed cycle's summary, compact (cycle_id 'latest': the newest). The whole view is "
        f"in pages of at most {SUMMARY_PAGE:,} characters at …/summary/1, /2, … (`pages` "
        "says how many).",
    ),
    ResourceSpec(
        f"{URI}evidence/{{cycle_id}}/summary/{{page}}",
        "evidence_summary_page",
        "Cycle evidence summary, one page",
        "One page of a sealed cycle's whole summary view as JSON text; concatenated in order, "
        "the pages are that JSON document.",
        "text/plain",
    ),
    ResourceSpec(
        f"{URI}evidence/{{cycle_id}}/report",
        "evidence_report",
        "Cycle evidence report (HTML)",
        "A sealed cycle's report as one self-contained HTML page (no network fetch). Read it "
        f"in pages of at most {REPORT_PAGE:,} characters at …/report/1, /2, …",
        "text/html",
    ),
    ResourceSpec(
        f"{URI}evidence/{{cycle_id}}/report/{{page}}",
        "evidence_report_page",
        "Cycle evidence report, one page",
        "One page of the report's HTML; concatenated in order, the pages are the page.",
        "text/plain",
    ),
)


def register_resources(server: MCPServer, env: ServerEnv) -> None:
    """Every resource of ``RESOURCES``, each known manifest and tool schema listed by name, and
    the completion of ids for the templates."""
    resources = Resources(env)
    for spec in RESOURCES:
        server.resource(
            spec.uri,
            name=spec.method.replace("_", "-"),
            title=spec.title,
            mime_type=spec.mime_type,
            description=spec.description,
        )(getattr(resources, spec.method))
    try:
        known = list(HomeContext(env.home).manifests)
    except Exception:  # a broken home manifest must not stop the server; the template remains
        known = []
    for manifest_id in known:  # listed by resources/list; the template serves later additions
        server.resource(
            f"{URI}manifests/{manifest_id}",
            name=f"manifest-{manifest_id}",
            title=f"Manifest {manifest_id}",
            mime_type=JSON,
            description=f"The registry manifest {manifest_id}.",
        )(_reader(resources.manifest, manifest_id))
    for tool in TOOLS:
        server.resource(
            f"{URI}schemas/{tool.name}",
            name=f"schema-{tool.name}",
            title=f"Result schema of {tool.name}",
            mime_type=JSON,
            description=f"The full JSON schema of the {tool.name} tool's structured result.",
        )(_reader(resources.schema, tool.name))

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        """Candidate, manifest and cycle ids (with `latest`) for the resource templates."""
        if not isinstance(ref, ResourceTemplateReference):
            return None
        return Completion(values=completions(env.home, argument.name, argument.value)[:100])


def _reader(read: Any, argument: str) -> Any:
    def one() -> str:
        return str(read(argument))

    one.__name__ = f"{read.__name__}_{re.sub(r'[^A-Za-z0-9_]', '_', argument)}"
    return one


def completions(home: Home, name: str, prefix: str) -> list[str]:
    """Values for a template variable that begin with ``prefix``: candidate ids, manifest ids,
    cycle ids newest first (after `latest`), tools, pages."""
    from mcp_infra.state.evidence import LATEST, list_cycles

    if name == "candidate_id":
        manifests = HomeContext(home).manifests.values()
        values = [f"{m.id}:{v.id}" for m in manifests for v in m.variants]
    elif name == "manifest_id":
        values = list(HomeContext(home).manifests)
    elif name == "cycle_id":
        values = [LATEST, *(c.cycle_id for c in list_cycles(home))]
    elif name == "tool":
        values = [t.name for t in TOOLS]
    elif name == "page":
        values = [str(n) for n in range(1, 10)]
    else:
        values = []
    return [v for v in values if v.startswith(prefix)]
