"""The live service behind the front, and candidate servers, with their records.

The stable port belongs to the front (``procs/proxy.py``, steered through ``procs/front.py``);
every backend (the live recipe, each candidate, a promoted winner) runs on a free port of its own.
Records live in ``state/``: ``front.json`` for the front, ``service.json`` for the live backend,
``candidates/<port>.json`` for every other backend (candidates, a winner not yet adopted, an old
backend being drained). A record is written right after a process starts and removed after it
stops, so a supervisor killed at any point leaves enough on disk to find and stop what it
started — and nothing else: a process on a port without our record is refused, never killed.

Every change of what serves (``adopt``, ``hold_live``, ``start_service``, ``ensure_serving``, the
front's restart of a dead backend: ``heal_live_backend``) holds the service lock
(``runtime.service_lock``), and a switch is acknowledged: the old backend is stopped only after
the front confirmed it serves the new route; otherwise ``SwitchFailed`` says what still serves.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import NamedTuple

import httpx2 as httpx

from mcp_infra.contracts import ProcessRecord, Recipe, ServiceConfig, ServicePolicy
from mcp_infra.core.frontrules import HealOutcome
from mcp_infra.errors import ServerUnavailable
from mcp_infra.procs.front import (
    FrontError,
    current_status,
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
    ServiceBusy,
    backend_url,
    free_port,
    is_running,
    loopback_client,
    pin_to_cpus,
    port_open,
    port_owner_is,
    probe_completion,
    runs_recipe,
    service_lock,
    start_server,
    stop_server,
    wait_ready,
    with_ranks,
)
from mcp_infra.state.context import active_recipe, load_config, service_record
from mcp_infra.state.modelfolder import ModelFolderError, verify_recipe_folders
from mcp_infra.state.store import Home, file_safe, read_optional, write_model

__all__ = ["ServiceBusy", "backend_url"]  # re-exported: callers import them from here


HEAL_DRAIN_S = 5.0  # a sick backend's requests in flight are not waited for long


class ServiceError(ServerUnavailable):
    """The live service could not be brought to the wanted recipe."""


class SwitchFailed(ServiceError):
    """The front did not confirm the new route, so nothing was stopped that serves: ``serving``
    is the candidate id the front's route points at again (the old backend, still running), or
    None when no old backend was running to go back to. ``new`` (the backend that was to serve)
    has been stopped and its record removed."""

    def __init__(
        self, message: str, *, serving: str | None, serving_url: str | None, new: ProcessRecord
    ) -> None:
        super().__init__(message)
        self.serving = serving
        self.serving_url = serving_url
        self.new = new


class HealResult(NamedTuple):
    outcome: HealOutcome
    message: str


def service_policy(home: Home) -> ServicePolicy:
    """The policy's service section (hold bound, drain bound, memory budget); defaults if the
    policy cannot be read, so restoring the service never depends on it."""
    try:
        from mcp_infra.state.catalog import load_policy

        return load_policy(load_config(home).policy, extra=home.user_policy).service
    except Exception:
        return ServicePolicy()


def front_confirms(home: Home, url: str) -> bool:
    """The running front serves the route file's current generation, to ``url``."""
    route = read_route(home)
    status = current_status(home)
    return (
        route is not None
        and status is not None
        and status.generation == route.generation
        and status.mode == "serve"
        and status.backend_url == url
    )


def is_serving(home: Home, recipe: Recipe, config: ServiceConfig) -> bool:
    """Our recorded live backend runs exactly this recipe's command and answers, and our front
    on the stable port routes to it (by the route file and by its own word)."""
    record = service_record(home)
    if record is None or not is_running(record):
        return False
    if not runs_recipe(record, recipe):
        return False
    route = read_route(home)
    if (
        not front_running(home)
        or route is None
        or route.mode != "serve"
        or (route.backend_url != backend_url(record))
        or not front_confirms(home, backend_url(record))
    ):
        return False
    return probe_completion(backend_url(record))


def stop_service(home: Home, grace: float = 10.0) -> str:
    """Stop the front (clients are refused, not held; a restart it was running is stopped with
    it) and the live backend, with any backend a restart left unadopted."""
    front = stop_front(home, grace=grace)
    try:
        with service_lock(home, wait_s=max(3 * grace, 5.0)):
            return f"front: {front}; " + _stop_backends(home, grace)
    except ServiceBusy:  # a restart that does not end: stop what is recorded anyway
        return f"front: {front}; " + _stop_backends(home, grace)


def _stop_backends(home: Home, grace: float) -> str:
    folder = home.candidates_dir
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_optional(path, ProcessRecord)
        if record is not None and record.role == "backend" and record.cycle_id is None:
            stop_server(record, grace=grace)  # started for the service, never adopted
            path.unlink(missing_ok=True)
    record = service_record(home)
    if record is None:
        return "no backend recorded"
    outcome = stop_server(record, grace=grace)
    (home.service_file).unlink(missing_ok=True)
    return f"backend: {outcome}"


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
    try:  # a local model folder must still hold the files recorded for it
        verify_recipe_folders(home, recipe)
    except ModelFolderError as exc:
        raise ServerStartError(f"{recipe.candidate_id} not started: {exc}") from exc
    last: Exception | None = None
    config = read_optional(home.config, ServiceConfig)  # a home being set up may have none yet
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
                hosts=load_config(home).distributed.hosts if recipe.knobs.ranks else None,
            )
        except PortBusy as exc:
            last = exc
            continue
        if record.launch is None and config is not None:  # a split server's ranks run where
            cpus = pin_to_cpus(record.pid, config.server_cpus)  # mlx.launch puts them
            record = record.model_copy(update={"cpus": cpus})
        try:
            write_model(candidate_record_path(home, port), record)
        except OSError:  # no room for the record (a full disk): a server nobody can find is
            stop_server(record, grace=grace)  # never left running
            raise
        try:
            waited = wait_ready(record, timeout=timeout)
        except ServerStartError as exc:
            stop_candidate(home, record, grace=grace)
            if "address already in use" in str(exc).lower():
                last = exc
                continue
            raise
        record = with_ranks(record).model_copy(update={"ready_s": round(waited, 2)})
        write_model(candidate_record_path(home, port), record)
        return record
    raise ServerStartError(f"no free port could be bound after {tries} tries: {last}")


def adopt(
    home: Home,
    new: ProcessRecord,
    config: ServiceConfig,
    *,
    reason: str = "",
    grace: float = 10.0,
    start_front: bool = True,
    drain_s: float | None = None,
) -> str:
    """Make ``new`` the live backend: switch the front to it, and once the front confirmed the
    new route (adopted, ``new`` seen healthy), let requests in flight on the old one finish
    (bounded drain) and stop it. The old record is kept among the candidates until it is
    stopped, so recovery finds it if we die in between.

    If the front does not confirm, the route goes back to the old backend (still running),
    ``new`` is stopped and ``SwitchFailed`` says what serves. ``start_front`` False: a front
    that is not running is not started (the front's own restart process must not bring back a
    front that was stopped on purpose). ``drain_s``: the drain bound, if not the policy's."""
    policy = service_policy(home)
    with service_lock(home):
        old = service_record(home)
        if old is not None and (old.pid, old.create_time) == (new.pid, new.create_time):
            old = None
        if old is not None:
            write_model(candidate_record_path(home, old.port), old)
        write_model(home.service_file, new.model_copy(update={"role": "backend"}))
        candidate_record_path(home, new.port).unlink(missing_ok=True)
        try:
            if start_front:
                ensure_front(home, config)
            elif not front_running(home):
                raise FrontError("the front is not running")
            _route_to(home, new, reason or f"serve {new.candidate_id}")
        except (FrontError, PortBusy) as exc:
            raise _switch_back(home, old, new, str(exc), grace) from exc
        note = "switched"
        if old is not None:
            bound = policy.drain_s if drain_s is None else drain_s
            left = drain(home, backend_url(old), bound) if is_running(old) else 0
            stop_server(old, grace=grace)
            candidate_record_path(home, old.port).unlink(missing_ok=True)
            note += (
                f"; old backend stopped ({left} request(s) still in flight after the drain)"
                if left
                else "; old backend drained and stopped"
            )
        return note


def _switch_back(
    home: Home,
    old: ProcessRecord | None,
    new: ProcessRecord,
    why: str,
    grace: float,
) -> SwitchFailed:
    """The switch to ``new`` was not confirmed: records and route back to ``old`` (if it still
    runs), ``new`` stopped."""
    back = old is not None and is_running(old)
    if old is not None:
        write_model(home.service_file, old)
        candidate_record_path(home, old.port).unlink(missing_ok=True)
    else:
        home.service_file.unlink(missing_ok=True)
    note = ""
    if back and old is not None:
        try:
            _route_to(home, old, f"switch to {new.candidate_id} not confirmed; back", wait_s=5.0)
        except FrontError as exc:
            note = f"; the front has not confirmed the way back either ({exc})"
    stop_server(new, grace=grace)
    candidate_record_path(home, new.port).unlink(missing_ok=True)
    serving = old.candidate_id if back and old is not None else None
    return SwitchFailed(
        f"the switch to {new.candidate_id} was not confirmed by the front ({why}); "
        + (
            f"{serving} keeps serving{note}"
            if serving
            else "no old backend was running to go back to"
        )
        + f"; {new.candidate_id} was stopped",
        serving=serving,
        serving_url=backend_url(old) if back and old is not None else None,
        new=new,
    )


def hold_live(home: Home, config: ServiceConfig, *, reason: str, grace: float = 10.0) -> str:
    """Exclusive mode: the front holds new requests, in-flight ones finish, the live backend
    stops (its memory is freed for what comes next). If the front does not confirm the hold,
    the live backend is not stopped: the route goes back to it and ``ServiceError`` is raised."""
    policy = service_policy(home)
    with service_lock(home):
        ensure_front(home, config)
        record = service_record(home)
        try:
            set_route(home, mode="hold", max_hold_s=policy.max_hold_s, reason=reason)
        except FrontError as exc:
            if record is not None and is_running(record):
                with contextlib.suppress(FrontError):
                    _route_to(home, record, "hold not confirmed; back to it", wait_s=5.0)
            raise ServiceError(
                f"the front did not confirm the hold ({exc}); the live backend was not stopped"
            ) from exc
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
    with service_lock(home):
        ensure_front(home, config)
        if exclusive:
            hold_live(home, config, reason=f"exclusive swap to {recipe.candidate_id}", grace=grace)
        log = home.logs / f"backend-{file_safe(recipe.candidate_id)}.log"
        new = start_backend(
            home, recipe, role="backend", log=log, cycle_id=cycle_id, timeout=timeout, grace=grace
        )
        adopt(home, new, config, grace=grace)
        return new


def ensure_serving(home: Home, recipe: Recipe, config: ServiceConfig, **kwargs: object) -> str:
    """Make the stable endpoint serve ``recipe``: the front runs, the live backend runs this
    recipe, and the front confirms a route to it; return what was done. A front that runs but
    does not confirm the route is restarted. Replacing a different running backend is done
    exclusively (recovery does not know whether two fit in memory)."""
    with service_lock(home):
        front = ensure_front(home, config)
        restarted = "; front restarted" if front == "started" else ""
        record = service_record(home)
        if (
            record is not None
            and is_running(record)
            and runs_recipe(record, recipe)
            and probe_completion(backend_url(record))
        ):
            url = backend_url(record)
            route = read_route(home)
            if (
                route is not None
                and route.mode == "serve"
                and route.backend_url == url
                and front_confirms(home, url)
            ):
                return "already serving" + restarted
            try:
                _route_to(home, record, "route restored to the live backend")
            except FrontError:  # the front runs but does not take routes: replace it
                stop_front(home, grace=3.0)
                ensure_front(home, config)
                _route_to(home, record, "route restored to the live backend (front restarted)")
                return "route restored; front restarted (it did not confirm the route)"
            return "route restored" + restarted
        replacing = record is not None and is_running(record)
        kwargs.setdefault("exclusive", replacing)
        start_service(home, recipe, config, **kwargs)  # type: ignore[arg-type]
        return "started"


def _route_to(home: Home, record: ProcessRecord, reason: str, wait_s: float = 10.0) -> None:
    """Route the front to ``record`` and wait for its confirmation (``RouteNotAdopted``)."""
    set_route(
        home,
        mode="serve",
        backend_url=backend_url(record),
        candidate_id=record.candidate_id,
        max_hold_s=service_policy(home).max_hold_s,
        reason=reason,
        wait_s=wait_s,
    )


def answers_health(url: str, timeout: float = 5.0) -> bool:
    """``GET /health`` answers 200 (``/v1/models`` where a server has no ``/health``)."""
    try:
        response = loopback_client().get(f"{url}/health", timeout=timeout)
        if response.status_code == 404:
            response = loopback_client().get(f"{url}/v1/models", timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def heal_live_backend(home: Home, timeout: float = 120.0) -> HealResult:
    """The front's restart of a live backend that died (run by ``python -m
    mcp_infra.procs.heal``): only when the route serves the recorded live backend, its process
    is gone or fails its health check, and it ran the active recipe; then that recipe starts on
    a new port and the front is switched to it (acknowledged). Busy when a switch holds the
    service lock."""
    try:
        with service_lock(home, wait_s=0):
            return _heal(home, timeout)
    except ServiceBusy as exc:
        return HealResult("busy", str(exc))


def _heal(home: Home, timeout: float) -> HealResult:
    config = load_config(home)
    record = service_record(home)
    route = read_route(home)
    if record is None:
        return HealResult("nothing", "no live backend is recorded (the service was stopped)")
    if route is None or route.mode != "serve" or route.backend_url != backend_url(record):
        return HealResult("nothing", "the front's route no longer names the dead backend")
    if is_running(record) and answers_health(backend_url(record)):
        return HealResult("nothing", f"the live backend (pid {record.pid}) runs and answers")
    if not front_running(home):
        return HealResult("nothing", "the front is not running")
    recipe = active_recipe(home)
    if not runs_recipe(record, recipe):
        return HealResult(
            "failed",
            f"the dead backend ran {record.candidate_id}, not the active recipe "
            f"{recipe.candidate_id}: left to the supervisor's recovery",
        )
    started = time.monotonic()
    try:
        new = start_backend(
            home,
            recipe,
            role="backend",
            log=home.logs / f"backend-{file_safe(recipe.candidate_id)}.log",
            cycle_id=None,
            timeout=timeout,
        )
    except ServerUnavailable as exc:
        return HealResult("failed", f"{recipe.candidate_id} did not start: {str(exc)[:300]}")
    try:
        adopt(
            home,
            new,
            config,
            reason=f"restarted {recipe.candidate_id}: the live backend (pid {record.pid}) "
            + ("failed its health check" if is_running(record) else "died"),
            start_front=False,
            drain_s=HEAL_DRAIN_S,
        )
    except ServerUnavailable as exc:
        return HealResult("failed", str(exc)[:400])
    return HealResult(
        "restarted",
        f"restarted {recipe.candidate_id} (pid {new.pid}, port {new.port}) in "
        f"{time.monotonic() - started:.1f} s",
    )


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
