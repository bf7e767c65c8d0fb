"""Every text mcp-infra writes for a person or a model, in one place.

The MCP tools and the CLI show the same words for the same view: each tool also returns the view
as structured content, and this text is its summary, written to be enough on its own for a model
that only sees text, and bounded in size. The planning prompt, the server's instructions, the
words of an error (and who can fix it) and the demo's table live here too. Declarations stay
with what they declare (a tool's description in its table, an option's help in the command
table); the HTML report is its own renderer (``faces/report.py``).

Three modules, one import path (``from mcp_infra.faces import render``): ``words`` (shared
words), ``views`` (the views' texts), ``prompt`` (the server and the planner).
"""

from __future__ import annotations

from mcp_infra.faces.render.prompt import (
    follow_progress,
    followed_for,
    followed_to_the_end,
    local_plan_text,
    menu_prompt,
    plan_example,
    planning_prompt,
    retry_prompt,
    server_instructions,
    unconfigured_prompt,
)
from mcp_infra.faces.render.views import (
    cycles_text,
    evidence_text,
    init_text,
    prepared_text,
    proposal_text,
    registry_text,
    screening_lines,
    status_text,
    summary_line,
    table_rows,
    task_check_text,
    tasks_text,
    verdict_table,
    verification_text,
)
from mcp_infra.faces.render.words import (
    CONFIGURE,
    EXCERPT,
    MAX_DIVERGENCES,
    MAX_TEXT,
    METHOD,
    PREPARE,
    agent_can_fix,
    bounded,
    cannot_read_own_files,
    cost_line,
    cost_text,
    divergences_once,
    excerpt,
    generic,
    person_must,
    plain,
    runtime_line,
    service_text,
    short,
    unconfigured,
)

__all__ = [
    "CONFIGURE",
    "EXCERPT",
    "MAX_DIVERGENCES",
    "MAX_TEXT",
    "METHOD",
    "PREPARE",
    "agent_can_fix",
    "bounded",
    "cannot_read_own_files",
    "cost_line",
    "cost_text",
    "cycles_text",
    "divergences_once",
    "evidence_text",
    "excerpt",
    "follow_progress",
    "followed_for",
    "followed_to_the_end",
    "generic",
    "init_text",
    "local_plan_text",
    "menu_prompt",
    "person_must",
    "plain",
    "plan_example",
    "planning_prompt",
    "prepared_text",
    "proposal_text",
    "registry_text",
    "retry_prompt",
    "runtime_line",
    "screening_lines",
    "server_instructions",
    "service_text",
    "short",
    "status_text",
    "summary_line",
    "table_rows",
    "task_check_text",
    "tasks_text",
    "unconfigured",
    "unconfigured_prompt",
    "verdict_table",
    "verification_text",
]
