"""Measure the demo target/draft pair per setting, outside any cycle, and print one table.

What: the demo claims that speculative decoding with the built draft is faster and lossless with
the prompt cache off, that the server's default prompt cache breaks losslessness with a draft
(mlx-lm 0.32.2), and that KV-cache quantization is lossy. Every setting is a typed `Knobs` served
through the product's own launch template (`runtime`), measured by the product's own client
(`bench`) on the `demo-speed` suite, so the figures are comparable with a cycle's.

Target: the drafts faster than the target with the cache off and greedy-identical to it; the
default cache with a draft and the KV-cache bits not identical (printed, not judged).
Takes: ten servers (K = 2, 4, 6) started one at a time, then --runs rounds over all of them.
--smoke: the target and K=2 with the cache off, one round of 8-token answers (about 35 s).

    .venv/bin/python benchmarks/demo_speedup.py [--runs 5] [--rounds 2] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common

from mcp_infra.contracts import Knobs, ProcessRecord, Recipe
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.demo.models import build_demo_models
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import free_port, start_server, stop_server, wait_ready
from mcp_infra.state.catalog import load_suite


@dataclass
class Setting:
    name: str
    knobs: Knobs
    record: ProcessRecord | None = None
    startup_s: float = 0.0
    tps: list[float] = field(default_factory=list)
    identical: int = 0
    total: int = 0
    error: str = ""


def settings(ks: list[int]) -> list[Setting]:
    out = [Setting("target (cache off)", Knobs(prompt_cache_size=0))]
    out += [
        Setting(
            f"draft K={k} (cache off)", Knobs(draft=True, num_draft_tokens=k, prompt_cache_size=0)
        )
        for k in ks
    ]
    out.append(Setting("target (default cache)", Knobs()))
    out += [
        Setting(f"draft K={k} (default cache)", Knobs(draft=True, num_draft_tokens=k)) for k in ks
    ]
    out += [
        Setting(
            f"kv-bits {b} (cache off)", Knobs(kv_bits=b, quantized_kv_start=0, prompt_cache_size=0)
        )
        for b in (8, 4)
    ]
    return out


@dataclass(frozen=True)
class Setup:
    """How every setting is measured: the models, the prompts, the answer length, the greedy
    checks of each prompt and the timed rounds over them."""

    work: Path
    paths: dict[str, Path]
    prompts: list[SuitePrompt]
    max_tokens: int
    rounds: int
    runs: int


def _parser() -> argparse.ArgumentParser:
    ap = _common.parser(__doc__)
    ap.add_argument("--runs", type=int, default=5, help="timed rounds over the suite per setting")
    ap.add_argument("--rounds", type=int, default=2, help="greedy checks of each prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    return ap


def start_setting(s: Setting, setup: Setup, candidate_id: str) -> bool:
    """Start the setting's server and time its startup alone; False (and ``s.error``) if it
    never became ready."""
    recipe = Recipe(
        candidate_id=candidate_id,
        template="mlx_lm_server",
        model_path=str(setup.paths["target"]),
        draft_path=str(setup.paths["draft"]),
        knobs=s.knobs,
    )
    s.record, _ = start_server(
        recipe,
        port=free_port(),
        role="candidate",
        log_path=setup.work / f"{s.name}.log",
        hf_cache=setup.work / "hf",
    )
    try:
        s.startup_s = wait_ready(s.record, timeout=120)
    except Exception as exc:  # one broken setting is a finding, not the end
        s.error = str(exc).splitlines()[0][:80]
        return False
    return True


def check_greedy(s: Setting, setup: Setup, reference: dict[str, list[int] | None]) -> None:
    """Warm the server up, then compare its greedy ids with the reference's (the first
    setting's, recorded on the way)."""
    assert s.record is not None
    url = f"http://127.0.0.1:{s.record.port}"
    for p in setup.prompts:  # a warm server whose default cache holds the template prefix
        bench.stream_chat(
            url,
            [m.model_dump() for m in p.messages],
            max_tokens=setup.max_tokens,
            timeout=120,
            labels=bench.Labels(s.name, p.id, phase="warmup"),
        )
    for _ in range(setup.rounds):
        for p in setup.prompts:
            ids = bench.greedy_chat(
                url,
                [m.model_dump() for m in p.messages],
                max_tokens=setup.max_tokens,
                timeout=120,
                candidate=s.name,
                prompt_id=p.id,
            ).token_ids
            reference.setdefault(p.id, ids)  # the first setting is the reference
            s.total += 1
            s.identical += int(ids is not None and ids == reference[p.id])
    print(
        f"  {s.name}: ready in {s.startup_s:.2f}s, greedy identical {s.identical}/{s.total}",
        file=sys.stderr,
        flush=True,
    )


def time_runs(live: list[Setting], setup: Setup) -> None:
    """``setup.runs`` timed rounds, round-robin, so load bursts hit every setting alike."""
    for run in range(setup.runs):
        for s in live[run % len(live) :] + live[: run % len(live)]:
            for p in setup.prompts:
                assert s.record is not None
                sample = bench.stream_chat(
                    f"http://127.0.0.1:{s.record.port}",
                    bench.with_nonce([m.model_dump() for m in p.messages], uuid.uuid4().hex),
                    max_tokens=setup.max_tokens,
                    timeout=120,
                    labels=bench.Labels(s.name, p.id, run),
                )
                if sample.decode_tps:
                    s.tps.append(sample.decode_tps)
        print(f"  run {run + 1}/{setup.runs} done", file=sys.stderr, flush=True)


def measure(table: list[Setting], setup: Setup) -> None:
    """Start each setting one at a time (startup timed alone), check its greedy ids, then time
    them all; every server is stopped at the end."""
    reference: dict[str, list[int] | None] = {}
    try:
        for s in table:
            if start_setting(s, setup, f"bench:{len(reference)}"):
                check_greedy(s, setup, reference)
        time_runs([s for s in table if not s.error], setup)
    finally:
        for s in table:
            if s.record is not None:
                stop_server(s.record)


def rows_of(table: list[Setting], base: float | None) -> list[dict[str, Any]]:
    rows = []
    for s in table:
        med = statistics.median(s.tps) if s.tps else None
        rows.append(
            {
                "setting": s.name,
                "decode_tps": round(med, 1) if med else None,
                "speedup": f"{100 * (med / base - 1):+.0f}%" if med and base else None,
                "greedy_identical": f"{s.identical}/{s.total}",
                "startup_s": round(s.startup_s, 2),
                "error": s.error or None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], table: list[Setting], setup: Setup) -> None:
    print(
        f"demo-speed suite, {len(setup.prompts)} prompts x {setup.runs} runs, max_tokens "
        f"{setup.max_tokens}; greedy ids vs '{table[0].name}', {setup.rounds} rounds"
    )
    columns = [
        ("setting", "setting"),
        ("decode_tps", "decode tok/s (median)"),
        ("speedup", "speedup"),
        ("greedy_identical", "greedy identical"),
        ("startup_s", "startup s"),
        ("error", "failed"),
    ]
    print(_common.table(rows, columns))


def main() -> int:
    ap = _parser()
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.rounds, args.max_tokens, args.ks = 1, 1, 8, [2]
    prompts = [
        p
        for p in load_suite("demo-speed").prompts  # the short selection prompts
        if p.split == "selection" and p.prompt_class != "long_context"
    ]
    work = Path(tempfile.mkdtemp(prefix="demo-speedup-"))
    models = build_demo_models(work / "models")
    setup = Setup(work, models, prompts, args.max_tokens, args.rounds, args.runs)
    table = settings(args.ks)[:2] if args.smoke else settings(args.ks)
    measure(table, setup)
    base = statistics.median(table[0].tps) if table[0].tps else None
    rows = rows_of(table, base)
    print_table(rows, table, setup)
    _common.emit({"smoke": args.smoke, "max_tokens": args.max_tokens, "rows": rows}, args.json)
    if base is None:  # no reference, no table worth the name
        print(f"the reference setting failed; logs in {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"took {time.monotonic() - start:.0f} s", file=sys.stderr)
    raise SystemExit(code)
