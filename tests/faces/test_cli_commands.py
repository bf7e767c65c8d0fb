"""The CLI as a person runs it: real `mcp-infra` subprocesses, their output and exit codes.

`propose`, `service`, `evidence verify/show/list`, `gate`, and the README's headline command,
`mcp-infra demo`, end to end in a temporary home. (The same evidence and gate logic in-process,
tampering included, is in tests/state/test_evidence_verify.py, fast tier.)
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from mcp_infra.procs import bench
from mcp_infra.procs.runtime import port_open
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import supervisors
from tests.helpers.paths import SHIPPED, shipped_key
from tests.helpers.run import Spawn

PLAN = {"hypothesis": "a drafter speeds up decoding", "candidates": ["demo-tiny:draft-k2"]}


def test_propose_command(home: Home, spawn: Spawn, tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(PLAN))
    dry = spawn.mcp_infra(home, "propose", str(plan_file), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    view = json.loads(dry.stdout)
    assert view["accepted"] and view["candidates"] == ["baseline", "demo-tiny:draft-k2"]
    assert home.queued() == [], "a dry run queues nothing"

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hypothesis": "h", "candidates": ["demo-tiny:warp-drive"]}))
    refused = spawn.mcp_infra(home, "propose", str(bad))
    assert refused.returncode == 1
    assert refused.stdout.startswith("REFUSED (nothing queued):")
    assert "demo-tiny:warp-drive: not a candidate of the registry" in refused.stdout
    assert refused.stdout.count("\n") == 1, "one line"

    queued = spawn.mcp_infra(home, "propose", "-", "--no-supervisor", input=json.dumps(PLAN))
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.startswith("ACCEPTED plan")
    assert len(home.queued()) == 1 and supervisors(home) == [], "queued, not run"


def test_service_command_starts_and_stops_the_live_service(home: Home, spawn: Spawn) -> None:
    config = load_config(home)
    started = spawn.mcp_infra(home, "service", "start")
    assert started.returncode == 0, started.stderr
    record = service_record(home)  # the live backend, on a port of its own behind the front
    assert record is not None and record.port != config.port and port_open(config.port)
    sample = bench.greedy_chat(
        f"http://127.0.0.1:{config.port}",
        [{"role": "user", "content": "ping"}],
        max_tokens=4,
        timeout=60,
        candidate="check",
        prompt_id="p",
    )
    assert sample.error is None and sample.token_ids
    again = spawn.mcp_infra(home, "service", "start")  # already serving: nothing restarted
    assert again.returncode == 0 and service_record(home) == record
    stopped = spawn.mcp_infra(home, "service", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert service_record(home) is None and not port_open(config.port)


def test_evidence_commands_as_subprocesses(spawn: Spawn, tmp_path: Path) -> None:
    home = tmp_path / "no-home"
    for bundle in SHIPPED:
        key = str(shipped_key(bundle))
        ok = spawn.mcp_infra(home, "evidence", "verify", str(bundle), "--key", key)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"{bundle}: VERIFIED" in ok.stdout
        shown = spawn.mcp_infra(home, "evidence", "show", str(bundle))
        assert shown.returncode == 0 and bundle.name in shown.stdout
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED[0], copy)
    (copy / "journal.ndjson").write_text((copy / "journal.ndjson").read_text() + "\n")
    key = str(shipped_key(SHIPPED[0]))
    tampered = spawn.mcp_infra(home, "evidence", "verify", str(copy), "--key", key)
    assert tampered.returncode == 1
    assert "FAIL file_hashes" in tampered.stdout
    assert "journal.ndjson: sha256 differs from the manifest" in tampered.stdout
    missing = spawn.mcp_infra(home, "evidence", "verify", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no evidence bundle at" in missing.stderr
    listed = spawn.mcp_infra(home, "evidence", "list")
    assert listed.returncode == 0 and "No sealed cycle yet." in listed.stdout


def test_gate_command_as_a_subprocess(spawn: Spawn, tmp_path: Path) -> None:
    home = tmp_path / "no-home"
    passed = spawn.mcp_infra(home, "gate", "check", "--task", "one_word", "--text", "blue")
    assert passed.returncode == 0 and passed.stdout.startswith("one_word: PASS")
    failed = spawn.mcp_infra(home, "gate", "check", "--task", "one_word", input="Not blue.")
    assert failed.returncode == 1 and failed.stdout.startswith("one_word: FAIL")


def test_demo_end_to_end(spawn: Spawn, tmp_path: Path) -> None:
    """The README's headline command, in a temporary home, with its own output."""
    home = tmp_path / "demo-home"
    result = spawn.mcp_infra(home, "demo", timeout=1400)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert f"home: {home}" in out
    assert "registry: " in out and "candidates pass preflight on this machine" in out
    header = re.search(
        r"^candidate +decode tok/s +speedup +interval +worst prompt +gates +"
        r"decision$",
        out,
        re.MULTILINE,
    )
    assert header, out[-3000:]
    for candidate in ("demo-tiny:draft-k2", "demo-tiny:draft-k4", "demo-tiny:draft-k4-cache"):
        assert re.search(
            rf"^{re.escape(candidate)} .*(qualified|rejected|inconclusive)$", out, re.MULTILINE
        ), candidate
    outcome = re.search(r"^cycle (c-\S+): (promoted|kept_baseline)", out, re.MULTILINE)
    assert outcome, "the demo ends with a promoted or kept-baseline outcome"
    assert "; service stopped" in out
    cycle_id = outcome.group(1)
    verified = spawn.mcp_infra(home, "evidence", "verify", cycle_id)
    assert verified.returncode == 0, verified.stdout
    assert not port_open(load_config(Home(home)).port), "the demo stops what it started"
