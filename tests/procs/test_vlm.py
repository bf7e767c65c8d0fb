"""The `mlx_vlm_server` launch template: its argv for every DFlash2 variant, every flag it emits
checked against the real `mlx_vlm.server --help`, and one real mlx_vlm.server started through it
on the demo's tiny text-only Qwen3 target, measured by the same benchmark code as mlx_lm.server.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import httpx2 as httpx
import psutil
import pytest

from mcp_infra.contracts import Knobs, Recipe
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import (
    LOOPBACK,
    build_argv,
    free_port,
    log_tail,
    start_server,
    stop_server,
)
from mcp_infra.state.artifacts import resolve_recipe, snapshot_path
from mcp_infra.state.catalog import load_registry
from tests.helpers.run import Spawn

DFLASH2 = "qwen38-dflash2-v1"
TARGET = ("mlx-community/Qwen3.8-27B-4bit", "3e6447f082e89cc7f0bc6e5441afd38dfce760ff")
DRAFT = ("z-lab/Qwen3.8-27B-DFlash2", "50307d4c4cde6860d4eee73e2547cd786fe8e8a4")


def test_argv_of_every_dflash2_variant(hf_cache: Path, tmp_path: Path) -> None:
    manifest = load_registry()[DFLASH2]
    target, draft = snapshot_path(hf_cache, *TARGET), snapshot_path(hf_cache, *DRAFT)
    head = [
        "/py",
        "-m",
        "mlx_vlm.server",
        "--model",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        "18123",
        "--draft-model",
        str(draft),
        "--draft-kind",
        "dflash",
    ]
    expected = {
        "dflash-native": head,  # no --draft-block-size: the drafter's configured one is used
        "dflash-b3": [*head, "--draft-block-size", "3"],
        "dflash-b4": [*head, "--draft-block-size", "4"],
        "dflash-b5": [*head, "--draft-block-size", "5"],
        "dflash-b6": [*head, "--draft-block-size", "6"],
    }
    got = {
        v.id: build_argv(
            resolve_recipe(manifest, v, tmp_path / "models", tmp_path / "none"), 18123, python="/py"
        )
        for v in manifest.variants
    }
    assert got == expected


def test_kv_cache_knobs_and_refusals() -> None:
    recipe = Recipe(
        candidate_id="x:kv",
        template="mlx_vlm_server",
        model_path="/m",
        knobs=Knobs(
            kv_bits=4,
            kv_group_size=64,
            quantized_kv_start=0,
            max_kv_size=4096,
            prefill_step_size=512,
        ),
    )
    assert build_argv(recipe, 18000, python="/py")[9:] == [
        "--kv-bits",
        "4",
        "--kv-group-size",
        "64",
        "--quantized-kv-start",
        "0",
        "--max-kv-size",
        "4096",
        "--prefill-step-size",
        "512",
    ]
    for bad in (
        Knobs(num_draft_tokens=2),
        Knobs(prompt_cache_size=0),
        Knobs(draft_block_size=4),
        Knobs(draft=True),
    ):
        with pytest.raises(ValueError):
            build_argv(recipe.model_copy(update={"knobs": bad}), 18000, python="/py")
    with pytest.raises(ValueError, match="127.0.0.1"):
        build_argv(recipe, 18000, host="0.0.0.0")


def test_every_flag_the_template_emits_is_a_real_mlx_vlm_server_flag(
    tmp_path: Path, spawn: Spawn
) -> None:
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is in the dev and vlm extras")
    result = spawn.run([sys.executable, "-m", "mlx_vlm.server", "--help"], timeout=120)
    assert result.returncode == 0, result.stderr
    help_text = result.stdout
    real = set(re.findall(r"--[a-z][a-z-]+", help_text))
    recipe = Recipe(
        candidate_id="x:all",
        template="mlx_vlm_server",
        model_path="/m",
        draft_path="/d",
        knobs=Knobs(
            draft=True,
            draft_kind="dflash",
            draft_block_size=4,
            kv_bits=8,
            kv_group_size=64,
            quantized_kv_start=0,
            max_kv_size=4096,
            prefill_step_size=512,
        ),
    )
    emitted = {a for a in build_argv(recipe, 18000, python="/py") if a.startswith("--")}
    assert emitted <= real, emitted - real
    assert "{dflash,eagle3,mtp}" in help_text


def _wait_loaded(base: str, record, timeout: float = 90.0) -> str:
    """mlx_vlm.server's /health answers only once the model is loaded, and names it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert psutil.pid_exists(record.pid), log_tail(record.log_path)
        model = bench.served_model(base, timeout=2)
        if model:
            return model
        time.sleep(0.25)
    raise AssertionError(f"not ready: {log_tail(record.log_path)}")


def test_a_real_mlx_vlm_server_through_the_template_measured_by_bench(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is in the dev and vlm extras")
    recipe = Recipe(
        candidate_id="demo-tiny:target-vlm",
        template="mlx_vlm_server",
        model_path=str(demo_models["target"]),
    )
    port = free_port()
    record, proc = start_server(
        recipe, port=port, role="candidate", log_path=tmp_path / "vlm.log", hf_cache=tmp_path / "hf"
    )
    try:
        assert record.argv[3:9] == [
            "--model",
            str(demo_models["target"]),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ]
        base = f"http://{LOOPBACK}:{port}"
        assert _wait_loaded(base, record) == str(demo_models["target"])
        # bound to loopback only (mlx_vlm.server's own default is 0.0.0.0)
        listening = [
            c.laddr
            for c in psutil.Process(record.pid).net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(addr.ip == LOOPBACK for addr in listening)
        messages = [{"role": "user", "content": "Say something about the sea."}]
        streamed = [
            bench.stream_chat(
                base,
                messages,
                max_tokens=16,
                timeout=60,
                labels=bench.Labels(recipe.candidate_id, "sea", r),
            )
            for r in range(2)
        ]
        for sample in streamed:
            assert sample.error is None, sample.error
            assert sample.completion_tokens == 16 and sample.prompt_tokens
            assert sample.ttft_s and sample.ttft_s > 0
            assert sample.decode_tps and sample.decode_tps > 0
        greedy = bench.greedy_chat(
            base,
            messages,
            max_tokens=16,
            timeout=60,
            candidate=recipe.candidate_id,
            prompt_id="sea",
        )
        assert greedy.error is None, greedy.error
        assert greedy.completion_tokens == 16
        # its logprobs carry no token ids: the lossless gate then compares texts
        assert greedy.token_ids is None
        # greedy is deterministic; the non-streamed answer comes with its whitespace stripped
        assert streamed[0].text == streamed[1].text
        assert greedy.text == streamed[0].text.strip()
        # without the model name mlx_vlm.server refuses the request: bench sends it
        bare = httpx.post(
            f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=30
        )
        assert bare.status_code == 422
    finally:
        assert stop_server(record, grace=5).startswith("stopped")
        proc.wait(timeout=10)
