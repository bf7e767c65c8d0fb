"""The live service behind the front, and candidate servers, with their records.

The stable port belongs to the front (``procs/front.py``); every backend (the live recipe, each
candidate, a promoted winner) runs on a free port of its own. Records live in ``state/``:
``front.json`` for the front, ``service.json`` for the live backend, ``candidates/<port>.json``
for every other backend (candidates, a winner not yet adopted, an old backend being drained).
A record is written right after a process starts and removed after it stops, so
a supervisor killed at any point leaves enough on disk to find and stop what it started — and
nothing else: a process on a port without our record is refused, never killed.
"""

from __future__ import annotations

from pathlib import Path

from mcp_infra.contracts import ProcessRecord, Recipe, ServiceConfig, ServicePolicy
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.front import (
    drain,
    ensure_front,
    front_record,
    front_running,
    read_route,
    set_route,
    stop_front,
)
from mcp_infra.procs.runtime import (
    PortBusy,
    ServerStartError,
    build_argv,
    free_port,
    is_running,
    port_open,
    port_owner_is,
    probe_completion,
    start_server,
    stop_server,
    wait_ready,
)
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home, read_optional, write_model


class ServiceError(ServerUnavailable):
    """The live service could not be brought to the wanted recipe."""


def backend_url(record: ProcessRecord) -> str:
    return f"http://{record.host}:{record.port}"


def service_policy(home: Home) -> ServicePolicy:
    """The policy's service section (hold bound, drain bound, memory budget); defaults if the
    policy cannot be read, so restoring the service never depends on it."""
    try:
        from mcp_infra.state.catalog import load_policy

        return load_policy(load_config(home).policy, extra=home.user_policy).service
    except Exception:
        return ServicePolicy()


def is_serving(home: Home, recipe: Recipe, config: ServiceConfig) -> bool:
    """Our recorded live backend runs exactly this recipe's command and answers, and our front
    on the stable port routes to it."""
    record = service_record(home)
    if record is None or not is_running(record):
        return False
    if record.argv != build_argv(recipe, record.port, python=record.argv[0]):
        return False
    route = read_route(home)
    if (
        not front_running(home)
        or route is None
        or route.mode != "serve"
        or (route.backend_url != backend_url(record))
    ):
        return False
    return probe_completion(backend_url(record))


def stop_service(home: Home, grace: float = 10.0) -> str:
    """Stop the front (clients are refused, not held) and the live backend."""
    front = stop_front(home, grace=grace)
    record = service_record(home)
    if record is None:
        return f"front: {front}; no backend recorded"
    outcome = stop_server(record, grace=grace)
    (home.service_file).unlink(missing_ok=True)
    return f"front: {front}; backend: {outcome}"


def start_backend(
    home: Home,
    recipe: Recipe,
    *,
    role: str,
    log: Path,
    cycle_id: str | None,
    timeout: float,
    grace: float = 10.0,
    tries: int = 3,
) -> ProcessRecord:
    """Start a server on a free port, recorded under state/candidates/ until it is adopted. A
    port someone else took meanwhile means another port, never a verdict on the recipe."""
    last: Exception | None = None
    for _ in range(tries):
        port = free_port()
        try:
            record, _ = start_server(
                recipe,
                port=port,
                role=role,
                log_path=log,
                cycle_id=cycle_id,
                hf_cache=home.hf_cache,
            )
        except PortBusy as exc:
            last = exc
            continue
        write_model(candidate_record_path(home, port), record)
        try:
            waited = wait_ready(record, timeout=timeout)
        except ServerStartError as exc:
            stop_candidate(home, record, grace=grace)
            if "address already in use" in str(exc).lower():
                last = exc
                continue
            raise
        record = record.model_copy(update={"ready_s": round(waited, 2)})
        write_model(candidate_record_path(home, port), record)
        return record
    raise ServerStartError(f"no free port could be bound after {tries} tries: {last}")


def adopt(
    home: Home, new: ProcessRecord, config: ServiceConfig, *, reason: str = "", grace: float = 10.0
) -> str:
    """Make ``new`` the live backend: switch the front to it atomically, let requests in flight
    on the old one finish (bounded drain), then stop the old one. The old record is kept among
    the candidates until it is stopped, so recovery finds it if we die in between."""
    policy = service_policy(home)
    old = service_record(home)
    if old is not None and (old.pid, old.create_time) == (new.pid, new.create_time):
        old = None
    if old is not None:
        write_model(candidate_record_path(home, old.port), old)
    write_model(home.service_file, new.model_copy(update={"role": "backend"}))
    candidate_record_path(home, new.port).unlink(missing_ok=True)
    ensure_front(home, config)
    set_route(
        home,
        mode="serve",
        backend_url=backend_url(new),
        candidate_id=new.candidate_id,
        max_hold_s=policy.max_hold_s,
        reason=reason or f"serve {new.candidate_id}",
    )
    note = "switched"
    if old is not None:
        left = drain(home, backend_url(old), policy.drain_s) if is_running(old) else 0
        stop_server(old, grace=grace)
        candidate_record_path(home, old.port).unlink(missing_ok=True)
        note += (
            f"; old backend stopped ({left} request(s) still in flight after the drain)"
            if left
            else "; old backend drained and stopped"
        )
    return note


def hold_live(home: Home, config: ServiceConfig, *, reason: str, grace: float = 10.0) -> str:
    """Exclusive mode: the front holds new requests, in-flight ones finish, the live backend
    stops (its memory is freed for what comes next)."""
    policy = service_policy(home)
    ensure_front(home, config)
    set_route(home, mode="hold", max_hold_s=policy.max_hold_s, reason=reason)
    record = service_record(home)
    if record is None:
        return "holding; no live backend recorded"
    left = drain(home, backend_url(record), policy.drain_s) if is_running(record) else 0
    outcome = stop_server(record, grace=grace)
    (home.service_file).unlink(missing_ok=True)
    return f"holding; live backend {outcome}" + (f" ({left} in flight)" if left else "")


def start_service(
    home: Home,
    recipe: Recipe,
    config: ServiceConfig,
    *,
    cycle_id: str | None = None,
    timeout: float = 120.0,
    grace: float = 10.0,
    exclusive: bool = False,
) -> ProcessRecord:
    """Bring the stable endpoint to ``recipe``: the front stays; a new backend starts on its own
    port and the front switches to it. ``exclusive``: stop the old backend first (the front
    holds requests meanwhile), for when two backends do not fit in memory."""
    ensure_front(home, config)
    if exclusive:
        hold_live(home, config, reason=f"exclusive swap to {recipe.candidate_id}", grace=grace)
    log = home.logs / f"backend-{recipe.candidate_id.replace(':', '_')}.log"
    new = start_backend(
        home, recipe, role="backend", log=log, cycle_id=cycle_id, timeout=timeout, grace=grace
    )
    adopt(home, new, config, grace=grace)
    return new


def ensure_serving(home: Home, recipe: Recipe, config: ServiceConfig, **kwargs: object) -> str:
    """Make the stable endpoint serve ``recipe``: the front runs, the live backend runs this
    recipe, and the route points at it; return what was done. Replacing a different running
    backend is done exclusively (recovery does not know whether two fit in memory)."""
    front = ensure_front(home, config)
    record = service_record(home)
    if (
        record is not None
        and is_running(record)
        and record.argv == build_argv(recipe, record.port, python=record.argv[0])
        and probe_completion(backend_url(record))
    ):
        route = read_route(home)
        if route is None or route.mode != "serve" or route.backend_url != backend_url(record):
            set_route(
                home,
                mode="serve",
                backend_url=backend_url(record),
                candidate_id=record.candidate_id,
                max_hold_s=service_policy(home).max_hold_s,
                reason="route restored to the live backend",
            )
            return "route restored" + ("; front restarted" if front == "started" else "")
        return "already serving" + ("; front restarted" if front == "started" else "")
    replacing = record is not None and is_running(record)
    kwargs.setdefault("exclusive", replacing)
    start_service(home, recipe, config, **kwargs)  # type: ignore[arg-type]
    return "started"


def stable_port_held_by_stranger(home: Home, config: ServiceConfig) -> bool:
    return port_open(config.port) and not port_owner_is(front_record(home), config.port)


# scratch servers ------------------------------------------------------------------------------


def candidate_record_path(home: Home, port: int) -> Path:
    return home.candidates_dir / f"{port}.json"


def start_candidate(
    home: Home,
    recipe: Recipe,
    config: ServiceConfig,
    *,
    cycle_id: str,
    timeout: float,
    grace: float = 10.0,
) -> ProcessRecord:
    """A candidate on a free port of its own; use ``record.port``."""
    safe = recipe.candidate_id.replace(":", "_")
    log = home.cycle_files(cycle_id).logs / f"{safe}.log"
    return start_backend(
        home, recipe, role="candidate", log=log, cycle_id=cycle_id, timeout=timeout, grace=grace
    )


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
        live = service_record(home)
        if live is not None and (live.pid, live.create_time) == (record.pid, record.create_time):
            path.unlink(missing_ok=True)  # adopted as the live backend just before a crash
            continue
        outcome = stop_server(record, grace=grace)
        path.unlink(missing_ok=True)
        done.append(f"{record.candidate_id} (pid {record.pid}): {outcome}")
    return done
