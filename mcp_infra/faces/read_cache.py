"""The `registry` tool's answer, kept while nothing it depends on has changed.

`registry` is the costliest read (manifests, policy, host facts, a preflight per candidate, what
past cycles learned) and an agent calls it over and over. Its answer is kept keyed by the
identity, size and modification time of every file and folder it reads (shipped and home
manifests and policies, the home's config, service record, memory and evidence, the model and
hub cache folders, the projection cache, the runtime environments' locks, the import path for
installed versions). Host facts that drift without a file changing (free memory and disk) are
refreshed in the background once ``ttl`` seconds have passed, the kept answer served meanwhile.
A server computes the whole registry as it starts (``ReadCache.warm``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from mcp_infra.state.artifacts import hub_cache
from mcp_infra.state.datafiles import shipped_dir
from mcp_infra.state.store import Home

T = TypeVar("T")
Stamp = tuple[tuple[str, int, int, int], ...]


def _stamps(paths: Iterable[Path]) -> Stamp:
    out = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            out.append((str(path), 0, 0, 0))
            continue
        out.append((str(path), info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(out)


def _listing(folder: Path) -> list[Path]:
    try:
        return [folder, *sorted(folder.iterdir())]
    except OSError:
        return [folder]


def registry_inputs(home: Home) -> Stamp:
    """Everything `registry` reads, as (path, inode, size, mtime) stamps."""
    paths: list[Path] = []
    for folder in (
        shipped_dir("registry"),
        shipped_dir("policy"),
        home.user_registry,
        home.user_policy,
        home.memory,
        home.models,
        home.hf_cache,
        hub_cache(),
        home.projections,  # a projection computed in the background lands here
    ):
        paths += _listing(folder)
    for runtime in _listing(home.runtimes)[1:]:  # a runtime environment built or removed
        paths += [runtime / "lock.json", runtime / "env"]
    paths += [home.config, home.service_file, home.evidence]
    paths += [Path(entry or ".") for entry in sys.path]
    return _stamps(paths)


class ReadCache:
    """One cached answer per key. A change in the inputs' stamps recomputes it before the answer;
    past ``ttl`` with the same stamps (host facts that drift without a file changing) the kept
    answer is served and one refresh runs in the background, so a polling client never waits for
    a recomputation that no file asked for. One computation per key at a time: a caller that
    finds one running waits for it and takes its answer."""

    def __init__(self, ttl: float = 10.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[object, tuple[Stamp, float, object]] = {}
        self._flights: dict[object, threading.Lock] = {}

    def get(self, key: object, inputs: Stamp, compute: Callable[[], T]) -> T:
        with self._lock:
            hit = self._entries.get(key)
        if hit is None or hit[0] != inputs:
            return self._compute(key, inputs, compute)
        if time.monotonic() - hit[1] >= self.ttl:
            self._in_background(key, lambda: inputs, compute)
        return hit[2]  # type: ignore[return-value]

    def warm(
        self,
        key: object,
        inputs: Callable[[], Stamp],
        compute: Callable[[], T],
        then: Callable[[], None] | None = None,
    ) -> None:
        """Compute ``key`` in the background now (a server that has just started), so the first
        call of a session finds it kept; a call that comes first waits for this computation.
        ``then`` runs after it on the same thread (more warming that must not compete with
        it)."""
        self._in_background(key, inputs, compute, then)

    def _flight(self, key: object) -> threading.Lock:
        with self._lock:
            return self._flights.setdefault(key, threading.Lock())

    def _compute(self, key: object, inputs: Stamp, compute: Callable[[], T]) -> T:
        with self._flight(key):
            with self._lock:
                hit = self._entries.get(key)
            if hit is not None and hit[0] == inputs and time.monotonic() - hit[1] < self.ttl:
                return hit[2]  # type: ignore[return-value]  # what the flight waited for made
            started = time.monotonic()
            value = compute()
            with self._lock:
                self._entries[key] = (inputs, started, value)
            return value

    def _in_background(
        self,
        key: object,
        inputs: Callable[[], Stamp],
        compute: Callable[[], object],
        then: Callable[[], None] | None = None,
    ) -> None:
        if self._flight(key).locked():
            return  # a computation of this key is running: its answer will be kept

        def run() -> None:
            try:
                self._compute(key, inputs(), compute)
            except Exception:  # noqa: BLE001  the next call computes in the open and says why
                with self._lock:
                    self._entries.pop(key, None)
            if then is not None:
                then()

        threading.Thread(target=run, name="read-cache", daemon=True).start()
