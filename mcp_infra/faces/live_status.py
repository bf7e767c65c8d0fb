"""Live status for IDE agents: `mcp-infra://status` with `resources/subscribe`.

A subscribed client gets `notifications/resources/updated` when what `status` says changes: a
cycle changes state, round or server start, or finishes; the queue changes; the live recipe or
the service's health changes; a person is needed. Nothing else: the front rewrites its status
file on every health probe and ages tick every second, so a daemon thread first compares the
sizes and modification times of the home's files (state records, the queue, the newest cycle's
journal, the evidence folder) every ``interval`` seconds, a handful of ``stat`` calls, and only
when one moved renders the status and compares its digest (``change_digest``, the view without
its clocks) with the last one sent. It never sends a request to the managed service.

Both protocol eras are served: clients of the era with `initialize` subscribe with
`resources/subscribe` and get the notification on their session; clients of the era without it
listen with `subscriptions/listen` and the event goes through the server's subscription bus.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import INVALID_PARAMS, EmptyResult, SubscribeRequestParams, UnsubscribeRequestParams
from pydantic import BaseModel

from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.flows import api as app
from mcp_infra.state.store import Home

STATUS_URI = "mcp-infra://status"
logger = logging.getLogger("mcp_infra.server")

Fingerprint = tuple[tuple[str, int, int], ...]


def _stat(path: Path) -> tuple[str, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (path.name, info.st_mtime_ns, info.st_size)


def fingerprint(home: Home) -> Fingerprint:
    """Sizes and mtimes of what `status` reads that changes during a cycle: the state records
    (current cycle, service record with the live recipe, supervisor, needs-operator), the queue,
    the newest cycle's journal and the evidence folder (a sealed cycle adds an entry)."""
    paths: list[Path] = [home.config, home.queue, home.evidence, home.cycles]
    with contextlib.suppress(OSError):
        paths += sorted(p for p in home.state.iterdir() if p.suffix == ".json")
    try:
        cycles = sorted(p.name for p in home.cycles.iterdir())
    except OSError:
        cycles = []
    if cycles:
        paths.append(home.journal(cycles[-1]))
    found = (_stat(p) for p in paths)
    return tuple(f for f in found if f is not None)


# Fields that move with the clock or with traffic, not with what the status says
VOLATILE = {
    "service": {
        "front_status_age_s",
        "backend_health_age_s",
        "health_check",
        "requests_in_flight",
        "requests_held_now",
    },
    "cycle": {"elapsed_s", "progress", "measuring", "message", "projection"},
    "window_now": True,
}


def change_digest(view: BaseModel) -> str:
    """sha256 of the status view without its clocks: equal digests, nothing to tell."""
    data = view.model_dump(mode="json", exclude=VOLATILE)  # type: ignore[arg-type]
    cycle = getattr(view, "cycle", None)
    measuring = getattr(cycle, "measuring", None)
    if measuring is not None:  # a new round or server start is news; its time left is not
        data["at"] = [measuring.phase, measuring.round, measuring.start_in_round]
    return sha256_bytes(canonical_json(data))


class StatusNotifier:
    """Keeps who subscribed to the status resource and tells them when the home changes."""

    def __init__(
        self,
        server: MCPServer,
        home: Home,
        render: Callable[[], BaseModel],
        interval: float = 0.5,
    ) -> None:
        self.server = server
        self.home = home
        self.render = render
        self.interval = interval
        self.sent = 0  # notifications sent (to every subscriber at once)
        self.sessions: list[Any] = []  # legacy-era sessions subscribed to STATUS_URI
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._token: Any = None
        self._stop = threading.Event()

    def install(self) -> None:
        """Register resources/subscribe and resources/unsubscribe; start watching at the first
        request that can name the event loop (any subscribe, or a subscriptions/listen)."""
        low = self.server._lowlevel_server
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        self.server._lowlevel_server.middleware.append(self._start_on_listen)

    async def _start_on_listen(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        if ctx.method == "subscriptions/listen":
            self._ensure_thread()
        return await call_next(ctx)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        if str(params.uri) != STATUS_URI:
            raise MCPError(code=INVALID_PARAMS, message=f"only {STATUS_URI} can be subscribed to")
        with self._lock:
            if all(s is not ctx.session for s in self.sessions):
                self.sessions.append(ctx.session)
        self._ensure_thread()
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        with self._lock:
            self.sessions = [s for s in self.sessions if s is not ctx.session]
        return EmptyResult()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.Thread(
            target=self._watch, name="mcp-infra-status-watch", daemon=True
        )
        self._thread.start()

    def _digest(self) -> str | None:
        try:
            return change_digest(self.render())
        except Exception:  # a file caught mid-write or unreadable: look again next time
            logger.debug("status not rendered for a change check", exc_info=True)
            return None

    def _watch(self) -> None:
        last = fingerprint(self.home)
        said = self._digest()
        while not self._stop.wait(self.interval):
            now = fingerprint(self.home)
            if now == last:
                continue
            last = now
            digest = self._digest()
            if digest is None or digest == said:
                continue
            said = digest
            try:
                anyio.from_thread.run(self.notify, token=self._token)
            except RuntimeError:  # the event loop is gone: the server stopped
                return

    async def notify(self) -> None:
        """Tell every subscriber that the status resource changed."""
        self.sent += 1
        await self.server._subscriptions.publish(ResourceUpdated(uri=STATUS_URI))
        with self._lock:
            sessions = list(self.sessions)
        for session in sessions:
            try:
                await session.send_resource_updated(STATUS_URI)
            except Exception:  # a closed session: forget it
                with self._lock:
                    self.sessions = [s for s in self.sessions if s is not session]

    def stop(self) -> None:
        self._stop.set()


def register_status(server: MCPServer, home: Home, mode: str) -> StatusNotifier:
    """The status resource (the status tool's view, as JSON) and its notifier, installed."""

    def status_view() -> app.StatusView:
        return app.status(home).model_copy(update={"server_mode": mode})

    @server.resource(
        STATUS_URI,
        name="status",
        title="Live status",
        mime_type="application/json",
        description="The status tool's view. Subscribe to it (resources/subscribe) to be told "
        "when a cycle changes state or finishes, the queue or the live recipe changes.",
    )
    def status_resource() -> str:
        return json.dumps(status_view().model_dump(mode="json"), indent=2, ensure_ascii=False)

    notifier = StatusNotifier(server, home, status_view)
    notifier.install()
    return notifier
