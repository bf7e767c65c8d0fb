"""Helpers for the MCP front's tests: real `mcp-infra serve` subprocesses and their clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import psutil
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_infra.contracts import AuditRecord
from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.state.store import Home
from tests.helpers.run import run_env

PLAN = {
    "hypothesis": "A 2-token drafter speeds up greedy decoding.",
    "candidates": ["demo-tiny:draft-k2"],
}


def child_env(**extra: str) -> dict[str, str]:
    """What a host would pass: a minimal environment (the stdio client passes only a few), plus
    the test run's marker so that the run's sweep finds the server and what it starts."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **run_env(),
        **extra,
    }


def serve_argv(home: Home, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "serve", *extra]


def stdio_client(home: Home, *extra: str, mode: str = "auto", **kwargs: Any) -> Client:
    argv = serve_argv(home, *extra)
    return Client(
        StdioServerParameters(command=argv[0], args=argv[1:], env=child_env()), mode=mode, **kwargs
    )


def audit(home: Home) -> list[AuditRecord]:
    if not home.audit_log.exists():
        return []
    return [
        AuditRecord.model_validate_json(line)
        for line in home.audit_log.read_text().splitlines()
        if line.strip()
    ]


def serve_processes(home: Home) -> list[psutil.Process]:
    """Our `mcp-infra serve` children for this home (to kill one on purpose)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if "serve" in cmdline and str(home.root) in cmdline:
            found.append(proc)
    return found


def supervisors(home: Home) -> list[psutil.Process]:
    """Live `mcp-infra supervise` processes of this home (detached: any parent)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info.get("cmdline") or []
        if (
            "supervise" in cmdline
            and str(home.root) in cmdline
            and proc.info.get("status") != psutil.STATUS_ZOMBIE
        ):
            found.append(proc)
    return found


class RawStdio:
    """A JSON-RPC peer that writes raw lines (to send what no SDK client would, like NaN)."""

    def __init__(self, home: Home, *extra: str) -> None:
        self.proc = subprocess.Popen(
            serve_argv(home, *extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_env(),
        )
        self.next_id = 0

    def request(
        self, method: str, params: dict[str, Any] | None = None, raw_params: str | None = None
    ) -> dict[str, Any]:
        self.next_id += 1
        body = raw_params if raw_params is not None else json.dumps(params or {})
        line = f'{{"jsonrpc": "2.0", "id": {self.next_id}, "method": "{method}", "params": {body}}}'
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                return reply

    def initialize(self) -> dict[str, Any]:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw-peer", "version": "0"},
            },
        )
        assert self.proc.stdin
        self.proc.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        self.proc.stdin.flush()
        return reply

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for(predicate: Any, timeout: float, interval: float = 0.5, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


def files_under(path: Path) -> set[str]:
    """The files under ``path``, the proposals' lock file (``plans/.propose.lock``, which only
    serializes proposals and holds nothing) left out."""
    return (
        {
            str(p.relative_to(path))
            for p in path.rglob("*")
            if p.is_file() and p.name != ".propose.lock"
        }
        if path.exists()
        else set()
    )


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


class HttpServer:
    """`mcp-infra serve --transport http` as a real subprocess on a free loopback port, its
    output in the home's logs."""

    def __init__(self, home: Home, *extra: str) -> None:
        self.port = free_port()
        self.log = home.logs / f"http-{self.port}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.argv = serve_argv(home, "--transport", "http", "--port", str(self.port), *extra)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
            )
        deadline = time.monotonic() + 30
        while not port_open(self.port):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def post(self, **headers: str) -> httpx2.Response:
        return httpx2.post(self.url, json=INIT, headers={**HEADERS, **headers}, timeout=10)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()
