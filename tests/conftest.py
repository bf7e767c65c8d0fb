"""Shared fixtures: real tiny models (built once per session), real homes on free ports.

Tests start real `mlx_lm.server` processes on these models; nothing here is a fake. The `test`
policy placed in each home is the demo policy with fewer repeats and tokens, so a whole cycle fits
the 2-core CI machine; it is real configuration the code loads like any user's own policy.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from mcp_infra.contracts import Recipe, ServiceConfig
from mcp_infra.demo.models import build_demo_models
from mcp_infra.procs.runtime import free_port
from mcp_infra.procs.service import stop_service, stop_stray_candidates
from mcp_infra.state.catalog import policy_dir
from mcp_infra.state.store import CorruptFile, Home, write_model

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_demo_models(tmp_path_factory.mktemp("models"))


def write_test_policy(home: Home, **protocol: object) -> None:
    """The demo policy, with a smaller protocol, saved as the home's own `test` policy."""
    data = yaml.safe_load((policy_dir() / "demo.yaml").read_text())
    data["name"] = "test"
    data["protocol"].update({"repeats": 3, "warmup": 1, "max_tokens": 32,
                             "bootstrap_resamples": 500, "ready_timeout_s": 120,
                             "request_timeout_s": 60, **protocol})
    home.user_policy.mkdir(parents=True, exist_ok=True)
    (home.user_policy / "test.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def make_home(root: Path, models: dict[str, Path], **protocol: object) -> Home:
    home = Home(root).ensure()
    home.models.rmdir()
    home.models.symlink_to(models["target"].parent, target_is_directory=True)
    write_test_policy(home, **protocol)
    port = free_port()
    scratch = free_port()
    while scratch == port:
        scratch = free_port()
    write_model(home.config, ServiceConfig(
        port=port, scratch_port=scratch, policy="test",
        baseline=Recipe(candidate_id="demo-tiny:target", template="mlx_lm_server",
                        model_path=str(home.models / "target"))))
    return home


def _kill_leftovers(home: Home) -> None:
    """Stop what this home's records name, then anything still holding our argv (belt and
    braces for a failed test, so later tests do not inherit busy CPUs)."""
    for stop in (stop_stray_candidates, stop_service):
        try:
            stop(home, grace=3)
        except CorruptFile:
            continue  # a test corrupted the record on purpose; the sweep below still runs
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(str(home.root) in part for part in cmdline):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue


@pytest.fixture
def home(tmp_path: Path, demo_models: dict[str, Path]) -> Iterator[Home]:
    h = make_home(tmp_path / "home", demo_models)
    yield h
    _kill_leftovers(h)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
