"""The tests' name for `mcp_infra.demo.faults` (real fault injection, shared with
`benchmarks/faults.py`), so the crash-safety tests keep their imports."""

from mcp_infra.demo.faults import (
    candidate_records,
    disk_full_at,
    inspect,
    pause_and_kill,
    project_servers,
    queue_plan,
    recover_command,
    release,
    run_supervisor,
    small_disk,
    start_live,
    stranger,
    supervisor,
    supervisor_log,
    wait_for,
    wait_paused,
)

__all__ = [
    "candidate_records",
    "disk_full_at",
    "inspect",
    "pause_and_kill",
    "project_servers",
    "queue_plan",
    "recover_command",
    "release",
    "run_supervisor",
    "small_disk",
    "start_live",
    "stranger",
    "supervisor",
    "supervisor_log",
    "wait_for",
    "wait_paused",
]
