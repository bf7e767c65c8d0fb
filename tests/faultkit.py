"""The tests' name for `mcp_infra.demo.faults` (real fault injection, shared with
`benchmarks/faults.py`), so the crash-safety tests keep their imports."""

from mcp_infra.demo.faults import (
    candidate_records,
    inspect,
    pause_and_kill,
    project_servers,
    queue_plan,
    run_supervisor,
    start_live,
    stranger,
    supervisor,
    wait_for,
)

__all__ = [
    "candidate_records",
    "inspect",
    "pause_and_kill",
    "project_servers",
    "queue_plan",
    "run_supervisor",
    "start_live",
    "stranger",
    "supervisor",
    "wait_for",
]
