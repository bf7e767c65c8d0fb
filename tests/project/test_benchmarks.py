"""Every benchmark runs: a benchmark that does not run is a target nobody can check.

The fast tier runs each script's ``--help`` (it says what the script measures, its target and how
long it takes); the slow tier runs each with ``--smoke --json``, the smallest real run of the
same code. Scripts are found by glob, so a new benchmark is covered the day it is added; a
module whose name starts with ``_`` is a shared helper, not a benchmark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_infra.demo.traffic import KINDS as SOAK_KINDS
from tests.helpers.paths import BENCHMARKS
from tests.helpers.run import Spawn

SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
HELP_TIMEOUT_S = 240
SMOKE_TIMEOUT_S = 900

Runner = Callable[..., subprocess.CompletedProcess[str]]


def _plain_run(argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def smoke(script: Path, run: Runner = _plain_run) -> tuple[list[str], float]:
    """Run ``script --smoke --json``; return why it counts as broken (nothing if it ran) and
    how long it took. Ran means: exit status 0 and one JSON object as the last line."""
    started = time.monotonic()
    result = run([sys.executable, str(script), "--smoke", "--json"], timeout=SMOKE_TIMEOUT_S)
    seconds = time.monotonic() - started
    problems = []
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        problems.append(f"exit status {result.returncode}: {last}")
    lines = result.stdout.strip().splitlines()
    try:
        last_line = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        last_line = None
    if not isinstance(last_line, dict):
        problems.append("no JSON object as the last line of its output")
    return problems, seconds


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess[str]]:
    """Every script's --help, run side by side (each is an interpreter start and its imports)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = {
        script.name: subprocess.Popen(
            [sys.executable, str(script), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for script in SCRIPTS
    }
    done = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=HELP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def test_the_benchmarks_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"mcp_latency.py", "fuzz_plans.py", "faults.py"} <= names
    assert "_common.py" not in names


@pytest.mark.timeout(300)  # nine interpreters at once: minutes on a loaded 2-core machine
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_help(script: Path, helps: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """--help exits 0 and says what the script measures, its target and how long it takes."""
    result = helps[script.name]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")
    for word in ("--smoke", "--json", "Target:", "Takes:"):
        assert word in result.stdout, f"{script.name} --help does not mention {word}"


OWN_SMOKE = {"soak.py"}  # smoked by a test of its own below, which also judges its figures


@pytest.mark.parametrize(
    "script", [s for s in SCRIPTS if s.name not in OWN_SMOKE], ids=lambda p: p.stem
)
def test_smoke(script: Path, spawn: Spawn) -> None:
    """The smallest real run of each benchmark (real servers and cycles where it has them)."""
    problems, seconds = smoke(script, spawn.run)
    print(f"{script.name} --smoke took {seconds:.0f} s")
    assert problems == [], f"{script.name} --smoke: {problems}"


def test_the_soak_smoke_fails_no_request_and_grows_nothing(spawn: Spawn) -> None:
    """`soak.py --smoke`: mixed traffic (short and long, streamed and not, clients that leave
    mid-stream, model listings) through the front while a cycle runs: no request fails, the
    front's memory and open files at the end are within 10% of their figures after the
    warm-up, no log is over its cap, and the traffic alone leaves nothing behind."""
    script = BENCHMARKS / "soak.py"
    result = spawn.run([sys.executable, str(script), "--smoke", "--json"], timeout=SMOKE_TIMEOUT_S)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(lines[-1])
    assert figures["failed"] == 0, figures["failures"]
    assert set(figures["requests"]) == set(SOAK_KINDS) and figures["left_on_purpose"] > 0
    assert [run.get("outcome") is not None for run in figures["cycles"]] == [True], figures
    for growth in ("memory_growth", "open_files_growth", "rest_growth_traffic_alone"):
        assert figures[growth] is not None and figures[growth] <= 0.10, (growth, figures)
    assert figures["largest_log_mb"] <= 4.1 and figures["target_held"], figures


BREAKS: dict[str, tuple[Callable[[str], str], str]] = {
    # what the issue found: a script importing what a plain install does not have
    "a missing dependency": (
        lambda text: text.replace("import _common\n", "import _common\nimport no_such_pkg\n", 1),
        "ModuleNotFoundError: No module named 'no_such_pkg'",
    ),
    "an error while it runs": (
        lambda text: text.replace(
            "    args = ap.parse_args(argv)\n",
            "    args = ap.parse_args(argv)\n    raise RuntimeError('broken on purpose')\n",
            1,
        ),
        "RuntimeError: broken on purpose",
    ),
    "exit 0 without its figures": (
        lambda text: text.replace(
            "    args = ap.parse_args(argv)\n", "    args = ap.parse_args(argv)\n    return 0\n", 1
        ),
        "no JSON object as the last line of its output",
    ),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_smoke_fails_on_a_broken_copy(name: str, tmp_path: Path) -> None:
    """The smoke check can fail: a copy of a benchmark broken on purpose is reported, for the
    break's own reason (the copy sits beside a copy of the shared helper, as in benchmarks/)."""
    break_it, expected = BREAKS[name]
    original = (BENCHMARKS / "decision_quality.py").read_text()
    broken = break_it(original)
    assert broken != original, "the break no longer applies to the script"
    shutil.copy(BENCHMARKS / "_common.py", tmp_path / "_common.py")
    (tmp_path / "decision_quality.py").write_text(broken)
    problems, _ = smoke(tmp_path / "decision_quality.py")
    assert problems and any(expected in p for p in problems), problems
