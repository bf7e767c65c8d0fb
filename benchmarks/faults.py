"""Inject real faults into real cycles and into the front, and print what a person finds
afterwards.

What: each row is a fresh home with the demo models and a live `mlx_lm.server` behind the
front. Cycle rows queue a plan and cause one fault (a SIGKILLed supervisor at a journal state, a
candidate or the front killed, a stranger on the stable port, a server that ignores SIGTERM),
then a fresh supervisor (or `recover`) runs. Disk rows put the home on a small disk of its own
(a tmpfs as root; else a file-size limit on the supervisor) and fill it during the experiment
or at the seal: the supervisor must restore the service and exit 5, `recover` must seal. The
failed-adoption row kills the verified winner just before the front is switched to it. Front
rows send real clients to the stable port: 200 and 1,000 streamed clients at once, a
SIGKILLed live backend mid-stream, a body that kills mlx_lm.server's generation thread, a
200 MB body, paths outside the API, an Origin, the front's proxy SIGSTOPped six times, a hung
(SIGSTOPped) live backend. The full-disk row holds the home's disk full for 10 minutes while
a client asks every 5 s and a plan waits in the queue. Load rows: ten MCP sessions on
streamable HTTP propose plans at one moment while a cycle measures, then the queue runs out;
a cycle promotes while 8 clients send mixed traffic. Columns: the sealed outcome, whether
the live service answers afterwards, project servers left over besides it, records lost
(journal lines unreadable + cycles never sealed), whether the row's own target held, and what
was seen.

Target: after every fault the service is restored, with no orphan and no record lost, and each
row's own target holds (exit status 1 otherwise): 0 resets and 0 502s for 200 clients; each
of 1,000 served or answered 503 with Retry-After, none reset or unanswered within 120 s; a
stream cut by a dead backend ends with an error event and the service is back within 30 s
without a person, the status saying so; a poison body reaches a backend at most twice; a
200 MB body refused before it is read, the front below 150 MB; `/v1/../x` and other paths
refused, no Access-Control-Allow-Origin; exit 5 and a sealed, verified bundle after a full
disk; a failed switch rolled back with what serves named; a stopped proxy replaced 6 of 6
times and a hung backend restarted, without a person; with the disk held full every request
answered, `status` saying logging is degraded, the plan refused, no cycle started (the
supervisor exits 7) and the dropped log lines counted; of ten agents nine queued in distinct
positions and one refused with its reason, each plan then run exactly once, every bundle
verifying; a promotion under load with 0 failed requests.
Takes: twenty-six faults, each with up to one cycle under the lean `test` policy (ten
agents: ten short cycles; a promotion: up to 3), about an hour on 2 cores, 10 minutes of it
the full disk. --smoke: the first cycle fault (SIGKILL at
BASELINE, then recovery) and the first front fault (paths and CORS) under the smoke protocol
(about 30 s).

    .venv/bin/python benchmarks/faults.py [WORD] [--json] [--smoke]   # WORD: faults named so
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import anyio
import httpx2 as httpx
import psutil
import yaml

from mcp_infra.contracts import Recipe
from mcp_infra.demo import agents, frontkit
from mcp_infra.demo.faults import (
    SmallDisk,
    candidate_records,
    disk_full_at,
    inspect,
    pause_and_kill,
    queue_plan,
    release,
    run_supervisor,
    small_disk,
    start_live,
    stranger,
    supervisor,
    wait_for,
    wait_paused,
)
from mcp_infra.demo.homes import (
    ONE_START,
    PROMOTE_ANY_GAIN,
    exclusive_fraction,
    make_home,
    stop_home,
)
from mcp_infra.demo.models import build_demo_models
from mcp_infra.demo.traffic import Traffic
from mcp_infra.flows import api as app
from mcp_infra.procs.front import current_status, front_record, raise_fd_limit, read_route
from mcp_infra.procs.runtime import free_port, is_running, start_server, stop_server
from mcp_infra.state import evidence
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home

PROTOCOL = {"repeats": 3, "warmup": 1, "max_tokens": 40}


ATTEMPTS = 3  # cycles that may end before a pause past SELECT (no winner that time)


def kill_at(state: str) -> Callable[[Home], str]:
    def scenario(home: Home) -> str:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                pause_and_kill(home, state, timeout=600)
                break
            except AssertionError as exc:
                if "exited (0)" not in str(exc) or attempt == ATTEMPTS:
                    raise
                queue_plan(home)  # that cycle sealed without reaching the state: once more
        run_supervisor(home)
        return "new supervisor recovered" + (f" (attempt {attempt})" if attempt > 1 else "")

    return scenario


def candidate_dies(home: Home) -> str:
    proc = supervisor(home)

    def measuring() -> bool:
        events = [e for c in home.cycles.iterdir() for e in home.read_journal(c.name)[0]]
        records = candidate_records(home)
        if records and any(e.fields.get("step") == "measuring" for e in events):
            os.killpg(records[0].pgid, signal.SIGKILL)
            return True
        return False

    wait_for(measuring, 240, "a candidate being measured", proc)
    proc.wait(timeout=300)
    return "cycle went on"


def stranger_takes_port(home: Home) -> str:
    config = load_config(home)
    proc = supervisor(home)
    wait_for(lambda: bool(candidate_records(home)), 240, "an experiment", proc)
    record = service_record(home)
    assert record is not None
    stop_server(record, grace=5)
    front = front_record(home)
    if front is not None:  # the front dies too, so a stranger can take the stable port
        os.killpg(front.pgid, signal.SIGKILL)
        wait_for(lambda: not is_running(front), 10, "the front to die")
    intruder = stranger(config.port)
    try:
        proc.wait(timeout=300)
        alive = intruder.poll() is None
    finally:
        intruder.kill()
        intruder.wait()
    subprocess.run(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "recover"],
        capture_output=True,
        timeout=300,
        check=False,
    )
    return f"stranger {'left alone' if alive else 'KILLED'}; then `recover`"


def front_killed(home: Home) -> str:
    """The front (the stable port) is SIGKILLed mid-cycle, and the supervisor with it."""
    proc = supervisor(home, pause_at="EXPERIMENT:measuring")
    wait_for((home.state / "paused-at-EXPERIMENT-measuring").exists, 300, "the pause", proc)
    front = front_record(home)
    assert front is not None
    os.killpg(front.pgid, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    run_supervisor(home)
    again = front_record(home)
    route = read_route(home)
    served = _one_request(load_config(home).port)
    return (
        f"front pid {front.pid} -> {again.pid if again else '-'}; route "
        f"{route.mode if route else '-'}; request via front: {served}"
    )


def held_then_supervisor_killed(home: Home) -> str:
    """Exclusive mode (a memory budget no two servers fit): the front holds requests while the
    candidate runs; the supervisor is SIGKILLed with requests held."""
    port = load_config(home).port
    proc = supervisor(home, pause_at="EXPERIMENT:measuring")
    wait_for((home.state / "paused-at-EXPERIMENT-measuring").exists, 300, "the pause", proc)
    answers: list[str] = []
    threads = [
        threading.Thread(target=lambda: answers.append(_one_request(port))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    started = time.monotonic()
    for thread in threads:
        thread.join(60)
    hanging = sum(t.is_alive() for t in threads)
    run_supervisor(home)
    return (
        f"held requests: {', '.join(sorted(answers))} within "
        f"{time.monotonic() - started + 1:.0f} s; {hanging} hanging; after recovery: "
        f"{_one_request(port)}"
    )


def _one_request(port: int) -> str:
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=120,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        return f"HTTP {response.status_code}"
    except httpx.HTTPError as exc:
        return type(exc).__name__


def disk_full(state: str) -> Callable[[Home, SmallDisk], str]:
    def scenario(home: Home, disk: SmallDisk) -> str:
        run = disk_full_at(home, disk, state)
        serving = "serving" if run.serving_when_full else "NOT serving"
        cut = " with " + run.message.split(": ", 2)[-1][:40] if run.exit_code != 5 else ""
        return (
            f"{disk.kind}: exit {run.exit_code}{cut}, {serving} while full, "
            f"{run.candidates_left} candidate(s) left; `recover` exit {run.recover_code}"
        )

    return scenario


def winner_dies_before_the_switch(home: Home) -> str:
    """The verified winner is SIGKILLed between its checks and the switch: the front cannot
    adopt it, the old route keeps serving and the sealed reason says so."""
    proc = supervisor(home, pause_at="VERIFY:passed")
    try:
        wait_paused(home, "VERIFY:passed", proc, 600)
        winners = [r for r in candidate_records(home) if r.role == "backend" and r.cycle_id]
        for record in winners:
            os.killpg(record.pgid, signal.SIGKILL)
        release(home, "VERIFY:passed")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = evidence.list_cycles(home)[0]
    said = summary.reason.rsplit("; ", 1)[-1] if "serves" in summary.reason else "(not said)"
    return f"{len(winners)} winner killed; the reason ends: {said[:45]}"


def hold_not_confirmed(home: Home) -> str:
    """Exclusive mode: the front's proxy is SIGSTOPped just before it is asked to hold
    requests. The keeper replaces it (within the 10 s a switch waits for its confirmation, or
    the cycle restores the live recipe): the cycle must end sealed, never needs-operator, and
    the service come back."""
    proc = supervisor(home, pause_at="MAINTENANCE")
    proxy = None
    try:
        wait_paused(home, "MAINTENANCE", proc, 300)
        proxy = current_status(home)
        assert proxy is not None
        os.kill(proxy.pid, signal.SIGSTOP)
        release(home, "MAINTENANCE")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proxy is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proxy.pid, signal.SIGCONT)
    summary = evidence.list_cycles(home)[0]
    again = current_status(home)
    replaced = again is not None and proxy is not None and again.pid != proxy.pid
    said = summary.reason[:60]
    if summary.outcome.value == "needs_operator":
        said += " … " + summary.reason.rsplit("; ", 1)[-1][:200]
    return f"{'proxy replaced' if replaced else 'same proxy'}; {said}"


def _proxy_replaced(home: Home, old_pid: int, timeout: float = 30) -> Any:
    """The front's status once a proxy other than ``old_pid`` serves (None: not in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = current_status(home)
        if status is not None and status.pid != old_pid:
            return status
        time.sleep(0.2)
    return None


STOPS = 6  # SIGSTOP runs of the front's proxy


def front_stopped(home: Home) -> tuple[str, bool]:
    """The front's proxy SIGSTOPped (a stuck event loop, from outside), ``STOPS`` times: each
    time the keeper must replace it without a person; a client that connects meanwhile waits."""
    port, base = _served(home)
    keeper = front_record(home)
    took: list[float | None] = []
    for _ in range(STOPS):
        before = current_status(home)
        assert before is not None
        os.kill(before.pid, signal.SIGSTOP)
        took.append(frontkit.served_again(base, 60))
        _proxy_replaced(home, before.pid)
    status = current_status(home)
    replaced = status.watchdog.replaced if status else 0
    back = sorted(t for t in took if t is not None)
    same = front_record(home) == keeper
    ok = len(back) == STOPS and replaced == STOPS and same
    return (
        f"{len(back)} of {STOPS} served again, in {back[0]:.1f}-{back[-1]:.1f} s "
        f"(median {back[len(back) // 2]:.1f}); {replaced} replacements; keeper "
        f"{'unchanged' if same else 'CHANGED'}"
        if back
        else f"0 of {STOPS} served again",
        ok,
    )


def backend_hung(home: Home) -> tuple[str, bool]:
    """The live backend SIGSTOPped (hung: it runs but answers nothing): the front must restart
    it without a person."""
    port, base = _served(home)
    record = service_record(home)
    assert record is not None
    os.killpg(record.pgid, signal.SIGSTOP)
    try:
        back = frontkit.served_again(base, 180)
    finally:
        if is_running(record):
            os.killpg(record.pgid, signal.SIGCONT)
    status = current_status(home)
    restarts = status.healing.restarts if status else 0
    new = service_record(home)
    ok = back is not None and restarts >= 1 and new is not None and new.pid != record.pid
    return (
        f"served again {back:.1f} s after the stop; {restarts} restart(s)"
        if back is not None
        else "NOT served again within 180 s",
        ok,
    )


FULL_FOR_S = 600.0  # the home's disk held full this long
ASK_EVERY_S = 5.0


def _top_up(path: Path) -> None:
    """The last page of ``path`` full too (a full tmpfs leaves a file's last page room)."""
    with contextlib.suppress(OSError), path.open("ab", buffering=0) as handle:
        while handle.write(b"#" * 512):
            pass


def disk_held_full(home: Home, disk: SmallDisk) -> tuple[str, bool]:
    """The home's disk full for ``FULL_FOR_S`` with a plan queued: the live model must answer
    every request, `status` say logging is degraded, no plan be queued and no cycle start, and
    the dropped log lines be counted once there is room again."""
    port, base = _served(home)
    queue_plan(home)
    record = service_record(home)
    assert record is not None
    disk.fill(os.getpid())
    _top_up(Path(record.log_path))
    started = time.monotonic()
    results = []
    while time.monotonic() - started < FULL_FOR_S:
        results.append(frontkit.one_stream(base, max_tokens=8, timeout=60))
        time.sleep(ASK_EVERY_S)
    answered = sum(r.done for r in results)
    view = app.status(home).service
    said = view.logging if view else None
    refused = not app.propose(home, queue_plan_body(), start_supervisor=False).accepted
    cycles = len(list(home.cycles.iterdir())) if home.cycles.is_dir() else 0
    code = run_supervisor(home, timeout=120)
    cycles_after = len(list(home.cycles.iterdir())) if home.cycles.is_dir() else 0
    disk.free()
    frontkit.one_stream(base, max_tokens=2)
    time.sleep(1.0)
    counted = "[mcp-infra log: " in Path(record.log_path).read_text(errors="replace")
    ok = answered == len(results) and bool(said) and refused and code == 7
    ok = ok and cycles_after == cycles and counted
    drops = "counted" if counted else "NOT counted"
    return (
        f"{answered}/{len(results)} answered in {FULL_FOR_S / 60:.0f} min; status: "
        f"{(said or 'logging NOT said degraded')[:42]}; plan "
        f"{'refused' if refused else 'QUEUED'}; supervisor exit {code}, "
        f"{cycles_after - cycles} cycle(s) started; log drops {drops}",
        ok,
    )


AGENTS = 10
HELD_AT = "EXPERIMENT:measuring"


def ten_agents(home: Home) -> tuple[str, bool]:
    """Ten MCP sessions on streamable HTTP propose at one moment while the queued plan's cycle
    measures; then the queue runs out. Each plan is run once or refused with the reason."""
    proc = supervisor(home, pause_at=HELD_AT)
    try:
        wait_paused(home, HELD_AT, proc, 300)
        with agents.http_face(home) as face:
            answers = anyio.run(agents.propose_at_once, face, agents.agent_plans(AGENTS))
        release(home, HELD_AT)
        code = proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = agents.tally(home, answers)
    ok = len(seen.accepted) == AGENTS - 1 and len(seen.refused) == 1 and code == 0
    ok = ok and seen.positions == list(range(1, AGENTS)) and not seen.lost and not seen.twice
    ok = ok and seen.verified == seen.sealed == len(seen.accepted) + 1 and not seen.queued
    return (
        f"{len(seen.accepted)} queued (positions {seen.positions[0]}-{seen.positions[-1]}, "
        f"{len(set(seen.positions))} distinct), {len(seen.refused)} refused "
        f"({seen.refused[0][:40] if seen.refused else '-'}); {seen.sealed} cycles sealed, "
        f"{seen.verified} verify; {len(seen.lost)} lost, {len(seen.twice)} run twice",
        ok,
    )


LOAD_CLIENTS = 8


def promotion_under_load(home: Home) -> tuple[str, bool]:
    """``LOAD_CLIENTS`` clients send mixed traffic (streamed and not, some leaving mid-stream)
    while the queued plan's cycle runs and promotes; up to ``ATTEMPTS`` cycles until one
    promotes (on a loaded machine the drafter may not win). No request may fail."""
    port, base = _served(home)
    load = Traffic(base, LOAD_CLIENTS)
    load.start()
    outcomes: list[str] = []
    try:
        for attempt in range(ATTEMPTS):
            if attempt:
                queue_plan(home)
            run_supervisor(home, timeout=1800)
            outcomes.append(evidence.list_cycles(home)[0].outcome.value)
            if outcomes[-1] == "promoted":
                break
        time.sleep(2.0)
    finally:
        load.stop()
    failed = sorted({f.why[:40] for f in load.failures})
    ok = outcomes[-1] == "promoted" and not load.failures
    return (
        f"{', '.join(outcomes)}; {load.total()} requests ({load.left} left on purpose), "
        f"{len(load.failures)} failed{': ' + '; '.join(failed[:2]) if failed else ''}",
        ok,
    )


def queue_plan_body() -> dict[str, Any]:
    return {"hypothesis": "a drafter speeds up decoding", "candidates": ["demo-tiny:draft-k4"]}


def _policy(home: Home, service: dict[str, Any] | None, sections: dict[str, Any]) -> None:
    """The home's policy with this ``service:`` section (if given) and these other sections,
    before any plan is frozen under it."""
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text()) | sections
    if service is not None:
        data["service"] = service
    path.write_text(yaml.safe_dump(data, sort_keys=False))


EXCLUSIVE = {"max_hold_s": 5.0, "memory_budget_fraction": exclusive_fraction()}
"""A memory budget no two servers fit: candidates run alone, the front holds requests."""


def _served(home: Home) -> tuple[int, str]:
    config = load_config(home)
    return config.port, f"http://127.0.0.1:{config.port}"


def two_hundred_clients(home: Home) -> tuple[str, bool]:
    port, base = _served(home)
    seen = frontkit.summary(frontkit.streamed_clients(base, 200, max_tokens=4))
    ok = seen["complete"] == 200 and seen["resets"] == 0 and seen["http_502"] == 0
    return (
        f"{seen['complete']}/200 complete, {seen['resets']} resets, {seen['http_502']} 502s, "
        f"{seen['http_503']} 503s; p50 {seen['p50_s']} s, p99 {seen['p99_s']} s",
        ok,
    )


CLIENTS = 1000


def thousand_clients(home: Home) -> tuple[str, bool]:
    """``CLIENTS`` streamed clients at once: each served or answered 503 with Retry-After
    (past ``max_queue``), none reset and none unanswered within 120 s; the proxy's open-files
    limit and peak memory."""
    port, base = _served(home)
    raise_fd_limit(4 * CLIENTS)  # this process holds a connection per client
    proxy = current_status(home)
    assert proxy is not None
    watched = psutil.Process(proxy.pid)
    peak, stop = [watched.memory_info().rss], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            with contextlib.suppress(psutil.Error):
                peak.append(watched.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        results = frontkit.streamed_clients(base, CLIENTS, max_tokens=4, timeout=120)
    finally:
        stop.set()
        sampler.join(5)
    seen = frontkit.summary(results)
    told = sum(r.status == 503 and bool(r.retry_after) for r in results)
    limit = watched.rlimit(psutil.RLIMIT_NOFILE)[0]
    ok = seen["complete"] + told == CLIENTS and seen["resets"] == 0
    return (
        f"{seen['complete']} served, {told} 503 with Retry-After, {seen['resets']} reset or "
        f"unanswered; p50 {seen['p50_s']} s, p99 {seen['p99_s']} s; the proxy's open-files "
        f"limit {limit}, peak RSS {max(peak) / 2**20:.0f} MB",
        ok,
    )


def backend_killed_mid_stream(home: Home) -> tuple[str, bool]:
    port, base = _served(home)
    record = service_record(home)
    assert record is not None
    stream = frontkit.BackgroundStream(base)
    stream.start()
    if not stream.started.wait(60):
        return "the stream never started", False
    os.killpg(record.pgid, signal.SIGKILL)
    killed = time.monotonic()
    stream.join(30)
    ended = "an error event" if stream.result.error_event and not stream.result.done else "?"
    if stream.result.error:
        ended = "a transport error"
    back = frontkit.served_again(base, 30 - (time.monotonic() - killed))
    took = time.monotonic() - killed
    deadline = time.monotonic() + 15
    healing = None
    while time.monotonic() < deadline:  # the restart process tells the front a moment later
        view = app.status(home)
        healing = view.service.healing if view.service else None
        if healing and "restarted" in healing and view.service and view.service.healthy:
            break
        time.sleep(0.2)
    ok = ended == "an error event" and back is not None and bool(healing and "restarted" in healing)
    return (
        f"stream ended with {ended}; served again {took:.1f} s after the kill; "
        f"status: {(healing or '-')[:40]}",
        ok,
    )


def poison_body(home: Home) -> tuple[str, bool]:
    port, base = _served(home)
    record = service_record(home)
    assert record is not None

    before = frontkit.posts_logged(record.log_path)
    poison = frontkit.post(b"/v1/chat/completions", frontkit.POISON)
    answer = frontkit.raw(port, poison, timeout=30)
    time.sleep(1.0)
    reached = frontkit.posts_logged(record.log_path) - before
    back = frontkit.served_again(base, 40)
    status = current_status(home)
    restarts = status.healing.restarts if status else 0
    ok = reached <= 2 and back is not None
    return (
        f"HTTP {frontkit.status_of(answer)}; reached the backend {reached}x; "
        f"{restarts} restart(s); served again: {'yes' if back is not None else 'NO'}",
        ok,
    )


def huge_body(home: Home) -> tuple[str, bool]:
    port, base = _served(home)
    front = current_status(home)  # the proxy, which reads the bodies
    assert front is not None
    declared, sent = frontkit.huge_body(port)
    rss_mb = psutil.Process(front.pid).memory_info().rss / 2**20
    ok = declared == 413 and sent < 64 * 2**20 and rss_mb < 150
    return (
        f"declared: HTTP {declared} before the body; chunked: cut after {sent / 2**20:.0f} MB; "
        f"front RSS {rss_mb:.0f} MB",
        ok,
    )


def paths_and_origins(home: Home) -> tuple[str, bool]:
    port, base = _served(home)
    record = service_record(home)
    assert record is not None
    paths = [path for path, _ in frontkit.REFUSED_PATHS]
    codes = [frontkit.status_of(frontkit.raw(port, frontkit.get(p))) for p in paths]
    log = Path(record.log_path).read_text(errors="replace")
    leaked = [word for word in frontkit.LEAK_WORDS if word in log]
    origin = b"Origin: https://evil.example\r\n"
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    answer = frontkit.raw(port, frontkit.post(b"/v1/chat/completions", body, origin))
    cors = b"access-control" in answer.lower()
    expected = [status for _, status in frontkit.REFUSED_PATHS]
    ok = codes == expected and not leaked and not cors
    ok = ok and frontkit.status_of(answer) == 200
    return (
        f"{len(paths)} paths refused ({', '.join(str(c) for c in codes)}), "
        f"{len(leaked)} reached the backend; Origin answered {frontkit.status_of(answer)} "
        f"{'WITH' if cors else 'without'} Access-Control-Allow-Origin",
        ok,
    )


def term_ignored(home: Home) -> str:
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    recipe = Recipe(candidate_id="x:y", template="mlx_lm_server", model_path="/none")
    record, proc = start_server(
        recipe,
        port=free_port(),
        role="candidate",
        log_path=home.logs / "stubborn.log",
        argv=[sys.executable, "-c", code],
    )
    time.sleep(0.5)
    outcome = stop_server(record, grace=2)
    proc.wait(timeout=10)
    run_supervisor(home)
    return outcome


@dataclass
class Fault:
    """One row: ``kind`` says how its home is made (cycle: a queued plan; disk: the same on a
    small disk of its own; front: the live service only, no cycle)."""

    name: str
    run: Callable[..., Any]
    kind: str = "cycle"
    home: dict[str, Any] = field(default_factory=dict)
    service: dict[str, Any] | None = None  # the policy's service section, if not the default
    protocol: dict[str, Any] | None = None  # what its cycles measure, if not ``PROTOCOL``
    policy: dict[str, Any] = field(default_factory=dict)  # other sections of its policy


WINS = {"thresholds": PROMOTE_ANY_GAIN}  # a winner on any measured gain: the rows past SELECT

FAULTS: list[Fault] = [
    Fault("SIGKILL supervisor at BASELINE", kill_at("BASELINE")),
    Fault("SIGKILL while a candidate is measured", kill_at("EXPERIMENT:measuring")),
    Fault("SIGKILL at PROMOTE (live server stopping)", kill_at("PROMOTE"), home=WINS),
    Fault("SIGKILL at VERIFY (winner not verified)", kill_at("VERIFY"), home=WINS),
    Fault("SIGKILL after VERIFY passed", kill_at("VERIFY:passed"), home=WINS),
    Fault("SIGKILL while sealing", kill_at("SEALED"), home=WINS),
    Fault("candidate server killed mid-benchmark", candidate_dies),
    Fault("stranger takes the stable port", stranger_takes_port),
    Fault("front SIGKILLed mid-cycle", front_killed),
    Fault(
        "supervisor SIGKILLed while requests are held",
        held_then_supervisor_killed,
        service=EXCLUSIVE,
    ),
    Fault("server ignores SIGTERM", term_ignored),
    Fault(
        "winner dies before the switch (failed adoption)",
        winner_dies_before_the_switch,
        home=WINS,
    ),
    Fault("front's proxy SIGSTOPped before the hold", hold_not_confirmed, service=EXCLUSIVE),
    Fault("disk full during EXPERIMENT", disk_full("EXPERIMENT:measuring"), kind="disk"),
    Fault("disk full while sealing", disk_full("SEALED"), kind="disk"),
    Fault("paths outside the API; an Origin", paths_and_origins, kind="front"),
    Fault("200 streamed clients at once", two_hundred_clients, kind="front"),
    Fault("live backend SIGKILLed mid-stream", backend_killed_mid_stream, kind="front"),
    Fault("poison body (kills generation)", poison_body, kind="front"),
    Fault("200 MB body", huge_body, kind="front"),
    Fault(f"{CLIENTS} streamed clients at once", thousand_clients, kind="front"),
    Fault(f"front's proxy SIGSTOPped x{STOPS}", front_stopped, kind="front"),
    Fault("live backend hung (SIGSTOP)", backend_hung, kind="front"),
    Fault(f"home disk full for {FULL_FOR_S / 60:.0f} min", disk_held_full, kind="full"),
    Fault(
        f"{AGENTS} agents propose at once over MCP HTTP while a cycle runs",
        ten_agents,
        protocol={**ONE_START, "warmup": 0, "max_tokens": 8},
    ),
    Fault(
        "promotion under load (8 clients)",
        promotion_under_load,
        home=WINS,
        policy={"recipe_memory": False},  # a second attempt measures the drafter again
    ),
]


def run_fault(fault: Fault, root: Path, models: dict[str, Path], protocol: dict) -> dict[str, str]:
    with contextlib.ExitStack() as stack:
        small = fault.kind in ("disk", "full")
        disk = stack.enter_context(small_disk(root)) if small else None
        home = make_home(root, models, **fault.home, **(fault.protocol or protocol))
        stack.callback(stop_home, home)  # before the small disk is unmounted
        if fault.service is not None or fault.policy:
            _policy(home, fault.service, fault.policy)
        start_live(home)
        cycle = fault.kind in ("cycle", "disk")
        if fault.kind == "front":
            note, held = fault.run(home)
        elif fault.kind == "full":
            note, held = fault.run(home, disk)
        else:
            queue_plan(home)
            said = fault.run(home, disk) if disk else fault.run(home)
            note, held = said if isinstance(said, tuple) else (said, True)
        after = inspect(home)
        sealed = 1 if not cycle or after.sealed else 0
        if cycle:
            held = held and after.verified
        if fault.kind == "disk":
            held = held and note.count("exit 5") == 1 and "`recover` exit 0" in note
            held = held and "NOT serving" not in note and " 0 candidate(s) left" in note
        if fault.run is hold_not_confirmed:
            held = held and after.outcome != "needs_operator" and "proxy replaced" in note
        if fault.name.startswith("winner dies"):
            held = after.verified and after.outcome == "rolled_back" and "serves" in note
        return {
            "fault": fault.name,
            "outcome": after.outcome if cycle else "-",
            "restored": "yes" if after.healthy else "NO",
            "orphans": str(len(after.orphans)),
            "lost": str(len(after.journal_problems) + 1 - sealed),
            "held": "yes" if held else "NO",
            "note": note,
        }


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("word", nargs="?", default="", help="only the faults whose name has it")
    args = ap.parse_args()
    only = args.word.lower()
    chosen = [f for f in FAULTS if only in f.name.lower()]
    if args.smoke:  # the first of the cycle faults and the first of the front's
        first: dict[str, Fault] = {}
        for fault in chosen:
            first.setdefault(fault.kind, fault)
        chosen = [first[kind] for kind in ("cycle", "front") if kind in first]
    protocol = _common.SMOKE_PROTOCOL if args.smoke else PROTOCOL
    work = Path(tempfile.mkdtemp(prefix="mcp-infra-faults-"))
    models = build_demo_models(work / "models")
    rows: list[dict[str, str]] = []
    for fault in chosen:
        started = time.monotonic()
        try:
            row = run_fault(fault, work / f"home-{len(rows)}", models, protocol)
        except Exception as exc:  # a benchmark reports a broken scenario instead of dying
            row = {"fault": fault.name, "outcome": "ERROR", "restored": "?", "orphans": "?"}
            row |= {"lost": "?", "held": "?", "note": f"{type(exc).__name__}: {exc}"[:80]}
        rows.append({**row, "seconds": f"{time.monotonic() - started:.0f}"})
        print(f"done: {fault.name}", file=sys.stderr, flush=True)
    columns = [
        ("fault", "fault"),
        ("outcome", "outcome"),
        ("restored", "service restored"),
        ("orphans", "orphans"),
        ("lost", "records lost"),
        ("held", "target held"),
        ("note", "seen"),
        ("seconds", "s"),
    ]
    print(_common.table(rows, columns))
    shutil.rmtree(work, ignore_errors=True)
    ok = all(
        r["restored"] == "yes" and r["orphans"] == "0" and r["lost"] == "0" and r["held"] == "yes"
        for r in rows
    )
    _common.emit({"smoke": args.smoke, "rows": rows, "all_restored": ok}, args.json)
    return 0 if ok and rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
