"""The read cache of the `registry` tool (faces.read_cache): a changed input recomputes before the
answer, an expired answer is served while one refresh runs in the background, one computation
per key at a time, a server's warm-up is what its first call gets, and a failed refresh is said
by the next call."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mcp_infra.faces.read_cache import ReadCache, registry_inputs
from mcp_infra.state.store import Home


class Counted:
    """A computation that counts its runs, returns the count, and can be held or made to fail."""

    def __init__(self) -> None:
        self.runs = 0
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def __call__(self) -> int:
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("a file of the home does not load")
        self.runs += 1
        return self.runs


def wait_until(check, seconds: float = 5.0) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


A, B = (("a", 1, 1, 1),), (("a", 1, 2, 2),)


def test_a_changed_input_is_recomputed_before_the_answer() -> None:
    cache, compute = ReadCache(ttl=60), Counted()
    assert cache.get("k", A, compute) == 1
    assert cache.get("k", A, compute) == 1  # kept
    assert cache.get("k", B, compute) == 2  # a file changed: the answer waits for it
    assert cache.get("other", B, compute) == 3  # keys are apart


def test_an_expired_answer_is_served_while_one_refresh_runs() -> None:
    cache, compute = ReadCache(ttl=0.05), Counted()
    assert cache.get("k", A, compute) == 1
    time.sleep(0.06)
    compute.release.clear()  # the refresh is held
    started = time.monotonic()
    assert [cache.get("k", A, compute) for _ in range(5)] == [1] * 5  # kept, not waited for
    assert time.monotonic() - started < 1.0
    compute.release.set()
    wait_until(lambda: compute.runs == 2)
    wait_until(lambda: cache.get("k", A, compute) == 2)
    assert compute.runs == 2  # five expired reads, one refresh


def test_callers_of_one_key_share_one_computation() -> None:
    cache, compute = ReadCache(ttl=60), Counted()
    compute.release.clear()
    got: list[int] = []
    callers = [
        threading.Thread(target=lambda: got.append(cache.get("k", A, compute))) for _ in range(4)
    ]
    for t in callers:
        t.start()
    time.sleep(0.1)
    compute.release.set()
    for t in callers:
        t.join(10)
    assert got == [1, 1, 1, 1] and compute.runs == 1


def test_the_first_call_takes_what_the_warm_up_computed() -> None:
    cache, compute = ReadCache(ttl=60), Counted()
    compute.release.clear()
    cache.warm("k", lambda: A, compute)
    wait_until(lambda: cache._flight("k").locked())
    compute.release.set()
    assert cache.get("k", A, compute) == 1  # waited for the warm-up, did not compute again
    assert compute.runs == 1


def test_a_failed_refresh_is_said_by_the_next_call() -> None:
    cache, compute = ReadCache(ttl=0.05), Counted()
    assert cache.get("k", A, compute) == 1
    time.sleep(0.06)
    compute.fail = True
    assert cache.get("k", A, compute) == 1  # the refresh fails in the background...
    wait_until(lambda: not cache._flight("k").locked() and "k" not in cache._entries)
    with pytest.raises(RuntimeError, match="does not load"):
        cache.get("k", A, compute)  # ...and the next call computes in the open


def test_the_registry_inputs_see_a_manifest_added_to_the_home(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    before = registry_inputs(home)
    assert registry_inputs(home) == before
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "mine.yaml").write_text("schema_version: 1\n")
    assert registry_inputs(home) != before
