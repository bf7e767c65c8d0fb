"""Projections a fast read asked for (``projection.plan_cost(wait=False)``), computed each key
once in a child process at low priority.

A projection is seconds of pure Python. In a thread of the MCP server it held the interpreter
lock against every read the server answered meanwhile, and a read that does file I/O gives the
lock up at each call and waits up to the interpreter's switch interval (5 ms) to get it back:
a session's first `status` took 263-394 ms while the first `registry` projected its candidates
(docs/benchmarks.md). A child process shares no lock with the server, and at a lower priority
(``NICE``) it gives the CPU to the live service and the server first on a busy machine.

The child (``python -m mcp_infra.flows.projection JOBS``) reads the jobs, computes each and
keeps it in the home's projection cache (``projection.keep_projection``); a job the child left
without an answer (it exited with an error, or ran past ``BATCH_TIMEOUT_S``) is kept as a
projection that failed, with the reason, so a read never waits on it forever; one stopped by a
signal is asked again by the next read.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

from mcp_infra.contracts import FrozenPlan, PlanCost, Policy, Recipe
from mcp_infra.contracts.base import Contract, Part
from mcp_infra.state.store import private_dir, write_model

NICE = 10
"""How much lower than the server the child runs (``os.nice``, in ``projection.main``)."""

BATCH_TIMEOUT_S = 600.0
"""The longest one child may take over its jobs before it is killed."""


class ProjectionJob(Part):
    """One projection to compute and where to keep it: ``projection.project_cost``'s arguments."""

    path: str
    bundles: list[str]
    plan: FrozenPlan
    policy: Policy
    live_recipe: str
    mode: Literal["concurrent", "exclusive"]
    recipes: dict[str, Recipe]
    seeds: int
    answers_kept: bool = False  # the live configuration's greedy pass is kept (core.reference)


class ProjectionJobs(Contract):
    """The file a child is handed: the jobs it computes, in order."""

    jobs: list[ProjectionJob]


def failed_projection(job: ProjectionJob, why: str) -> PlanCost:
    """A projection that could not be made, as the read shows it."""
    return PlanCost(
        basis="unknown",
        why=f"the projection failed: {why}"[:1000],
        configurations=job.plan.candidates,
        mode=job.mode,
    )


def run_batch(jobs: list[ProjectionJob]) -> None:
    """Compute ``jobs`` in one child process and wait for it (the wait holds no lock)."""
    with tempfile.TemporaryDirectory(prefix="mcp-infra-projection-") as tmp:
        listing = Path(tmp) / "jobs.json"
        write_model(listing, ProjectionJobs(jobs=jobs))
        argv = [sys.executable, "-m", "mcp_infra.flows.projection", str(listing)]
        try:
            done = subprocess.run(  # noqa: S603  a fixed argv: this interpreter, this module
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # an MCP server's stdout is its wire
                stderr=subprocess.PIPE,
                timeout=BATCH_TIMEOUT_S,
                check=False,
            )
            if done.returncode < 0:
                return  # stopped by a signal (the server exiting, a kill): the next read asks again
            why = (
                f"its process exited with code {done.returncode}: "
                + done.stderr.decode(errors="replace").strip()[-300:]
            )
        except subprocess.TimeoutExpired:
            why = f"its process ran past {BATCH_TIMEOUT_S:.0f} s and was stopped"
        except OSError as exc:
            why = f"its process could not start: {exc}"
    for job in jobs:
        path = Path(job.path)
        if not path.exists():
            with contextlib.suppress(OSError):
                private_dir(path.parent)
                write_model(path, failed_projection(job, why))


class Background:
    """One thread that hands the projections reads asked for to child processes, each key once:
    what is queued when a child starts goes to that child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, ProjectionJob]] = queue.Queue()
        self._keys: set[str] = set()
        self._thread: threading.Thread | None = None

    def submit(self, key: str, job: ProjectionJob) -> None:
        with self._lock:
            if key in self._keys:
                return
            self._keys.add(key)
            self._queue.put((key, job))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="projections", daemon=True)
                self._thread.start()

    def _take(self) -> list[tuple[str, ProjectionJob]]:
        """What is queued, waiting up to 5 s for a first job; empty: the thread may end."""
        try:
            batch = [self._queue.get(timeout=5.0)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                batch.append(self._queue.get_nowait())
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                run_batch([job for _, job in batch])
            finally:
                with self._lock:
                    self._keys.difference_update(key for key, _ in batch)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until every submitted projection is done (tests, and a process about to exit)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._keys:
                    return True
            time.sleep(0.02)
        return False


BACKGROUND = Background()
