"""The functions both faces call: the MCP server (for agents) and the CLI (for people).

One import for the faces, so they hold no logic of their own. The read views
(``flows.status``, ``flows.views``) only read files and answer fast, also during a cycle; the
proposal path (``flows.proposal``) validates, sanitizes and freezes a plan, queues it, and makes
sure a detached supervisor runs it, never touching the service itself.
"""

from __future__ import annotations

from mcp_infra.flows.own import InitOptions, InitView, init_model
from mcp_infra.flows.proposal import (
    ProposalView,
    ensure_watcher,
    init_service,
    prepare_candidate,
    propose,
)
from mcp_infra.flows.status import NOMINAL_STATES, CycleView, StatusView, status
from mcp_infra.flows.views import (
    CandidateView,
    EvidenceView,
    RegistryFilter,
    RegistryView,
    RuntimeView,
    Section,
    evidence_view,
    knobs_text,
    registry_view,
    unknown_candidate,
)

__all__ = [
    "NOMINAL_STATES",
    "CandidateView",
    "CycleView",
    "EvidenceView",
    "InitOptions",
    "InitView",
    "ProposalView",
    "RegistryFilter",
    "RegistryView",
    "RuntimeView",
    "Section",
    "StatusView",
    "ensure_watcher",
    "evidence_view",
    "init_model",
    "init_service",
    "knobs_text",
    "prepare_candidate",
    "propose",
    "registry_view",
    "status",
    "unknown_candidate",
]
