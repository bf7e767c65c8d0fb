"""Run a code answer against its task's tests in a separate, limited process, never in this one.

What it does: the function taken from the reply (``core.answers.code_job``) is run by a fresh
``python -I -S`` (isolated mode: no environment variables, no user site, no current folder on
the path; no site-packages either) in an empty temporary folder, with an empty environment,
stdin closed after the job is read, and stdout/stderr going to files there. Before the answer's
code runs, the child lowers its own limits: CPU seconds, address space, file size, open files,
processes, core dumps; and it installs an audit hook that refuses sockets, new processes,
``ctypes``, and writing, renaming or removing files outside the temporary folder. A wall-clock
timeout kills the child's whole process group. The child prints one result line tagged with a
nonce it read from stdin.

What it does not: this is not a sandbox. The code runs as this user, and an audit hook lives
in the same interpreter as the code it watches: code written to get around it (through
``gc``, frame objects, or the interpreter's internals) can, and can then read every file this
user can, reach the network, or fake its own result line. The process limit does not bind
root. The point is to judge a model's honest attempt at a small function without letting an
accident (a loop, a huge allocation, a stray ``os.remove``) reach the host; run quality suites
only on models you would let write code on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mcp_infra.contracts import CodeRun, Sample
from mcp_infra.core.answers import CodeAnswer, CodeJob, code_job
from mcp_infra.core.gates import reply_text
from mcp_infra.core.tasks import TASKS

WALL_TIMEOUT_S = 5.0
CPU_SECONDS = 2
MEMORY_BYTES = 512 * 1024 * 1024
FILE_BYTES = 1024 * 1024
OPEN_FILES = 32

# The child: reads its job from stdin, limits itself, runs the code and each test call, prints
# one tagged JSON line. Kept free of f-strings of ours: the job travels as data, never as code.
HARNESS = r"""
import builtins, io, json, os, resource, sys
job = json.loads(sys.stdin.read())
sys.stdin.close()
for name, soft in job["limits"].items():
    kind = getattr(resource, name)
    hard = resource.getrlimit(kind)[1]
    value = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(kind, (value, value))
root = os.path.realpath(os.getcwd())
REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
           "os.fork", "os.forkpty", "os.kill", "os.killpg", "ctypes.", "pty.", "os.chdir",
           "sys.setprofile", "sys.settrace")
WRITES = ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown",
          "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.")
def inside(path):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return real == root or real.startswith(root + os.sep)
def hook(event, args):
    if event.startswith(REFUSED):
        raise PermissionError("refused while running an answer: " + event)
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writes = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)
        if writes and not inside(args[0]):
            raise PermissionError("refused while running an answer: writing " + str(args[0]))
    if event.startswith(WRITES) and args and not all(
        inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))
    ):
        raise PermissionError("refused while running an answer: " + event)
out = sys.stdout
sys.stdout = sys.stderr = io.StringIO()
def plain(value):
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
def same(got, want):
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    return plain(got) == want
passed, detail = 0, ""
sys.addaudithook(hook)
try:
    space = {"__name__": "answer", "__builtins__": builtins}
    exec(compile(job["source"], "answer.py", "exec"), space)
    function = space[job["function"]]
    for test in job["tests"]:
        call = job["function"] + "(" + ", ".join(repr(a) for a in test["args"]) + ")"
        try:
            got = function(*test["args"])
        except BaseException as exc:
            detail = detail or call + " raised " + type(exc).__name__ + ": " + str(exc)[:120]
            continue
        if same(got, test["expect"]):
            passed += 1
        else:
            wrong = call + " returned " + repr(got)[:80] + ", expected " + repr(test["expect"])
            detail = detail or wrong
except BaseException as exc:
    detail = "the code failed before its tests: " + type(exc).__name__ + ": " + str(exc)[:120]
total = len(job["tests"])
detail = detail or "all %d test call(s) returned the expected values" % total
out.write(job["nonce"] + json.dumps({"passed": passed, "total": total, "detail": detail}) + "\n")
out.flush()
os._exit(0)
"""

_LIMITS = {
    "RLIMIT_CPU": CPU_SECONDS,
    "RLIMIT_AS": MEMORY_BYTES,
    "RLIMIT_FSIZE": FILE_BYTES,
    "RLIMIT_NOFILE": OPEN_FILES,
    "RLIMIT_NPROC": 0,
    "RLIMIT_CORE": 0,
}


def run_code(job: CodeJob, timeout_s: float = WALL_TIMEOUT_S) -> CodeRun:
    """Run ``job`` in a separate limited process (module docstring) and say how it did."""
    nonce = f"result-{secrets.token_hex(8)}:"
    payload = {**job.model_dump(mode="json"), "nonce": nonce, "limits": _LIMITS}
    with tempfile.TemporaryDirectory(prefix="mcp-infra-answer-") as folder:
        out_path = Path(folder) / "out.txt"
        with out_path.open("wb") as out:
            child = subprocess.Popen(  # noqa: S603  argv list, fixed interpreter and harness
                [sys.executable, "-I", "-S", "-c", HARNESS],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env={},
                start_new_session=True,
            )
            try:
                child.communicate(json.dumps(payload).encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                return _outcome(job, 0, f"timed out after {timeout_s:g} s")
            finally:
                _kill_group(child)
        text = out_path.read_bytes()[-64_000:].decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if line.startswith(nonce):
            try:
                found = json.loads(line[len(nonce) :])
                return _outcome(job, int(found["passed"]), str(found["detail"]))
            except (ValueError, KeyError, TypeError):
                break
    return _outcome(job, 0, f"the process ended without a result (exit code {child.returncode})")


def _outcome(job: CodeJob, passed: int, detail: str) -> CodeRun:
    return CodeRun(
        digest=job.digest,
        passed=min(passed, len(job.tests)),
        total=len(job.tests),
        detail=detail[:500],
    )


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (it leads its own session) and reap the child."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def with_code_run(sample: Sample) -> Sample:
    """A quality sample of a code task, with its code run against the task's tests (the sample
    as it is for any other task, a failed request, or a reply with no code to run)."""
    spec = TASKS.get(sample.prompt_id)
    if spec is None or not isinstance(spec.answer, CodeAnswer) or sample.error is not None:
        return sample
    reply = reply_text(sample.text)
    job = code_job(spec.answer, reply)[0] if reply is not None else None
    if job is None:
        return sample
    return sample.model_copy(update={"code_run": run_code(job)})
