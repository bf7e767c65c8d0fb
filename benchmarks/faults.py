"""Inject real faults into real cycles and print what a person finds afterwards.

    .venv/bin/python benchmarks/faults.py [WORD]     # WORD: only the faults whose name has it
    .venv/bin/python benchmarks/faults.py front:[WORD]   # only the front's faults

Each row: a fresh home with the demo models, a live `mlx_lm.server`, a queued plan, one fault,
then a fresh supervisor (or `recover`). Columns: the sealed outcome, whether the live service
serves a verified recipe again, project servers left over besides it, and records lost (journal
lines unreadable + cycles never sealed). Takes a few minutes on 2 cores.

A second table, the front's faults: a fresh home serving through the front, one fault against
the stable port or its backend (no cycle), then what a client saw, whether the service serves
again through the front (and how), project servers left over, and what `status` said.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ["HF_HUB_OFFLINE"] = "1"

import httpx2 as httpx  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402
from conftest import _kill_leftovers, make_home  # noqa: E402
from faultkit import (  # noqa: E402
    candidate_records,
    inspect,
    pause_and_kill,
    queue_plan,
    run_supervisor,
    start_live,
    stranger,
    supervisor,
    wait_for,
)
from frontkit import (  # noqa: E402
    BackgroundStream,
    get,
    post,
    raw,
    served_again,
    slow_clients,
    status_of,
    streamed_clients,
    summary,
)

from mcp_infra.contracts import Recipe  # noqa: E402
from mcp_infra.demo.models import build_demo_models  # noqa: E402
from mcp_infra.flows import api as app  # noqa: E402
from mcp_infra.flows.cycle import SealFailed, supervise  # noqa: E402
from mcp_infra.procs.front import current_status, front_record, read_route  # noqa: E402
from mcp_infra.procs.runtime import free_port, is_running, start_server, stop_server  # noqa: E402
from mcp_infra.procs.service import SwitchFailed, adopt, start_backend, start_service  # noqa: E402
from mcp_infra.state.context import load_config, service_record  # noqa: E402
from mcp_infra.state.store import Home  # noqa: E402

PROTOCOL = {"repeats": 3, "warmup": 1, "max_tokens": 40}


def kill_at(state: str) -> Callable[[Home], str]:
    def scenario(home: Home) -> str:
        pause_and_kill(home, state)
        run_supervisor(home)
        return "new supervisor recovered"

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
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["service"] = {"max_hold_s": 5.0, "memory_budget_fraction": 0.001}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
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


def disk_full_while_sealing(home: Home) -> str:
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(home.evidence)],
            capture_output=True,
        ).returncode
        == 0
    )
    if not mounted:
        return "skipped (cannot mount tmpfs here)"
    try:
        supervise(home)
        note = "sealed?!"
    except SealFailed:
        note = "SealFailed reported"
    finally:
        subprocess.run(["umount", str(home.evidence)], check=False)
    supervise(home)
    return note + "; resealed after space returned"


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


SCENARIOS: list[tuple[str, Callable[[Home], str]]] = [
    ("SIGKILL supervisor at BASELINE", kill_at("BASELINE")),
    ("SIGKILL while a candidate is measured", kill_at("EXPERIMENT:measuring")),
    ("SIGKILL at PROMOTE (live server stopping)", kill_at("PROMOTE")),
    ("SIGKILL at VERIFY (winner not verified)", kill_at("VERIFY")),
    ("SIGKILL after VERIFY passed", kill_at("VERIFY:passed")),
    ("SIGKILL while sealing", kill_at("SEALED")),
    ("candidate server killed mid-benchmark", candidate_dies),
    ("stranger takes the stable port", stranger_takes_port),
    ("front SIGKILLed mid-cycle", front_killed),
    ("supervisor SIGKILLed while requests are held", held_then_supervisor_killed),
    ("disk full while sealing (tmpfs)", disk_full_while_sealing),
    ("server ignores SIGTERM", term_ignored),
]


# ---------------------------------------------------------------------------------------------
# The front's faults: (what the client saw, note) per scenario; no cycle runs
# ---------------------------------------------------------------------------------------------

CHAT = b"/v1/chat/completions"
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def _base(home: Home) -> str:
    return f"http://127.0.0.1:{load_config(home).port}"


def _port(home: Home) -> int:
    return load_config(home).port


def _live_pgid(home: Home) -> int:
    record = service_record(home)
    assert record is not None
    return record.pgid


def _posts_logged(home: Home) -> int:
    record = service_record(home)
    assert record is not None
    return Path(record.log_path).read_text(errors="replace").count('"POST /v1/chat/completions')


def front_load(home: Home) -> tuple[str, str]:
    seen = summary(streamed_clients(_base(home), 200, max_tokens=4))
    return (
        f"{seen['complete']}/200 complete, {seen['resets']} resets, {seen['http_502']} 502s, "
        f"{seen['http_503']} 503s; p50 {seen['p50_s']} s, p99 {seen['p99_s']} s",
        "max_tokens 4, all sent at once",
    )


def bare_load(home: Home) -> tuple[str, str]:
    record = service_record(home)
    assert record is not None
    seen = summary(streamed_clients(f"http://127.0.0.1:{record.port}", 200, max_tokens=4))
    return (
        f"{seen['complete']}/200 complete, {seen['resets']} resets, {seen['http_502']} 502s; "
        f"p50 {seen['p50_s']} s, p99 {seen['p99_s']} s",
        "the same load on the backend's own port (no front): for comparison",
    )


def killed_mid_stream(home: Home) -> tuple[str, str]:
    stream = BackgroundStream(_base(home))
    stream.start()
    stream.started.wait(60)
    os.killpg(_live_pgid(home), signal.SIGKILL)
    killed = time.monotonic()
    stream.join(60)
    took = served_again(_base(home), 60)
    r = stream.result
    saw = f"HTTP {r.status}, " + (
        "error event, no [DONE]" if r.error_event and not r.done else f"done={r.done}"
    )
    return saw, f"served again {time.monotonic() - killed:.1f} s after the kill" if took else "-"


def keeps_dying(home: Home) -> tuple[str, str]:
    deaths = 0
    while not home.needs_operator_file.exists() and deaths < 6:
        served_again(_base(home), 60)
        os.killpg(_live_pgid(home), signal.SIGKILL)
        deaths += 1
        deadline = time.monotonic() + 5
        while not home.needs_operator_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    marked = home.needs_operator_file.exists()
    said = app.status(home).needs_operator or "-"
    subprocess.run(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "recover"],
        capture_output=True,
        timeout=300,
        check=False,
    )
    return (
        f"{deaths} SIGKILLs; needs-operator {'raised' if marked else 'NOT raised'}",
        f"status: {said[:70]}; then `recover`",
    )


def poison_utf8(home: Home) -> tuple[str, str]:
    before = _posts_logged(home)
    answer = raw(_port(home), post(CHAT, b"\xff"))
    return f"HTTP {status_of(answer)}", f"reached the backend {_posts_logged(home) - before} times"


def poison_generation_thread(home: Home) -> tuple[str, str]:
    before = _posts_logged(home)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": 5}'
    answer = raw(_port(home), post(CHAT, body), timeout=30)
    time.sleep(1.0)
    reached = _posts_logged(home) - before
    started = time.monotonic()
    took = served_again(_base(home), 60)
    return (
        f"HTTP {status_of(answer)} (the backend's own error)",
        f"reached the backend {reached} time(s); backend restarted, served again after "
        + (f"{time.monotonic() - started:.1f} s" if took else "-"),
    )


def slowloris(home: Home) -> tuple[str, str]:
    socks = slow_clients(_port(home), 1500)
    try:
        front = front_record(home)
        assert front is not None
        fds = psutil.Process(front.pid).num_fds()
        ok = served_again(_base(home), 30)
        closed = 0
        time.sleep(load_config(home).front.header_timeout_s + 1)
        for sock in socks:
            sock.settimeout(0.01)
            try:
                closed += sock.recv(1) == b""
            except OSError as exc:
                closed += not isinstance(exc, TimeoutError)
    finally:
        for sock in socks:
            sock.close()
    return (
        f"a real client {'served' if ok else 'NOT served'} with 1,500 slow connections open",
        f"front holds {fds} fds; {closed}/1500 closed by the front within the header time",
    )


def idle_connections(home: Home) -> tuple[str, str]:
    socks = []
    for _ in range(3000):
        socks.append(socket.create_connection(("127.0.0.1", _port(home)), timeout=5))
    try:
        health = status_of(raw(_port(home), get(b"/health")))
        ok = served_again(_base(home), 30)
    finally:
        for sock in socks:
            sock.close()
    return f"/health HTTP {health}; a chat {'served' if ok else 'NOT served'}", "3,000 idle"


def huge_body(home: Home) -> tuple[str, str]:
    with socket.create_connection(("127.0.0.1", _port(home)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 209715200\r\n\r\n"
        )
        status = status_of(sock.recv(4096))
    front = front_record(home)
    assert front is not None
    rss = psutil.Process(front.pid).memory_info().rss / 2**20
    return f"HTTP {status} before any body byte", f"front RSS {rss:.0f} MB"


def hostile_paths(home: Home) -> tuple[str, str]:
    paths = [b"/v1/../x", b"/v1/%2e%2e/%2e%2e/etc/passwd", b"/v1/models%00", b"/metrics"]
    codes = [status_of(raw(_port(home), get(p))) for p in paths]
    record = service_record(home)
    assert record is not None
    log = Path(record.log_path).read_text(errors="replace")
    leaked = sum(x in log for x in ("passwd", "metrics", "/x "))
    return f"HTTP {', '.join(map(str, codes))}", f"{leaked} reached the backend"


def cross_origin(home: Home) -> tuple[str, str]:
    answer = raw(_port(home), post(CHAT, BODY, b"Origin: https://evil.example\r\n"))
    acao = b"access-control-allow-origin" in answer.lower()
    return f"HTTP {status_of(answer)}", "Access-Control-Allow-Origin " + (
        "SENT" if acao else "absent"
    )


def failed_adoption(home: Home) -> tuple[str, str]:
    config = load_config(home)
    new = start_backend(
        home, config.baseline, role="backend", log=home.logs / "new.log", cycle_id=None, timeout=120
    )
    os.killpg(new.pgid, signal.SIGKILL)
    try:
        adopt(home, new, config, reason="benchmark: adopt a backend that just died")
        return "switched?!", "-"
    except SwitchFailed as exc:
        ok = served_again(_base(home), 10)
        return f"requests {'served' if ok else 'NOT served'}", f"SwitchFailed: {exc.serving} serves"


def file_size_limit(home: Home) -> tuple[str, str]:
    """A full disk under the front, as RLIMIT_FSIZE: no file it writes may grow past 256 B."""
    front = front_record(home)
    assert front is not None
    proc = psutil.Process(front.pid)
    soft, hard = proc.rlimit(psutil.RLIMIT_FSIZE)
    proc.rlimit(psutil.RLIMIT_FSIZE, (256, hard))
    try:
        config = load_config(home)
        start_service(home, config.baseline, config)
        ok = served_again(_base(home), 10)
        status = current_status(home)
        failures = status.tasks["status"].failures if status else -1
    finally:
        proc.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))
    return (
        f"a switch acknowledged; requests {'served' if ok else 'NOT served'}",
        f"status writer failed {failures} times, restarted each time",
    )


FRONT_SCENARIOS: list[tuple[str, Callable[[Home], tuple[str, str]]]] = [
    ("200 streamed clients at once, bare backend", bare_load),
    ("200 streamed clients at once, through the front", front_load),
    ("backend SIGKILLed mid-stream", killed_mid_stream),
    ("backend keeps dying", keeps_dying),
    ("poison body: 1 byte, not UTF-8", poison_utf8),
    ("poison body that kills mlx_lm's generation thread", poison_generation_thread),
    ("slowloris, 1,500 connections", slowloris),
    ("3,000 idle connections", idle_connections),
    ("200 MB body", huge_body),
    ("path traversal, NUL, other paths", hostile_paths),
    ("a web page of another origin", cross_origin),
    ("winner dies before the switch (failed adoption)", failed_adoption),
    ("file-size limit under the front (a full disk)", file_size_limit),
]


def front_table(work: Path, models: dict[str, Path], only: str) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, scenario in [s for s in FRONT_SCENARIOS if only in s[0].lower()]:
        home = make_home(work / f"front-{len(rows)}", models, **PROTOCOL)
        started = time.monotonic()
        try:
            start_live(home)
            saw, note = scenario(home)
            served = served_again(_base(home), 60)
            settle = time.monotonic() + 15  # a restart may still be telling the front
            while time.monotonic() < settle:
                status = current_status(home)
                if status and status.healing.state not in {"restarting", "waiting", "backing_off"}:
                    break
                time.sleep(0.2)
            view = app.status(home)
            said = (
                view.service.healing
                if view.service and view.service.healing
                else "healthy"
                if view.service and view.service.healthy
                else "NOT healthy"
            )
            after = inspect(home)
            rows.append(
                (
                    name,
                    saw,
                    "yes" if served is not None and after.healthy else "NO",
                    str(len(after.orphans)),
                    (said or "-")[:90],
                    note,
                    f"{time.monotonic() - started:.0f}s",
                )
            )
        except Exception as exc:  # a benchmark reports a broken scenario instead of dying
            rows.append((name, "ERROR", "?", "?", "-", f"{type(exc).__name__}: {exc}"[:80], "-"))
        finally:
            _kill_leftovers(home)
        print(f"done: {name}", file=sys.stderr, flush=True)
    return rows


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="mcp-infra-faults-"))
    models = build_demo_models(work / "models")
    rows: list[tuple[str, ...]] = []
    only = sys.argv[1].lower() if len(sys.argv) > 1 else ""
    front_only = only.startswith("front:")  # front:WORD: only the front's faults
    only = only.removeprefix("front:")
    for name, scenario in [s for s in SCENARIOS if only in s[0].lower() and not front_only]:
        home = make_home(work / f"home-{len(rows)}", models, **PROTOCOL)
        started = time.monotonic()
        try:
            start_live(home)
            queue_plan(home)
            note = scenario(home)
            after = inspect(home)
            lost = len(after.journal_problems) + (0 if after.sealed else 1)
            rows.append(
                (
                    name,
                    after.outcome or "-",
                    "yes" if after.healthy else "NO",
                    str(len(after.orphans)),
                    str(lost),
                    note,
                    f"{time.monotonic() - started:.0f}s",
                )
            )
        except Exception as exc:  # a benchmark reports a broken scenario instead of dying
            rows.append((name, "ERROR", "?", "?", "?", f"{type(exc).__name__}: {exc}"[:60], "-"))
        finally:
            _kill_leftovers(home)
        print(f"done: {name}", file=sys.stderr, flush=True)
    front = front_table(work, models, only)
    if rows:
        header = ("fault", "outcome", "service restored", "orphans", "records lost", "note", "time")
        print_table(header, rows)
    if front:
        print()
        print_table(
            ("front fault", "client saw", "restored", "orphans", "status said", "note", "time"),
            front,
        )
    shutil.rmtree(work, ignore_errors=True)
    ok = all(r[2] == "yes" and r[3] == "0" and r[4] == "0" for r in rows)
    return 0 if ok and all(r[2] == "yes" and r[3] == "0" for r in front) else 1


if __name__ == "__main__":
    raise SystemExit(main())
