"""Latency of the MCP read tools over one stdio session, during a running cycle, and cold start.

Why: an IDE agent calls `status`, `registry` and `evidence` over and over while a cycle runs; the
target is p99 < 50 ms each over one session, and under 1 s from starting `mcp-infra serve` to
the first `tools/list` answer. This builds a demo home (tiny models, a live service), seals one
cycle (so `evidence` has something to read), starts a second one and, while it runs, calls each
tool N times round-robin over one session (`evidence` alternates the list and the first cycle's
summary). Then it starts the server K times for the cold start, and prints one table.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/mcp_latency.py [--calls 200] [--cold 5]

Timings depend on the machine and its load: say how loaded it was when you quote them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"

import anyio  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from mcp_infra.demo import prepare  # noqa: E402
from mcp_infra.flows import api as app  # noqa: E402
from mcp_infra.procs.service import ensure_serving, stop_service  # noqa: E402
from mcp_infra.state.store import Home  # noqa: E402

HYPOTHESIS = "A same-tokenizer drafter speeds up greedy decoding without changing outputs."


def params(home: Home) -> StdioServerParameters:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "HF_HUB_OFFLINE": "1",
    }
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "mcp_infra",
            "--home",
            str(home.root),
            "serve",
            "--mode",
            "read-only",
            "--no-supervisor",
        ],
        env=env,
    )


def wait_sealed(home: Home, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(app.evidence_view(home).cycles or []) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no sealed cycle #{count} after {timeout:.0f} s")
        time.sleep(1)


def propose(home: Home, candidates: list[str]) -> str:
    for candidate in candidates:  # the first cycle may have promoted one of them
        view = app.propose(
            home, {"hypothesis": HYPOTHESIS, "candidates": [candidate]}, proposed_by="benchmark"
        )
        if view.accepted:
            return candidate
    raise RuntimeError(f"no plan was accepted: {view.message}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def measure(home: Home, calls: int) -> dict[str, list[tuple[float, bool]]]:
    first = (app.evidence_view(home).cycles or [])[-1].cycle_id
    timings: dict[str, list[tuple[float, bool]]] = {"status": [], "registry": [], "evidence": []}
    async with Client(params(home), mode="legacy") as client:
        for name in timings:  # one warm-up each (first-call imports are cold start, not reads)
            await client.call_tool(name, {})
        for i in range(calls):
            for name in timings:
                args: dict[str, Any] = {}
                if name == "evidence" and i % 2:
                    args = {"cycle_id": first}
                started = time.perf_counter()
                result = await client.call_tool(name, args)
                elapsed = (time.perf_counter() - started) * 1000
                assert not result.is_error, result.content
                running = bool(
                    name == "status"
                    and result.structured_content
                    and result.structured_content.get("cycle")
                )
                timings[name].append((elapsed, running))
    return timings


async def cold_start(home: Home) -> float:
    started = time.perf_counter()
    async with Client(params(home), mode="legacy") as client:
        await client.list_tools()
        return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls of each tool")
    ap.add_argument("--cold", type=int, default=5, help="cold starts to time")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for a cycle")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcp-latency-") as tmp:
        home = Home(Path(tmp) / "home")
        config = prepare(home)
        ensure_serving(home, config.baseline, config)
        try:
            propose(home, ["demo-tiny:draft-k2"])
            wait_sealed(home, 1, args.timeout)
            propose(home, ["demo-tiny:draft-k4", "demo-tiny:draft-k2"])
            deadline = time.monotonic() + 120
            while app.status(home).cycle is None and time.monotonic() < deadline:
                time.sleep(0.2)
            timings = anyio.run(measure, home, args.calls)
            during = sum(r for _, r in timings["status"])
            colds = [anyio.run(cold_start, home) for _ in range(args.cold)]
            wait_sealed(home, 2, args.timeout)
        finally:
            stop_service(home)
    print(
        f"\nover one stdio session, {args.calls} calls each; a cycle was running during "
        f"{during} of {args.calls} status calls (load average {os.getloadavg()[0]:.1f})"
    )
    print(f"{'tool':10} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, rows in timings.items():
        ms = [t for t, _ in rows]
        print(
            f"{name:10} {statistics.median(ms):8.1f} {pct(ms, 95):8.1f} {pct(ms, 99):8.1f} "
            f"{max(ms):8.1f}"
        )
    print(
        f"cold start to the first tools/list over {args.cold} starts: "
        f"median {statistics.median(colds):.2f} s, min {min(colds):.2f} s, "
        f"max {max(colds):.2f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
