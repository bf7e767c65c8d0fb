"""The front on the stable port: pure rules (admission, limits, routes) and real processes (a real
front, real mlx_lm.server backends on the demo models, real supervisors killed with SIGKILL).

Nothing is mocked. Verification failure is caused the way it happens in life: the winner's server
dies while it is being verified (killed by its own record the moment the journal says VERIFY).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml

from mcp_infra.contracts import CycleState, Outcome, ServiceImpact
from mcp_infra.core.admission import (
    admit,
    combine,
    expected_downtime_s,
    hold_expired,
    retry_after_s,
    route_to,
)
from mcp_infra.core.preflight import find_candidate
from mcp_infra.demo.homes import exclusive_fraction, make_home, stop_home
from mcp_infra.flows import api as app
from mcp_infra.procs.front import (
    front_record,
    front_status,
    live_request_count,
    read_route,
    set_route,
)
from mcp_infra.procs.runtime import is_running
from mcp_infra.procs.service import backend_url, ensure_serving, start_service
from mcp_infra.state import evidence
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_registry
from mcp_infra.state.context import active_recipe, load_config, service_record
from mcp_infra.state.store import Home
from tests.helpers.faultkit import queue_plan, run_supervisor, supervisor, wait_for

NOW = datetime(2026, 11, 30, tzinfo=UTC)
WINNER = "demo-tiny:draft-k4"


# ---------------------------------------------------------------------------------------------
# pure rules
# ---------------------------------------------------------------------------------------------


def test_admission_concurrent_only_when_both_figures_fit() -> None:
    fits = admit(1.0, 0.5, 24.0, 0.5)
    assert fits.mode == "concurrent" and fits.need_gb == 1.5 and fits.budget_gb == 12.0
    over = admit(22.0, 16.0, 32.0, 0.8)  # the DFlash2 pair beside its live target on a 32 GB Mac
    assert over.mode == "exclusive" and over.need_gb == 38.0 and "exceeds" in over.reason
    unknown = admit(None, 0.5, 512.0, 0.9)
    assert unknown.mode == "exclusive" and "unknown" in unknown.reason
    assert combine([fits, over]) == over and combine([fits]) == fits and combine([]) is None


def test_expected_downtime_is_zero_only_in_concurrent_mode() -> None:
    assert expected_downtime_s("concurrent", candidates=3, per_candidate_s=60, load_s=30) == 0
    assert expected_downtime_s("exclusive", candidates=2, per_candidate_s=60, load_s=30) == 240


def test_route_transitions_number_generations_and_keep_what_a_hold_returns_to() -> None:
    first = route_to(
        None,
        mode="serve",
        now=NOW,
        backend_url="http://127.0.0.1:1",
        max_hold_s=9,
        candidate_id="a",
        scope="c1",
    )
    assert (first.generation, first.mode, first.max_hold_s, first.scope) == (1, "serve", 9, "c1")
    held = route_to(first, mode="hold", now=NOW)
    assert (held.generation, held.backend_url, held.candidate_id, held.max_hold_s, held.scope) == (
        2,
        "http://127.0.0.1:1",
        "a",
        9,
        "c1",
    )
    moved = route_to(
        held, mode="serve", now=NOW, backend_url="http://127.0.0.1:2", candidate_id="b", scope=None
    )
    assert (moved.generation, moved.backend_url, moved.candidate_id, moved.scope) == (
        3,
        "http://127.0.0.1:2",
        "b",
        None,
    )
    with pytest.raises(ValueError):
        route_to(moved, mode="serve", now=NOW)


def test_hold_bound_and_retry_after() -> None:
    assert not hold_expired(1.9, 2.0) and hold_expired(2.0, 2.0)
    assert retry_after_s(120) == 30 and retry_after_s(0.5) == 1 and retry_after_s(5) == 5


# ---------------------------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------------------------


def _policy(
    home: Home, *, service: dict[str, Any] | None = None, min_speedup: float | None = None
) -> None:
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    if service:
        data["service"] = service
    if min_speedup is not None:
        data["thresholds"]["min_speedup_pct"]["default"] = min_speedup
    path.write_text(yaml.safe_dump(data, sort_keys=False))


class Call(threading.Thread):
    """One chat request through the stable port, in the background; records what came back."""

    def __init__(
        self, port: int, *, stream: bool = False, max_tokens: int = 8, timeout: float = 120.0
    ) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.body = {
            "messages": [{"role": "user", "content": "Tell me about harbours."}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": stream,
        }
        self.timeout = timeout
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.done_marker = False
        self.first_chunk = threading.Event()
        self.error: str | None = None
        self.ended: float | None = None
        self.started = time.monotonic()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=self.timeout) as resp:
                self.status = resp.status_code
                self.headers = dict(resp.headers)
                for line in resp.iter_lines():
                    self.first_chunk.set()
                    if line.strip() == "data: [DONE]":
                        self.done_marker = True
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended = time.monotonic()
            self.first_chunk.set()


def _recipe(home: Home, candidate: str) -> Any:
    manifest, variant = find_candidate(load_registry(), candidate)  # type: ignore[misc]
    return resolve_recipe(manifest, variant, home.models, home.hf_cache)


@pytest.mark.slow
def test_switch_under_a_streaming_request_completes_it_and_drains_the_old_backend(
    home: Home,
) -> None:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    old = service_record(home)
    assert old is not None and old.port != config.port, "the live backend has its own port"
    call = Call(config.port, stream=True, max_tokens=400)
    call.start()
    assert call.first_chunk.wait(60) and call.status == 200
    start_service(home, _recipe(home, WINNER), config)  # starts, switches, drains, stops
    new = service_record(home)
    assert new is not None and new.candidate_id == WINNER and new.port != old.port
    assert not is_running(old), "the old backend is stopped after the switch"
    call.join(120)
    assert call.error is None and call.done_marker, "the stream in flight completed"
    status = front_status(home)
    assert status is not None and status.backend_url == backend_url(new)
    assert status.total.rejected_503 == 0 and status.total.upstream_errors == 0
    after = Call(config.port)
    after.run()
    assert after.status == 200


@pytest.mark.slow
def test_hold_releases_requests_and_answers_503_past_the_bound(home: Home) -> None:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    live = service_record(home)
    assert live is not None
    set_route(home, mode="hold", max_hold_s=60, reason="test hold")
    held = Call(config.port)
    held.start()
    time.sleep(1.5)
    base = f"http://127.0.0.1:{config.port}"
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200  # always answers
    assert httpx.get(f"{base}/v1/models", timeout=5).status_code == 200
    assert held.status is None, "the request is held while the route holds"
    set_route(home, mode="serve", backend_url=backend_url(live), candidate_id=live.candidate_id)
    held.join(60)
    assert held.status == 200 and held.error is None
    assert held.ended is not None and held.ended - held.started >= 1.4
    set_route(home, mode="hold", max_hold_s=1.0, reason="test bound")
    late = Call(config.port)
    late.run()
    assert late.status == 503 and late.headers.get("retry-after") == "1"
    assert late.ended is not None and 0.9 <= late.ended - late.started < 10
    time.sleep(0.5)
    status = front_status(home)
    assert status is not None
    assert status.total.held == 2 and status.total.rejected_503 == 1
    assert status.total.longest_hold_s >= 1.4 and status.total.unserved_s >= 2.0
    assert live_request_count(home) == 2


def _kill_winner_when_verifying(home: Home, stop: threading.Event) -> list[int]:
    """The winner's server dies the moment the journal says VERIFY: a real verification
    failure, caused as in life (a crash), not by editing the check."""
    killed: list[int] = []

    def watch() -> None:
        while not stop.is_set() and not killed:
            cycles = list(home.cycles.iterdir()) if home.cycles.is_dir() else []
            if any(
                e.state == CycleState.VERIFY for c in cycles for e in home.read_journal(c.name)[0]
            ):
                from tests.helpers.faultkit import candidate_records

                for record in candidate_records(home):
                    if record.role == "backend":
                        os.killpg(record.pgid, signal.SIGKILL)
                        killed.append(record.pid)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return killed


def _traffic(port: int, stop: threading.Event, calls: list[Call]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            call = Call(port, max_tokens=4)
            call.run()
            calls.append(call)
            stop.wait(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_rollback_then_promotion_under_traffic_fail_no_client_request(home: Home) -> None:
    """A qualified KV-cache candidate (real greedy outputs, fixed timings:
    tests/helpers/synthetic_bundle.py) is approved twice under live traffic: first its server dies
    while it is verified (rollback), then it is promoted. The front switches only after
    verification; no client request fails."""
    from mcp_infra.contracts import CandidateRun
    from mcp_infra.flows.approve import approve
    from mcp_infra.procs.service import start_candidate, stop_candidate
    from tests.helpers.synthetic_bundle import baseline_run, freeze, real_greedy, seal, timing

    kv8 = "demo-tiny:kv8"
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    plan = freeze(home, [kv8])
    live = service_record(home)
    assert live is not None
    base_greedy = real_greedy(backend_url(live), "baseline", plan)
    record = start_candidate(home, _recipe(home, kv8), config, cycle_id="measure", timeout=120)
    try:
        kv_greedy = real_greedy(backend_url(record), kv8, plan)
    finally:
        stop_candidate(home, record)
    summary = seal(
        home,
        plan,
        baseline_run(plan, base_greedy),
        [
            CandidateRun(
                candidate=kv8, samples=timing(kv8, plan, 13.0), greedy=kv_greedy, peak_memory_gb=0.2
            )
        ],
    )
    stop, calls = threading.Event(), []
    client = _traffic(config.port, stop, calls)
    try:
        killed = _kill_winner_when_verifying(home, stop)
        failed = approve(home, summary.cycle_id)
        assert killed, f"the winner was verifying when it died ({failed.reason})"
        assert failed.outcome == Outcome.ROLLED_BACK, failed.reason
        assert active_recipe(home).candidate_id == "demo-tiny:target"
        assert service_record(home) == live, "the live backend was never touched"
        promoted = approve(home, summary.cycle_id)
        assert promoted.outcome == Outcome.PROMOTED, promoted.reason
        assert active_recipe(home).candidate_id == kv8
        time.sleep(1.0)  # traffic on the new backend too
    finally:
        stop.set()
        client.join(130)
    assert len(calls) > 5 and [c.error or c.status for c in calls if c.status != 200] == []
    assert not is_running(live), "the old backend was drained and stopped"
    for cycle_summary in (failed, promoted):
        bundle = evidence.bundle_path(home, cycle_summary.cycle_id)
        impact = ServiceImpact.model_validate_json((bundle / "service_impact.json").read_text())
        assert impact.rejected_503 == 0 and impact.upstream_errors == 0
        assert impact.live_requests and impact.live_requests > 0


@pytest.mark.slow
def test_front_killed_mid_cycle_is_restarted_by_recovery(home: Home) -> None:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    queue_plan(home, {"hypothesis": "h", "candidates": [WINNER]})
    proc = supervisor(home, pause_at="EXPERIMENT:measuring")
    try:
        wait_for((home.state / "paused-at-EXPERIMENT-measuring").exists, 300, "the pause", proc)
        front = front_record(home)
        assert front is not None
        os.killpg(front.pgid, signal.SIGKILL)  # the front dies mid-cycle...
        proc.send_signal(signal.SIGKILL)  # ...and so does the supervisor
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert run_supervisor(home, timeout=300) == 0
    again = front_record(home)
    assert again is not None and again.pid != front.pid and is_running(again)
    route = read_route(home)
    live = service_record(home)
    assert live is not None and route is not None
    assert (route.mode, route.backend_url) == ("serve", backend_url(live))
    call = Call(config.port)
    call.run()
    assert call.status == 200
    view = app.status(home)
    assert view.service is not None and view.service.front_pid == again.pid


@pytest.mark.slow
def test_supervisor_sigkilled_while_requests_are_held_leaves_none_hanging(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    home = make_home(tmp_path / "home", demo_models)
    try:
        # A memory budget no pair of servers fits: exclusive mode, the front holds requests.
        _policy(home, service={"max_hold_s": 4.0, "memory_budget_fraction": exclusive_fraction()})
        config = load_config(home)
        ensure_serving(home, config.baseline, config)
        queue_plan(home, {"hypothesis": "h", "candidates": [WINNER]})
        proc = supervisor(home, pause_at="EXPERIMENT:measuring")
        try:
            wait_for((home.state / "paused-at-EXPERIMENT-measuring").exists, 300, "the pause", proc)
            route = read_route(home)
            assert route is not None and route.mode == "hold" and route.max_hold_s == 4.0
            calls = [Call(config.port) for _ in range(2)]
            for call in calls:
                call.start()
            time.sleep(1.0)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        for call in calls:
            call.join(30)
            assert call.ended is not None, "no request is left hanging"
            assert call.status == 503 and call.headers.get("retry-after")
        assert run_supervisor(home, timeout=300) == 0
        after = Call(config.port)
        after.run()
        assert after.status == 200
        summary = evidence.list_cycles(home)[0]
        bundle = evidence.bundle_path(home, summary.cycle_id)
        impact = ServiceImpact.model_validate_json((bundle / "service_impact.json").read_text())
        assert impact.mode == "exclusive" and impact.expected_downtime_s > 0
    finally:
        stop_home(home)
