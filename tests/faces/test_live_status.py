"""Issue 13: `mcp-infra://status` supports resources/subscribe (2025-11-25) and
subscriptions/listen (2026-07-28); a journal event appended by the supervisor's own code path
(`Home.append_event`) reaches a subscribed client as notifications/resources/updated.
"""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError

from mcp_infra.contracts import CycleState
from mcp_infra.faces.live_status import STATUS_URI, fingerprint
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.procs.front import FrontWatch, ask_front, front_record
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import stdio_client

pytestmark = pytest.mark.anyio


def journal_event(home: Home, state: CycleState) -> None:
    """A state change as the supervisor makes it: the journal line and state/current.json, by
    the cycle's own ``Journal``, while the supervisor lock is held (status shows a cycle only
    then). The lock is held for the rest of the test (released when the handle is collected)."""
    from mcp_infra.flows.journal import Journal

    if not home.lock_is_held():
        _held.append(home.supervisor_lock())
        _held[-1].__enter__()
    Journal(home, "c-20990101-000000-live")(state, f"now {state.value}")


_held: list[Any] = []


@pytest.fixture(autouse=True)
def _release_lock() -> Any:
    yield
    while _held:
        _held.pop().__exit__(None, None, None)


def test_fingerprint_moves_with_the_journal(home: Home) -> None:
    before = fingerprint(home)
    journal_event(home, CycleState.BASELINE)
    middle = fingerprint(home)
    journal_event(home, CycleState.EXPERIMENT)
    assert before != middle != fingerprint(home)


async def _subscribe(client: Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resources/subscribe is deprecated in the 2026 era
        await client.subscribe_resource(STATUS_URI)
        with pytest.raises(MCPError):
            await client.subscribe_resource("mcp-infra://policy")


@pytest.mark.parametrize("transport", ["memory", "stdio"])
async def test_legacy_subscriber_is_told(home: Home, anyio_backend: str, transport: str) -> None:
    got = anyio.Event()
    seen: list[str] = []

    async def on_message(message: Any) -> None:
        uri = getattr(getattr(getattr(message, "root", message), "params", None), "uri", None)
        if uri is not None:
            seen.append(str(uri))
            got.set()

    client = (
        Client(
            build_server(home, "read-only", start_supervisor=False),
            mode="legacy",
            message_handler=on_message,
        )
        if transport == "memory"
        else stdio_client(home, "--mode", "read-only", mode="legacy", message_handler=on_message)
    )
    async with client:
        caps = client.server_capabilities
        assert caps.resources is not None and caps.resources.subscribe is True
        await _subscribe(client)
        await anyio.sleep(0.3)
        journal_event(home, CycleState.BASELINE)
        with anyio.fail_after(10):
            await got.wait()
        assert seen[0] == STATUS_URI
        status = await client.read_resource(STATUS_URI)
        assert '"configured": true' in status.contents[0].text


async def test_listen_subscriber_is_told(home: Home, anyio_backend: str) -> None:
    client = Client(build_server(home, "read-only", start_supervisor=False), mode="auto")
    async with client, client.listen(resource_subscriptions=[STATUS_URI]) as sub:
        await anyio.sleep(0.3)
        journal_event(home, CycleState.EXPERIMENT)
        with anyio.fail_after(10):
            async for event in sub:
                assert event.uri == STATUS_URI
                break


@pytest.mark.slow
async def test_subscriber_follows_a_real_cycle(home: Home, anyio_backend: str) -> None:
    """A read-only stdio session subscribes; a real supervisor runs a real cycle (mlx_lm.server
    on the demo models); the session is told as it moves, and once more when it is sealed."""
    import json

    from mcp_infra.demo.homes import ONE_START, write_test_policy
    from mcp_infra.flows import api as app
    from mcp_infra.procs.service import ensure_serving
    from mcp_infra.state.context import load_config

    write_test_policy(home, **ONE_START)  # what is told is the cycle's moves, not its figures
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    updates: list[float] = []
    notified = anyio.Event()

    async def on_message(message: Any) -> None:
        uri = getattr(getattr(getattr(message, "root", message), "params", None), "uri", None)
        if str(uri) == STATUS_URI:
            updates.append(anyio.current_time())
            notified.set()

    async with stdio_client(
        home, "--mode", "read-only", "--no-supervisor", mode="legacy", message_handler=on_message
    ) as client:
        await _subscribe(client)
        view = app.propose(
            home,
            {"hypothesis": "a 2-token drafter is faster", "candidates": ["demo-tiny:draft-k2"]},
            proposed_by="test",
        )
        assert view.accepted
        states: set[str] = set()
        with anyio.fail_after(900):
            while True:
                await notified.wait()
                notified = anyio.Event()
                status = json.loads((await client.read_resource(STATUS_URI)).contents[0].text)
                if status.get("cycle"):
                    states.add(status["cycle"]["state"])
                if status.get("last_cycle") and not status.get("cycle"):
                    break
    assert len(updates) >= 3 and len(states) >= 2, (len(updates), states)


async def test_an_idle_subscriber_beside_a_real_front_is_told_nothing(
    home: Home, anyio_backend: str
) -> None:
    """The front probes its backend every 2 s and writes its status file only when what it
    says changed; over 12 s of probing (asked of the front itself, so it is known to run), an
    idle subscriber hears nothing. A real state change is then told once. Then the front is
    stopped (alive, not answering): status says the service is not healthy, and why."""
    from mcp_infra.flows import api as app
    from mcp_infra.procs.service import ensure_serving
    from mcp_infra.state.context import load_config

    config = load_config(home)
    ensure_serving(home, config.baseline, config)

    def healthy() -> bool:
        service = app.status(home).service
        return bool(service and service.healthy)

    with anyio.fail_after(60):  # the first probe that finds the backend healthy is news
        while not healthy():
            await anyio.sleep(0.2)
    told: list[str] = []

    async def on_message(message: Any) -> None:
        uri = getattr(getattr(getattr(message, "root", message), "params", None), "uri", None)
        if uri is not None:
            told.append(str(uri))

    server = build_server(home, "read-only", start_supervisor=False)
    async with Client(server, mode="legacy", message_handler=on_message) as client:
        await _subscribe(client)
        for _ in range(6):
            await anyio.sleep(2.0)
            answer = await anyio.to_thread.run_sync(ask_front, home)
            assert answer is not None and answer.backend.healthy, "the front stopped answering"
        assert told == [], f"{len(told)} notification(s) while nothing changed"
        journal_event(home, CycleState.BASELINE)
        with anyio.fail_after(10):
            while not told:
                await anyio.sleep(0.05)
        await anyio.sleep(1.5)
        assert told == [STATUS_URI]

    # A front whose process lives but does not answer (stopped, as a wedged event loop would
    # be) is no healthy service, whatever its last status file says; it is again once it runs.
    # (The proxy is stopped, not the keeper that holds the port: it would replace the proxy.)
    # The MCP server's `status` takes the front's answer from a watcher that asks it every
    # period while someone reads: the same answer as a direct ask, kept between its asks.
    proxy = ask_front(home)
    assert proxy is not None and front_record(home) is not None
    watch = FrontWatch(home, period=0.5, linger=1.0)
    first = watch()
    assert first is not None and first.pid == proxy.pid and watch.watching
    assert watch() is first, "a read within the period asked the front again"
    os.kill(proxy.pid, signal.SIGSTOP)
    try:
        service = app.status(home).service
        assert service is not None and service.healthy is False
        assert "did not answer its own GET /health" in service.health_check
        with anyio.fail_after(10):  # the watcher's next ask times out: no answer is kept
            while watch() is not None:
                await anyio.sleep(0.1)
        server = build_server(home, "read-only", start_supervisor=False)
        async with Client(server) as client:
            seen = (await client.call_tool("status", {})).structured_content
        assert seen is not None and seen["service"]["healthy"] is False
        assert "did not answer its own GET /health" in seen["service"]["health_check"]
    finally:
        os.kill(proxy.pid, signal.SIGCONT)
    with anyio.fail_after(10):
        while not healthy():
            await anyio.sleep(0.2)
    with anyio.fail_after(10):  # the watcher asks again, then ends once nobody reads
        while watch() is None:
            await anyio.sleep(0.1)
        while watch.watching:
            await anyio.sleep(0.2)
