"""Launch templates and real server processes: argv only, own session, never kill a stranger."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import httpx2
import psutil
import pytest

from mcp_infra.contracts import Knobs, Recipe
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import (
    PortBusy,
    ServerStartError,
    build_argv,
    free_port,
    is_running,
    port_open,
    start_server,
    stop_server,
    wait_ready,
)
from mcp_infra.procs.service import start_candidate, stop_candidate
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, write_model
from tests.helpers.faultkit import stranger as start_stranger
from tests.helpers.run import Spawn

PY = "/usr/bin/python3"


def recipe(**knobs: object) -> Recipe:
    return Recipe(
        candidate_id="demo-tiny:x",
        template="mlx_lm_server",
        model_path="/m/target",
        draft_path="/m/draft",
        knobs=Knobs(**knobs),
    )


def test_mlx_lm_template_turns_typed_knobs_into_argv() -> None:
    argv = build_argv(
        recipe(
            draft=True,
            num_draft_tokens=4,
            prompt_cache_size=0,
            kv_bits=8,
            quantized_kv_start=0,
            prefill_step_size=512,
        ),
        port=18123,
        python=PY,
    )
    assert argv == [
        PY,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        "/m/target",
        "--host",
        "127.0.0.1",
        "--port",
        "18123",
        "--draft-model",
        "/m/draft",
        "--num-draft-tokens",
        "4",
        "--kv-bits",
        "8",
        "--quantized-kv-start",
        "0",
        "--prefill-step-size",
        "512",
        "--prompt-cache-size",
        "0",
    ]


def test_templates_refuse_what_they_cannot_express() -> None:
    with pytest.raises(ValueError, match="127.0.0.1"):
        build_argv(recipe(), port=18123, host="0.0.0.0")
    with pytest.raises(ValueError, match="port"):
        build_argv(recipe(), port=80)
    with pytest.raises(ValueError, match="draft_block_size"):
        build_argv(recipe(draft_block_size=4), port=18123)
    with pytest.raises(ValueError, match="draft path"):
        build_argv(recipe(draft=True).model_copy(update={"draft_path": None}), port=18123)


def test_knobs_are_typed_so_no_text_can_reach_argv() -> None:
    with pytest.raises(ValueError):
        Knobs(num_draft_tokens="4; rm -rf /")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Knobs(extra_args=["--trust-remote-code"])  # type: ignore[call-arg]


def test_a_stranger_on_the_port_is_refused_and_left_alone(tmp_path: Path) -> None:
    port = free_port()
    stranger = start_stranger(port)
    try:
        with pytest.raises(PortBusy):
            start_server(recipe(), port=port, role="stable", log_path=tmp_path / "log")
        assert stranger.poll() is None  # still alive: refused, never killed
    finally:
        stranger.kill()
        stranger.wait()


def test_server_that_ignores_term_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    code = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(120)"
    )
    argv = [sys.executable, "-c", code]
    record, proc = start_server(
        recipe(), port=free_port(), role="candidate", log_path=tmp_path / "log", argv=argv
    )
    for _ in range(100):
        if (tmp_path / "log").read_text().strip() == "up":
            break
        time.sleep(0.05)
    started = time.monotonic()
    assert stop_server(record, grace=1.0) == "killed (ignored TERM)"
    assert time.monotonic() - started >= 1.0
    assert not is_running(record)
    proc.wait(timeout=5)


def test_a_recycled_pid_is_not_mistaken_for_our_server(tmp_path: Path) -> None:
    record, proc = start_server(
        recipe(),
        port=free_port(),
        role="candidate",
        log_path=tmp_path / "log",
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
    )
    try:
        impostor = record.model_copy(update={"create_time": record.create_time - 100})
        assert is_running(record) and not is_running(impostor)
        assert stop_server(impostor) == "not running"  # a different start time: untouched
        assert is_running(record)
    finally:
        stop_server(record, grace=2)
        proc.wait(timeout=5)


def test_server_that_cannot_load_its_model_fails_fast_with_the_reason(
    tmp_path: Path, spawn: Spawn
) -> None:
    """A real mlx_lm.server process (`spawn` marks the test slow and stops it if it hangs)."""
    bad = recipe().model_copy(update={"model_path": str(tmp_path / "no-such-model")})
    record, proc = start_server(
        bad, port=free_port(), role="candidate", log_path=tmp_path / "l", hf_cache=tmp_path / "hf"
    )
    try:
        with pytest.raises(ServerStartError, match="cannot serve: HTTP 404"):
            wait_ready(record, timeout=60)
    finally:
        stop_server(record, grace=5)
        proc.wait(timeout=5)


def test_real_mlx_server_starts_answers_and_stops(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    target = Recipe(
        candidate_id="demo-tiny:target",
        template="mlx_lm_server",
        model_path=str(demo_models["target"]),
    )
    port = free_port()
    record, proc = start_server(
        target, port=port, role="stable", log_path=tmp_path / "log", hf_cache=tmp_path / "hf"
    )
    try:
        waited = wait_ready(record, timeout=120)
        assert 0 < waited <= 120 and port_open(port)
        health = httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert health.status_code == 200, "ready means the server answers its health check"
        messages = [{"role": "user", "content": "hello"}]
        sample = bench.stream_chat(
            f"http://127.0.0.1:{port}",
            messages,
            max_tokens=16,
            timeout=60,
            labels=bench.Labels("baseline", "p"),
        )
        assert sample.error is None and sample.completion_tokens == 16
        assert sample.decode_tps and sample.decode_tps > 0 and sample.ttft_s is not None
        greedy = bench.greedy_chat(
            f"http://127.0.0.1:{port}",
            messages,
            max_tokens=16,
            timeout=60,
            candidate="baseline",
            prompt_id="p",
        )
        assert greedy.token_ids is not None and len(greedy.token_ids) == 16
        again = bench.greedy_chat(
            f"http://127.0.0.1:{port}",
            messages,
            max_tokens=16,
            timeout=60,
            candidate="baseline",
            prompt_id="p",
        )
        assert again.token_ids == greedy.token_ids  # greedy is deterministic
    finally:
        assert stop_server(record, grace=10) == "stopped (TERM)"
        proc.wait(timeout=5)
    assert not port_open(port)


def test_measurement_order_is_seeded_and_complete() -> None:
    order = bench.measurement_order(["a", "b", "c"], repeats=3, seed=7)
    assert order == bench.measurement_order(["a", "b", "c"], repeats=3, seed=7)
    assert sorted(order) == sorted((r, p) for r in range(3) for p in "abc")
    assert order != bench.measurement_order(["a", "b", "c"], repeats=3, seed=8)


def test_stream_chat_reports_an_unreachable_server_as_an_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sample = bench.stream_chat(
        f"http://127.0.0.1:{port}",
        [{"role": "user", "content": "x"}],
        max_tokens=4,
        timeout=2,
        labels=bench.Labels("c", "p"),
    )
    assert sample.error and sample.decode_tps is None


def test_server_that_crashes_on_start_is_reported_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('bad flag', flush=True); sys.exit(2)"]
    record, proc = start_server(
        recipe(), port=free_port(), role="candidate", log_path=tmp_path / "l", argv=argv
    )
    with pytest.raises(ServerStartError, match="exited before it was ready.*bad flag"):
        wait_ready(record, timeout=30)
    proc.wait(timeout=5)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity (macOS)")
def test_a_home_that_sets_server_cpus_keeps_every_server_thread_on_them(home: Home) -> None:
    """The demo keeps each server on one CPU (``ServiceConfig.server_cpus``): every thread of
    the real server, the worker threads made after the start included, stays on the last CPU,
    and the process record says which; a home that sets none leaves the server on all."""
    config = load_config(home)
    write_model(home.config, config.model_copy(update={"server_cpus": 1}))
    last = sorted(os.sched_getaffinity(0))[-1:]
    record = start_candidate(home, config.baseline, config, cycle_id="c-pin", timeout=120)
    try:
        assert record.cpus == last
        threads = [t.id for t in psutil.Process(record.pid).threads()]
        assert len(threads) > 1  # the model's worker threads exist once it answered
        assert {tuple(sorted(os.sched_getaffinity(t))) for t in threads} == {tuple(last)}
    finally:
        stop_candidate(home, record)
    write_model(home.config, config)
    free = start_candidate(home, config.baseline, config, cycle_id="c-free", timeout=120)
    try:
        assert free.cpus is None
        assert os.sched_getaffinity(free.pid) == os.sched_getaffinity(0)
    finally:
        stop_candidate(home, free)
