"""This test run's marker and the `Spawn` of real child processes.

Every process of a run carries ``RUN_ENV=RUN_ID`` in its environment (set here, in
``os.environ``, when tests/conftest.py imports this module, so every child inherits it); the
conftest's sweep finds the run's processes by it. Tests that build a child's environment by hand
pass it on with ``run_env``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from mcp_infra.state.store import Home

RUN_ENV = "MCP_INFRA_TEST_RUN"
RUN_START = psutil.Process().create_time()
RUN_ID = f"{os.getpid()}:{RUN_START:.3f}"
os.environ[RUN_ENV] = RUN_ID  # inherited by every child that gets os.environ


def run_env(**extra: str) -> dict[str, str]:
    """The marker a child must carry (for tests that build a child's environment by hand)."""
    return {RUN_ENV: RUN_ID, **extra}


class Spawn:
    """Real child processes of a test (`mcp-infra` subcommands, mlx tools), with the run's
    marker in their environment; whatever is still running at teardown is stopped."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    @staticmethod
    def env(env: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if env is None else env), **run_env()}

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(argv, env=self.env(env), timeout=timeout, check=False, **kwargs)

    def mcp_infra(
        self, home: Home | Path | str, *args: str, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        root = home.root if isinstance(home, Home) else home
        return self.run([sys.executable, "-m", "mcp_infra", "--home", str(root), *args], **kwargs)

    def popen(
        self, argv: list[str], *, env: dict[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(argv, env=self.env(env), **kwargs)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
