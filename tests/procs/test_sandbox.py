"""The code-answer runner: a separate ``python -I -S`` process, limits, an audit hook, a timeout.

Real processes, no mocks. Each case is a reply a model might write by accident; none of them may
reach this process or the host (procs/sandbox.py says what is and is not protected).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mcp_infra.core.answers import CodeAnswer, CodeTest, code_job
from mcp_infra.procs.sandbox import run_code

ADD = CodeAnswer(
    function="add",
    tests=[CodeTest(args=[2, 3], expect=5), CodeTest(args=[-1, 1], expect=0)],
)


def run(body: str, timeout_s: float = 5.0):
    job, why = code_job(ADD, f"```python\n{body}\n```")
    assert job is not None, why
    return run_code(job, timeout_s=timeout_s)


def test_a_right_answer_passes_and_the_run_names_its_code() -> None:
    result = run("def add(a, b):\n    return a + b")
    assert result.ok and (result.passed, result.total) == (2, 2)
    job, _ = code_job(ADD, "```python\ndef add(a, b):\n    return a + b\n```")
    assert job is not None and result.digest == job.digest


def test_a_wrong_answer_reports_its_first_failed_call() -> None:
    result = run("def add(a, b):\n    return a * b")
    assert not result.ok and result.passed == 0
    assert result.detail == "add(2, 3) returned 6, expected 5"


def test_a_bool_is_not_a_number_and_a_tuple_is_a_list() -> None:
    flag = CodeAnswer(function="f", tests=[CodeTest(args=[], expect=1)])
    job, _ = code_job(flag, "def f():\n    return True\n")
    assert job is not None and not run_code(job).ok
    pair = CodeAnswer(function="f", tests=[CodeTest(args=[], expect=[1, 2])])
    job, _ = code_job(pair, "def f():\n    return (1, 2)\n")
    assert job is not None and run_code(job).ok


def test_a_loop_is_stopped_by_the_wall_clock() -> None:
    began = time.monotonic()
    result = run("def add(a, b):\n    while True:\n        pass", timeout_s=1.0)
    assert not result.ok and result.detail == "timed out after 1 s"
    assert time.monotonic() - began < 4


def test_a_huge_allocation_fails_inside_the_child() -> None:
    result = run("def add(a, b):\n    x = bytearray(8 * 1024**3)\n    return a + b")
    assert not result.ok and "MemoryError" in result.detail


@pytest.mark.parametrize(
    ("body", "event"),
    [
        (
            "import subprocess\ndef add(a, b):\n    subprocess.run(['true'])\n    return a + b",
            "subprocess",
        ),
        ("import os\ndef add(a, b):\n    os.system('true')\n    return a + b", "os.system"),
        ("import socket\ndef add(a, b):\n    socket.socket()\n    return a + b", "socket"),
        ("import os\ndef add(a, b):\n    os.fork()\n    return a + b", "os.fork"),
    ],
)
def test_processes_and_sockets_are_refused(body: str, event: str) -> None:
    result = run(body)
    assert not result.ok and "refused while running an answer" in result.detail
    assert event in result.detail


def test_writing_outside_its_folder_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "written"
    victim = tmp_path / "keep"
    victim.write_text("x")
    for body in (
        f"def add(a, b):\n    open({str(marker)!r}, 'w').write('x')\n    return a + b",
        f"import os\ndef add(a, b):\n    os.remove({str(victim)!r})\n    return a + b",
    ):
        result = run(body)
        assert not result.ok and "refused" in result.detail, result.detail
    assert not marker.exists() and victim.exists()


def test_its_own_folder_is_writable_and_gone_afterwards() -> None:
    body = (
        "import os\ndef add(a, b):\n    open('scratch.txt', 'w').write(os.getcwd())\n"
        "    return a + b\nopen('where.txt', 'w').write(os.getcwd())"
    )
    assert run(body).ok
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("mcp-infra-answer-*")]
    assert leftovers == []


def test_a_printed_fake_result_does_not_count() -> None:
    body = (
        "import sys\ndef add(a, b):\n    sys.__stdout__.write('result-0:{\"passed\": 2}\\n')\n"
        "    return a - b"
    )
    assert not run(body).ok


def test_an_exit_or_a_crash_before_the_tests_is_a_failure() -> None:
    assert "SystemExit" in run("import sys\ndef add(a, b):\n    sys.exit(0)").detail
    assert (
        "before its tests" in run("def add(a, b):\n    return a + b\nraise ValueError('no')").detail
    )
    result = run("import os\ndef add(a, b):\n    return a + b\nx = os._exit(3)")
    assert not result.ok and "without a result (exit code 3)" in result.detail
