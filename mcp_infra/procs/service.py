"""The live service on the stable port, and scratch servers for candidates, with their records.

Records live in ``state/``: ``service.json`` for the stable server, ``candidates/<port>.json`` for
scratch servers. A record is written right after a process starts and removed after it stops, so
a supervisor killed at any point leaves enough on disk to find and stop what it started — and
nothing else: a process on a port without our record is refused, never killed.
"""

from __future__ import annotations

import time
from pathlib import Path

from mcp_infra.contracts import ProcessRecord, Recipe, ServiceConfig
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.runtime import (
    PortBusy,
    ServerStartError,
    build_argv,
    is_running,
    port_open,
    port_owner_is,
    probe_completion,
    start_server,
    stop_server,
    wait_ready,
)
from mcp_infra.state.context import service_record
from mcp_infra.state.store import Home, file_safe, read_optional, write_model


class ServiceError(ServerUnavailable):
    """The live service could not be brought to the wanted recipe."""










def is_serving(home: Home, recipe: Recipe, config: ServiceConfig) -> bool:
    """Our recorded stable server runs exactly this recipe's command and answers."""
    record = service_record(home)
    if record is None or not is_running(record):
        return False
    if record.argv != build_argv(recipe, config.port, python=record.argv[0]):
        return False
    return probe_completion(f"http://{record.host}:{record.port}")


def stop_service(home: Home, grace: float = 10.0) -> str:
    record = service_record(home)
    if record is None:
        return "no service recorded"
    outcome = stop_server(record, grace=grace)
    (home.service_file).unlink(missing_ok=True)
    return outcome


def start_service(home: Home, recipe: Recipe, config: ServiceConfig, *, cycle_id: str | None = None,
                  timeout: float = 120.0, grace: float = 10.0) -> ProcessRecord:
    """Bring the stable port to ``recipe``: stop our old server, refuse strangers, start, wait."""
    record = service_record(home)
    if record is not None:
        stop_server(record, grace=grace)
        (home.service_file).unlink(missing_ok=True)
        _wait_port_free(config.port, 5.0)  # the kernel may close our old socket a moment later
    if port_open(config.port):
        raise PortBusy(f"port {config.port} is held by a process mcp-infra did not start; "
                       "refusing to touch it")
    log = home.logs / f"stable-{config.port}.log"
    new, proc = start_server(recipe, port=config.port, role="stable", log_path=log,
                             cycle_id=cycle_id, hf_cache=home.hf_cache)
    write_model(home.service_file, new)
    try:
        wait_ready(new, timeout=timeout)
    except ServerStartError:
        stop_server(new, grace=grace)
        (home.service_file).unlink(missing_ok=True)
        raise
    return new


def _wait_port_free(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)


def ensure_serving(home: Home, recipe: Recipe, config: ServiceConfig, **kwargs: object) -> str:
    """Make the stable port serve ``recipe``; return what was done."""
    if is_serving(home, recipe, config):
        return "already serving"
    start_service(home, recipe, config, **kwargs)  # type: ignore[arg-type]
    return "started"


def stable_port_held_by_stranger(home: Home, config: ServiceConfig) -> bool:
    return port_open(config.port) and not port_owner_is(service_record(home), config.port)


# scratch servers ------------------------------------------------------------------------------


def candidate_record_path(home: Home, port: int) -> Path:
    return home.candidates_dir / f"{port}.json"


def start_candidate(home: Home, recipe: Recipe, config: ServiceConfig, *, cycle_id: str,
                    timeout: float, grace: float = 10.0) -> ProcessRecord:
    log = home.cycle_files(cycle_id).logs / f"{file_safe(recipe.candidate_id)}.log"
    record, _ = start_server(recipe, port=config.scratch_port, role="candidate", log_path=log,
                             cycle_id=cycle_id, hf_cache=home.hf_cache)
    write_model(candidate_record_path(home, config.scratch_port), record)
    try:
        wait_ready(record, timeout=timeout)
    except ServerStartError:
        stop_candidate(home, record, grace=grace)
        raise
    return record


def stop_candidate(home: Home, record: ProcessRecord, grace: float = 10.0) -> str:
    outcome = stop_server(record, grace=grace)
    candidate_record_path(home, record.port).unlink(missing_ok=True)
    return outcome


def stop_stray_candidates(home: Home, grace: float = 10.0) -> list[str]:
    """Stop every scratch server we recorded (by record only: pid + start time + argv)."""
    done = []
    folder = home.candidates_dir
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_optional(path, ProcessRecord)
        if record is None:
            continue
        outcome = stop_server(record, grace=grace)
        path.unlink(missing_ok=True)
        done.append(f"{record.candidate_id} (pid {record.pid}): {outcome}")
    return done
