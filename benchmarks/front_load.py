"""The front under load: its added latency at 1, 100 and 1,000 concurrent streamed clients,
against the same requests sent to the backend directly, its peak memory, and the open-files
limit it runs with.

What: a fresh home with the demo models and a live mlx_lm.server behind the front. At each
level N the same streamed chat request (8 tokens, temperature 0) is sent N at once, each on a
connection of its own, to the front's port and then to the backend's own port, or the other way
round (the order alternates between rounds); at 1 client, --pairs requests one after another on
each side, interleaved. A request's latency runs from sending it to `data: [DONE]`. For each
side: requests served, answered 503 with `Retry-After`, and failed (reset, refused, unanswered
within 120 s, or another answer), and p50 and p99 of the served requests' latency; the front's
added latency is its percentile less the backend's (at 1 client also the median of the
pairs' differences). While the front's rounds run its keeper and
proxy are sampled every 0.2 s for their peak resident memory (together); the proxy's soft
open-files limit is read at the end. Past `max_per_backend` (16) and `max_queue` (512) the front
answers 503 with `Retry-After`; the backend alone (mlx_lm.server: a thread per connection,
listen backlog 5) takes every connection it can, so at 1,000 the two sides do not serve the same
number of requests, and their percentiles are over different sets (the table says how many).

Target: at every level each request through the front is served or answered 503 with
`Retry-After`, none failed (exit status 1 otherwise); the added latency is printed, not judged.
Takes: about 5 minutes on 2 loaded cores (3 rounds at 100, one at 1,000). --smoke: 1 client (5
pairs) and 10 clients (one round), under a minute.

    .venv/bin/python benchmarks/front_load.py [--levels 1,100,1000] [--pairs 40] [--json]
        [--smoke]
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import _common

from mcp_infra.demo import frontkit
from mcp_infra.demo.faults import start_live
from mcp_infra.demo.homes import make_home, stop_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.procs.front import raise_fd_limit
from mcp_infra.procs.service import backend_url
from mcp_infra.state.context import load_config, service_record
from mcp_infra.state.store import Home

TOKENS = 8
TIMEOUT_S = 120.0
ROUNDS = {1: 1, 100: 3, 1000: 1}  # rounds per side at a level (1 client: --pairs each)


def _pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def _why(r: frontkit.StreamResult) -> str | None:
    """What went wrong with one request (None: served, or told 503 with Retry-After)."""
    if r.status == 200 and r.done and not r.error_event:
        return None
    if r.status == 503 and r.retry_after:
        return None
    if r.error:
        return r.error.split(":")[0]  # the exception's class: ReadTimeout, RemoteProtocolError
    return "error event" if r.error_event else f"HTTP {r.status}" if r.status != 200 else "cut"


def side(results: list[frontkit.StreamResult]) -> dict[str, Any]:
    """Counts, what the failures were, and latency percentiles (nearest rank) of one side."""
    ok = [r for r in results if r.status == 200 and r.done_s is not None and not r.error_event]
    served = [r.done_s for r in ok if r.done_s is not None]
    told = sum(r.status == 503 and bool(r.retry_after) for r in results)
    why = Counter(w for r in results if (w := _why(r)) is not None)
    return {
        "requests": len(results),
        "served": len(served),
        "told_503": told,
        "failed": len(results) - len(served) - told,
        "failures": dict(why.most_common(3)),
        "p50_s": _pct(served, 0.50),
        "p99_s": _pct(served, 0.99),
    }


def _added_ms(front: float | None, direct: float | None) -> float | None:
    return None if front is None or direct is None else round((front - direct) * 1000, 1)


def level(home: Home, clients: int, rounds: int, pairs: int) -> dict[str, Any]:
    """One level: the same requests to the front and to the backend, in alternating order."""
    front = f"http://127.0.0.1:{load_config(home).port}"
    live = service_record(home)
    assert live is not None
    direct = backend_url(live)
    seen: dict[str, list[frontkit.StreamResult]] = {"front": [], "direct": []}
    for base in (front, direct):  # not counted: the first answer of a prompt fills its cache
        frontkit.one_stream(base, max_tokens=TOKENS)
    load = os.getloadavg()[0]
    batches = pairs if clients == 1 else rounds
    with frontkit.PeakMemory(home) as peak:
        for i in range(batches):
            order = [("front", front), ("direct", direct)]
            for name, base in order if i % 2 == 0 else order[::-1]:
                seen[name] += frontkit.streamed_clients(
                    base, clients, max_tokens=TOKENS, timeout=TIMEOUT_S
                )
    f, d = side(seen["front"]), side(seen["direct"])
    pairs_ms = None
    if clients == 1:  # one after another: each front request has its direct twin
        both = zip(seen["front"], seen["direct"], strict=True)
        diffs = [a.done_s - b.done_s for a, b in both if a.done_s and b.done_s]
        pairs_ms = round(statistics.median(diffs) * 1000, 1) if diffs else None
    return {
        "clients": clients,
        "rounds": batches,
        "load_1min": round(load, 1),
        "front": f,
        "direct": d,
        "added_p50_ms": _added_ms(f["p50_s"], d["p50_s"]),
        "added_p99_ms": _added_ms(f["p99_s"], d["p99_s"]),
        "added_pairwise_p50_ms": pairs_ms,
        # sampled over both sides' rounds: the front idles while the backend is asked directly
        "front_peak_rss_mb": round(peak.peak_bytes / 2**20, 1),
    }


def _row(r: dict[str, Any]) -> dict[str, Any]:
    f, d = r["front"], r["direct"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    return {
        "clients": r["clients"],
        "load": r["load_1min"],
        "front": f"{f['served']}/{f['told_503']}/{f['failed']}",
        "direct": f"{d['served']}/{d['told_503']}/{d['failed']}",
        "front_p50": ms(f["p50_s"]),
        "direct_p50": ms(d["p50_s"]),
        "added_p50": r["added_p50_ms"],
        "front_p99": ms(f["p99_s"]),
        "direct_p99": ms(d["p99_s"]),
        "added_p99": r["added_p99_ms"],
        "peak": r["front_peak_rss_mb"],
    }


COLUMNS = [
    ("clients", "clients"),
    ("load", "load"),
    ("front", "front served/503/failed"),
    ("direct", "direct served/503/failed"),
    ("front_p50", "front p50 ms"),
    ("direct_p50", "direct p50 ms"),
    ("added_p50", "added p50 ms"),
    ("front_p99", "front p99 ms"),
    ("direct_p99", "direct p99 ms"),
    ("added_p99", "added p99 ms"),
    ("peak", "front peak RSS MB"),
]


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--levels", default="1,100,1000", help="concurrent clients, comma-separated")
    ap.add_argument("--pairs", type=int, default=40, help="requests per side at 1 client")
    args = ap.parse_args()
    levels = [1, 10] if args.smoke else [int(n) for n in args.levels.split(",")]
    pairs = 5 if args.smoke else args.pairs
    raise_fd_limit(4 * max(levels) + 256)  # this process holds a connection per client
    models = build_demo_models(Path(tempfile.gettempdir()) / "mcp-infra-client-models")
    with tempfile.TemporaryDirectory(prefix="mcp-infra-load-") as tmp:
        home = make_home(Path(tmp) / "home", models)
        try:
            start_live(home)
            rows = [level(home, n, ROUNDS.get(n, 1), pairs) for n in levels]
            limit = frontkit.footprint(home)
        finally:
            stop_home(home)
    print(_common.table([_row(r) for r in rows], COLUMNS))
    fd_limit = limit.fd_limit if limit else None
    print(f"the proxy's open-files limit (soft): {fd_limit}")
    for r in rows:
        if r["added_pairwise_p50_ms"] is not None:
            pairs = r["added_pairwise_p50_ms"]
            print(f"1 client: the median of the pairs' differences: {pairs} ms")
        for name in ("front", "direct"):
            if r[name]["failures"]:
                print(f"{r['clients']} clients, {name}: failed {r[name]['failures']}")
    ok = all(r["front"]["failed"] == 0 for r in rows)
    _common.emit({"smoke": args.smoke, "levels": rows, "fd_limit": fd_limit, "ok": ok}, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
