"""Greedy answers with top log-probabilities from a real mlx_lm.server, and the lossy budget's
continuous measure on them (the demo's tiny models: their gibberish passes no task, so only the
measure means anything here).

Slow: real servers on the demo models (the ``demo_models`` fixture), one at a time.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    EffectiveThresholds,
    Knobs,
    QualityBudget,
    QualityBudgets,
    Recipe,
    Sample,
    Semantics,
)
from mcp_infra.core.budget import QualityOutputs, Resampling, lossy_gates
from mcp_infra.core.fidelity import TOP_LOGPROBS, top_token
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import free_port, start_server, stop_server, wait_ready
from mcp_infra.procs.sandbox import with_code_run
from mcp_infra.state.catalog import load_suite

TOKENS = 16
THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5.0,
    max_peak_memory_gb=16.0,
    max_error_rate=0.0,
    worst_prompt_tolerance_pct=10.0,
    quality_budget=QualityBudgets(
        classes={CandidateClass.KV_CACHE: QualityBudget(min_identical_share=0.0, max_mean_kl=50)}
    ),
)
DRAWS = Resampling(level=0.95, resamples=400, seed=5)


@contextmanager
def serving(tmp_path: Path, recipe: Recipe, name: str) -> Iterator[str]:
    port = free_port()
    record, proc = start_server(
        recipe, port=port, role="candidate", log_path=tmp_path / f"{name}.log", hf_cache=tmp_path
    )
    try:
        wait_ready(record, timeout=180)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(record, grace=10)
        proc.wait(timeout=10)


def answers(url: str, cid: str, top: int = TOP_LOGPROBS) -> tuple[list[Sample], list[Sample]]:
    """(greedy passes over the demo suite's short selection prompts, three quality tasks). The
    long-context prompt is left out: its 2,491-token prefill takes the demo target about 27 s
    on this CPU (MLX's attention on a CPU grows with the square of the prompt), five times
    here, and the measure reads the answers, not the prompt's length."""
    suite = load_suite("demo-speed").prompts
    speed = [p for p in suite if p.split == "selection" and p.prompt_class != "long_context"]
    tasks = load_suite("quality").prompts[::12]
    greedy = [
        bench.greedy_chat(
            url,
            p.chat_messages(),
            max_tokens=TOKENS,
            timeout=120,
            candidate=cid,
            prompt_id=p.id,
            top_logprobs=top,
        )
        for p in speed
    ]
    quality = [
        with_code_run(
            bench.greedy_chat(
                url,
                p.chat_messages(),
                max_tokens=TOKENS,
                timeout=120,
                candidate=cid,
                prompt_id=p.id,
                phase="quality",
                top_logprobs=top,
            )
        )
        for p in tasks
    ]
    return greedy, quality


def run_of(cid: str, got: tuple[list[Sample], list[Sample]], knobs: Knobs) -> CandidateRun:
    return CandidateRun(
        candidate=cid,
        candidate_class=CandidateClass.KV_CACHE if cid != "baseline" else None,
        semantics=Semantics.LOSSY if cid != "baseline" else Semantics.LOSSLESS,
        knobs=knobs,
        greedy=got[0],
        samples=got[1],
    )


def test_a_kv8_and_a_4bit_candidate_get_the_measure_with_logprobs_from_a_real_server(
    tmp_path: Path, demo_models: dict[str, Path]
) -> None:
    target = str(demo_models["target"])
    base_recipe = Recipe(
        candidate_id="demo-tiny:target", template="mlx_lm_server", model_path=target
    )
    kv8 = Knobs(kv_bits=8, quantized_kv_start=0)
    q4_dir = tmp_path / "target-q4"
    subprocess.run(  # noqa: S603  a fixed argv: the 4-bit build of the demo target
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", target, "--mlx-path", str(q4_dir)]
        + ["-q", "--q-bits", "4", "--q-group-size", "32"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with serving(tmp_path, base_recipe, "baseline") as url:
        base = answers(url, "baseline")
        plain = answers(url, "baseline", top=0)  # the same prompts, token ids alone
        again = answers(url, "baseline")
    with serving(tmp_path, base_recipe.model_copy(update={"knobs": kv8}), "kv8") as url:
        kv = answers(url, "t:kv8")
    with serving(tmp_path, base_recipe.model_copy(update={"model_path": str(q4_dir)}), "q4") as url:
        q4 = answers(url, "t:q4")

    for with_top, alone in zip(base[0] + base[1], plain[0] + plain[1], strict=True):
        assert with_top.error is None and with_top.top_logprobs, with_top.error
        assert alone.top_logprobs is None and alone.token_ids
        # mlx_lm.server lists the top tokens in place of the chosen one: the most likely of
        # each list is the token greedy decoding chose, as the plain request says.
        assert with_top.token_ids == alone.token_ids
        assert [top_token(t) for t in with_top.top_logprobs] == with_top.token_ids
        assert all(len(t) == TOP_LOGPROBS for t in with_top.top_logprobs)

    baseline = run_of("baseline", base, Knobs())
    same = lossy_gates(baseline, run_of("t:again", again, Knobs()), THRESHOLDS, DRAWS, None)[0]
    assert same.measure is not None and same.measure.identical_share.value == 1.0
    assert same.measure.mean_kl is not None and same.measure.mean_kl.value == 0.0

    figures = {}
    for cid, got, knobs in (("t:kv8", kv, kv8), ("t:q4", q4, Knobs())):
        outputs = QualityOutputs(base[1], got[1])
        agreement, quality = lossy_gates(
            baseline, run_of(cid, got, knobs), THRESHOLDS, DRAWS, outputs
        )
        m = agreement.measure
        assert m is not None and agreement.budget is not None, agreement.detail
        assert m.pairs == len(base[0]) + len(base[1]) and m.unit == "tokens"
        assert m.mean_kl is not None and m.top_agreement is not None and m.top_k == TOP_LOGPROBS
        assert m.positions >= m.pairs and m.mean_kl.low <= m.mean_kl.value <= m.mean_kl.high
        assert quality.tasks is not None and len(quality.tasks) == len(base[1])
        assert "nats" in agreement.detail and "intervals over" in agreement.detail
        figures[cid] = (m.identical_share.value, m.prefix_length.value, m.mean_kl.value)
    assert figures["t:q4"][2] > 0, "a 4-bit build of random weights moves the distributions"
    print(f"identical share, shared prefix, mean KL: {figures}")
