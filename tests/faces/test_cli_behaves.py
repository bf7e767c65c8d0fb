"""A command line that behaves (issue 20 item 7, issue 21 item 6's stdio close): real
`mcp-infra` subprocesses, one test per documented exit code (docs/cli.md), errors in one line
or as JSON, Ctrl-C on the demo and SIGTERM to a supervisor, and the stdio server answering every
request it read when its client closes stdin.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mcp_infra import __version__
from mcp_infra.demo.homes import make_home
from mcp_infra.errors import ExitCode
from mcp_infra.procs.runtime import port_open
from mcp_infra.state import evidence
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home
from tests.helpers.faultkit import (
    inspect,
    project_servers,
    queue_plan,
    start_live,
    supervisor,
    supervisor_log,
    wait_for,
)
from tests.helpers.run import Spawn

PLAN = {"hypothesis": "a drafter speeds up decoding", "candidates": ["demo-tiny:draft-k2"]}


def one_error_line(stderr: str, code: ExitCode) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mcp-infra: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def json_error(stdout: str, code: ExitCode) -> str:
    error = json.loads(stdout)["error"]
    assert (error["code"], error["name"]) == (int(code), code.name)
    return str(error["message"])


def test_version_and_ok(spawn: Spawn, bare_home: Home) -> None:
    version = spawn.mcp_infra(bare_home, "--version")
    assert (version.returncode, version.stdout.strip()) == (ExitCode.OK, f"mcp-infra {__version__}")
    status = spawn.mcp_infra(bare_home, "status", "--json")
    assert status.returncode == ExitCode.OK and json.loads(status.stdout)["configured"] is True


def test_no_is_exit_1(spawn: Spawn, bare_home: Home, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    refused = spawn.mcp_infra(bare_home, "propose", str(plan))  # preflight: no models built
    assert refused.returncode == ExitCode.NO
    assert (
        refused.stdout.startswith("REFUSED (nothing queued):") and refused.stdout.count("\n") == 1
    )
    gate = spawn.mcp_infra(bare_home, "gate", "check", "--task", "one_word", "--text", "two words")
    assert gate.returncode == ExitCode.NO


def test_usage_is_exit_2_in_one_line_or_json(spawn: Spawn, bare_home: Home) -> None:
    cases = [
        (["propose", "/nonexistent.json"], "propose: no such file: /nonexistent.json"),
        (["gate", "check", "--task", "nosuch", "--text", "x"], "unknown task nosuch; tasks: "),
        (["registry", "nosuch:x"], "nosuch:x is not a candidate of the registry"),
        (["registry", "demo-tiny:draft-k5"], "(nearest: demo-tiny:draft-k"),
        (["evidence", "show", "latest"], "no sealed cycle yet"),
        (["status", "--bogus"], "unrecognized arguments: --bogus"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["plan", "--goal", "g" * 600], "--goal must be one line of at most 500"),
    ]
    for argv, needle in cases:
        plain = spawn.mcp_infra(bare_home, *argv)
        assert plain.returncode == ExitCode.USAGE, (argv, plain.stderr)
        assert needle in one_error_line(plain.stderr, ExitCode.USAGE), (argv, plain.stderr)
        as_json = spawn.mcp_infra(bare_home, *argv, "--json")
        assert as_json.returncode == ExitCode.USAGE, argv
        assert needle in json_error(as_json.stdout, ExitCode.USAGE), argv
        assert as_json.stderr == "", "with --json the error is the JSON, nothing else"


def test_corrupt_state_is_exit_3(spawn: Spawn, bare_home: Home) -> None:
    bare_home.config.write_text("port: [\n")
    result = spawn.mcp_infra(bare_home, "registry")
    assert result.returncode == ExitCode.CORRUPT_STATE
    assert "config.yaml is not a valid ServiceConfig" in one_error_line(
        result.stderr, ExitCode.CORRUPT_STATE
    )


def test_locked_is_exit_4(spawn: Spawn, bare_home: Home) -> None:
    with bare_home.supervisor_lock():
        result = spawn.mcp_infra(bare_home, "supervise", "--json")
    assert result.returncode == ExitCode.LOCKED
    assert "another supervisor is running" in json_error(result.stdout, ExitCode.LOCKED)


def test_a_busy_port_is_exit_6(spawn: Spawn, bare_home: Home) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = spawn.mcp_infra(
            bare_home, "serve", "--transport", "http", "--port", str(port), timeout=60
        )
    assert result.returncode == ExitCode.UNAVAILABLE
    line = [x for x in result.stderr.splitlines() if x.startswith("mcp-infra: error:")]
    assert line and f"cannot listen on 127.0.0.1:{port}" in line[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_system_refusing_is_exit_7(spawn: Spawn, tmp_path: Path) -> None:
    """A home under a file: every command that reads the home says so (not "not configured")."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    result = spawn.mcp_infra(not_a_folder / "home", "propose", "-", input=json.dumps(PLAN))
    assert result.returncode == ExitCode.SYSTEM
    assert "Not a directory" in one_error_line(result.stderr, ExitCode.SYSTEM)
    for argv in (["status"], ["plan"]):
        refused = spawn.mcp_infra(not_a_folder / "home", *argv)
        assert refused.returncode == ExitCode.SYSTEM, (argv, refused.stdout, refused.stderr)
        assert "Not a directory" in one_error_line(refused.stderr, ExitCode.SYSTEM)


def test_a_fresh_home_is_exit_2_naming_what_to_run(spawn: Spawn, tmp_path: Path) -> None:
    """Nothing to act on until a person configures the home: usage (2), with the command; its
    status is a plain answer (0)."""
    fresh = tmp_path / "fresh"
    for argv in (["plan"], ["propose", "-"], ["plan", "--local"]):
        refused = spawn.mcp_infra(fresh, *argv, input=json.dumps(PLAN))
        assert refused.returncode == ExitCode.USAGE, (argv, refused.stderr)
        line = one_error_line(refused.stderr, ExitCode.USAGE)
        assert "no managed service is configured" in line and "mcp-infra prepare" in line
    status = spawn.mcp_infra(fresh, "status")
    assert status.returncode == ExitCode.OK and "Not configured" in status.stdout


def test_help_lists_every_command_and_a_typo_gets_a_guess(spawn: Spawn, bare_home: Home) -> None:
    from mcp_infra.faces.cli import COMMANDS

    listed = spawn.mcp_infra(bare_home, "--help")
    assert listed.returncode == ExitCode.OK
    for command in COMMANDS:
        assert f"    {command.name} " in listed.stdout, command.name
    example = spawn.mcp_infra(bare_home, "registry", "--help")
    assert "example: mcp-infra registry " in example.stdout
    typo = spawn.mcp_infra(bare_home, "--json", "registy")
    assert typo.returncode == ExitCode.USAGE and typo.stderr == ""
    assert "did you mean registry?" in json_error(typo.stdout, ExitCode.USAGE)


def test_a_refused_plan_is_said_once_in_cli_words(
    spawn: Spawn, bare_home: Home, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"hypothesis": "h", "candidates": ["demo-tiny:warp-drive"]}))
    refused = spawn.mcp_infra(bare_home, "propose", str(plan))
    assert refused.returncode == ExitCode.NO and refused.stderr == ""
    assert refused.stdout.count("REFUSED") == 1 and refused.stdout.count("\n") == 1
    assert "`mcp-infra registry`" in refused.stdout and "propose_plan" not in refused.stdout
    assert "mcp-infra://" not in refused.stdout
    as_json = spawn.mcp_infra(bare_home, "propose", str(plan), "--json")
    assert as_json.returncode == ExitCode.NO and as_json.stderr == ""
    view = json.loads(as_json.stdout)  # one JSON document, nothing around it
    assert view["accepted"] is False and view["refused"][0]["id"] == "demo-tiny:warp-drive"


def test_seal_failed_is_exit_5(spawn: Spawn, tmp_path: Path, demo_models: dict[str, Path]) -> None:
    """Sealing fails for real (the evidence folder is a file, so the bundle cannot be made);
    the cycle itself ends at once (a spent time budget): the supervisor exits 5, serving."""
    home = make_home(tmp_path / "home", demo_models, budgets={"cycle_minutes": 0.001})
    start_live(home)
    queue_plan(home, PLAN)
    home.evidence.rmdir()
    home.evidence.write_text("")
    result = spawn.mcp_infra(home, "supervise", timeout=300)
    assert result.returncode == ExitCode.SEAL_FAILED, result.stdout + result.stderr
    line = one_error_line(result.stderr, ExitCode.SEAL_FAILED)
    assert "sealing the evidence failed" in line and "the live recipe serves" in line
    assert port_open(load_config(home).port)


def test_supervise_stop_and_service_stop_end_a_running_cycle(spawn: Spawn, home: Home) -> None:
    """Paused while a candidate server is measured, a supervisor is stopped by `supervise
    --stop` (SIGTERM): it stops that server, seals the cycle as interrupted, leaves the live
    recipe serving, exits 128+15. `service stop` during the next cycle ends it the same way
    first, then stops the service: nothing of the home runs on."""
    start_live(home)
    plan_id = queue_plan(home, PLAN)
    proc = supervisor(home, pause_at="EXPERIMENT:measuring")
    marker = home.state / "paused-at-EXPERIMENT-measuring"
    wait_for(marker.exists, 240, "a candidate being measured", proc)
    live = inspect(home).serving
    assert len(project_servers(home)) >= 2, "the live backend and a candidate run"
    stopped = spawn.mcp_infra(home, "supervise", "--stop", timeout=240)
    assert stopped.returncode == ExitCode.OK, stopped.stdout + stopped.stderr
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    after = inspect(home, plan_id)
    assert after.orphans == [], "no candidate server is left"
    assert after.healthy and after.serving == live
    assert after.sealed and after.interrupted and after.verified
    assert not home.queued() and not home.lock_is_held()
    [sealed] = evidence.list_cycles(home)
    said = stopped.stdout.splitlines()
    assert said[0] == f"the supervisor stopped the cycle {sealed.cycle_id}", stopped.stdout
    assert said[1].startswith(f"cycle {sealed.cycle_id} sealed as interrupted: "), said
    assert sealed.reason.startswith("stopped on SIGTERM (`supervise --stop`, "), sealed
    assert "stopped on SIGTERM" in said[1], "the person is told what the bundle says"
    log = supervisor_log(home).read_text()
    assert "stopping on signal 15" in log and "Traceback" not in log
    again = spawn.mcp_infra(home, "supervise", "--stop")
    assert (again.returncode, again.stdout.strip()) == (ExitCode.OK, "no supervisor was running")

    queue_plan(home, PLAN)
    marker.unlink()
    proc = supervisor(home, pause_at="EXPERIMENT:measuring")
    wait_for(marker.exists, 240, "a candidate being measured", proc)
    down = spawn.mcp_infra(home, "service", "stop", timeout=240)
    assert down.returncode == ExitCode.OK, down.stdout + down.stderr
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    newest = evidence.list_cycles(home)[0]
    assert newest.cycle_id != sealed.cycle_id and newest.interrupted
    lines = down.stdout.splitlines()
    assert lines[0] == f"the supervisor stopped the cycle {newest.cycle_id}", down.stdout
    assert lines[-1].startswith("front: "), down.stdout
    assert project_servers(home) == [] and not port_open(load_config(home).port)
    assert not home.queued() and not home.lock_is_held()


def _processes_of(root: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("status") != psutil.STATUS_ZOMBIE and any(
            str(root) in part for part in cmdline
        ):
            found.append(" ".join(cmdline)[:160])
    return found


def test_ctrl_c_on_the_demo_stops_the_cycle_and_restores_the_service(
    spawn: Spawn, tmp_path: Path
) -> None:
    """A real SIGINT to the demo's process group (what Ctrl-C in a terminal sends) while its
    cycle measures: the cycle is stopped and sealed as interrupted, the live recipe is back, the
    demo says so and stops its service; no process of the demo's home is left."""
    root = tmp_path / "demo-home"
    demo = spawn.popen(
        [sys.executable, "-m", "mcp_infra", "--home", str(root), "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell runs a job
    )
    home = Home(root)
    wait_for(
        lambda: '"EXPERIMENT"' in _read(home.current_file),
        300,
        "the demo's cycle to measure",
        demo,
    )
    os.killpg(demo.pid, signal.SIGINT)
    out, _ = demo.communicate(timeout=300)
    assert demo.returncode == ExitCode.INTERRUPTED, out[-3000:]
    assert "interrupted: stopping the cycle" in out and "Traceback" not in out, out[-3000:]
    assert "the supervisor stopped the cycle" in out
    assert "sealed as interrupted" in out and "the live recipe demo-tiny:target serves" in out
    assert out.rstrip().endswith(
        "service stopped (the demo's service runs only while the demo does)"
    )
    [sealed] = evidence.list_cycles(home)
    assert sealed.interrupted and evidence.verify(evidence.bundle_path(home, sealed.cycle_id)).ok
    deadline = time.monotonic() + 15
    while _processes_of(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(root) == [], "no stray process"
    assert not port_open(load_config(home).port)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_stdio_answers_every_request_read_before_stdin_closed(
    spawn: Spawn, bare_home: Home
) -> None:
    """A client that pipes its requests and closes stdin gets every answer."""
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "pipe", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *(
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": n, "arguments": {}},
            }
            for i, n in enumerate(["status", "registry", "evidence", "registry", "status"], 1)
        ),
        {"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {}},
    ]
    result = spawn.mcp_infra(
        bare_home,
        "serve",
        "--no-supervisor",
        input="".join(json.dumps(line) + "\n" for line in lines),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    replies = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert sorted(r["id"] for r in replies) == list(range(7)), "every request answered"
    assert all("result" in r for r in replies)
    calls = {r["id"]: r["result"] for r in replies if r["id"] in range(1, 6)}
    assert all(not c.get("isError") for c in calls.values())
