"""Inject real faults into real cycles and print what a person finds afterwards.

What: each row is a fresh home with the demo models, a live `mlx_lm.server` behind the front, a
queued plan, one fault (a SIGKILLed supervisor at a journal state, a candidate or the front
killed, a stranger on the stable port, a full disk while sealing, a server that ignores SIGTERM),
then a fresh supervisor (or `recover`). Columns: the sealed outcome, whether the live service
serves a verified recipe again, project servers left over besides it, and records lost (journal
lines unreadable + cycles never sealed).

Target: after every fault the service is restored, with no orphan and no record lost (exit
status 1 otherwise).
Takes: twelve faults, each with up to one cycle under the lean `test` policy. --smoke: the
first fault only (SIGKILL at BASELINE, then recovery) under the smoke protocol (about 15 s).

    .venv/bin/python benchmarks/faults.py [WORD] [--json] [--smoke]   # WORD: faults named so
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import _common
import httpx2 as httpx
import yaml

from mcp_infra.contracts import Recipe
from mcp_infra.demo.faults import (
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
from mcp_infra.demo.homes import make_home, stop_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.flows.cycle import SealFailed, supervise
from mcp_infra.procs.front import front_record, read_route
from mcp_infra.procs.runtime import free_port, is_running, start_server, stop_server
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home

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


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("word", nargs="?", default="", help="only the faults whose name has it")
    args = ap.parse_args()
    only = args.word.lower()
    chosen = [s for s in SCENARIOS if only in s[0].lower()][: 1 if args.smoke else None]
    protocol = _common.SMOKE_PROTOCOL if args.smoke else PROTOCOL
    work = Path(tempfile.mkdtemp(prefix="mcp-infra-faults-"))
    models = build_demo_models(work / "models")
    rows: list[dict[str, str]] = []
    for name, scenario in chosen:
        home = make_home(work / f"home-{len(rows)}", models, **protocol)
        started = time.monotonic()
        try:
            start_live(home)
            queue_plan(home)
            note = scenario(home)
            after = inspect(home)
            lost = len(after.journal_problems) + (0 if after.sealed else 1)
            row = {
                "fault": name,
                "outcome": after.outcome or "-",
                "restored": "yes" if after.healthy else "NO",
                "orphans": str(len(after.orphans)),
                "lost": str(lost),
                "note": note,
            }
        except Exception as exc:  # a benchmark reports a broken scenario instead of dying
            row = {"fault": name, "outcome": "ERROR", "restored": "?", "orphans": "?"}
            row |= {"lost": "?", "note": f"{type(exc).__name__}: {exc}"[:60]}
        finally:
            stop_home(home)
        rows.append({**row, "seconds": f"{time.monotonic() - started:.0f}"})
        print(f"done: {name}", file=sys.stderr, flush=True)
    columns = [
        ("fault", "fault"),
        ("outcome", "outcome"),
        ("restored", "service restored"),
        ("orphans", "orphans"),
        ("lost", "records lost"),
        ("note", "note"),
        ("seconds", "s"),
    ]
    print(_common.table(rows, columns))
    shutil.rmtree(work, ignore_errors=True)
    ok = all(r["restored"] == "yes" and r["orphans"] == "0" and r["lost"] == "0" for r in rows)
    _common.emit({"smoke": args.smoke, "rows": rows, "all_restored": ok}, args.json)
    return 0 if ok and rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
