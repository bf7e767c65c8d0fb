"""A soak: mixed traffic through the front for a given time while cycles run and promote; what
the front and the home hold at the start, after the warm-up, after the cycles and at the end.

What: a fresh home with the demo models and a live mlx_lm.server behind the front (the lean
`test` policy with thresholds that promote any measured gain). --workers clients send requests
back to back to the stable port, each in its own turn through the kinds: short and long
answers (8 and 96 tokens), streamed and not, a stream the client leaves after its first events,
and `GET /v1/models`; half the clients keep their connection alive between requests, half open
one per request. After the warm-up a supervisor runs plans one after another (a drafter,
demo-tiny:draft-k4, -k2 or -k6 in turn, against the live recipe; recipe memory off, so each runs)
while the traffic goes on, until 60% of the time is gone; the traffic alone runs to the end.
Checkpoints: at the start, after the warm-up, after each cycle, after the cycles, every 10
minutes of traffic alone, at the end. At each the traffic pauses (each client finishes its
request and closes its connection) and the script reads the front's resident memory and open
files (keeper and proxy), the size of the home's logs (and of the largest), and the home's disk
use (the models, a link, left out): all of it, the cycles' part (cycles/ and evidence/), and
the rest (neither the cycles nor the logs). A request fails when it is not answered 200, a
stream ends without `data: [DONE]` or with an error event, an answer is not a chat completion,
or the connection breaks; a client that leaves on purpose has not failed.

Target: 0 failed requests; the front's memory and open files at the end within 10% of their
figures after the warm-up; no log file over its cap (4 MiB, rotated into two more); the rest
of the home at the end within 10% of its size after the cycles (the traffic alone leaves
nothing behind). Exit status 1 otherwise.
Takes: --minutes (default 60) and a minute of setup; the one-hour run: `timeout 4500
.venv/bin/python benchmarks/soak.py --minutes 60`. --smoke: the same in one to two minutes on
2 loaded cores, most of it the cycle (a 5 s warm-up, one cycle under the smoke protocol, 5 s of
traffic alone).

    .venv/bin/python benchmarks/soak.py [--minutes 60] [--workers 4] [--json] [--smoke]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import yaml

from mcp_infra.demo import frontkit
from mcp_infra.demo.faults import run_supervisor, start_live
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, TEST_POLICY, make_home, stop_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.demo.traffic import Traffic
from mcp_infra.flows import api as app
from mcp_infra.procs.front import current_status
from mcp_infra.procs.logpipe import LOG_MAX_BYTES
from mcp_infra.state import evidence
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home

SETTLE_S = 1.5  # after a pause: the front closes the connections the clients closed
CYCLES_UNTIL = 0.6  # of the time: plans start until then; the traffic alone runs after
PLANS = ("demo-tiny:draft-k4", "demo-tiny:draft-k2", "demo-tiny:draft-k6")
CHECK_EVERY_S = 600.0  # a checkpoint every 10 minutes of traffic alone
GROWTH_LIMIT = 0.10
SMOKE_PHASE_S = 5.0  # --smoke: the warm-up, and the traffic alone after the cycle


def _disk(path: Path) -> int:
    """Bytes on disk under ``path`` (symbolic links not followed)."""
    used = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                used += os.lstat(os.path.join(root, name)).st_blocks * 512
    return used


def checkpoint(home: Home, traffic: Traffic, name: str) -> dict[str, Any]:
    """Pause the traffic, read the front and the home, resume."""
    idle = traffic.pause()
    time.sleep(SETTLE_S)
    try:
        front = frontkit.footprint(home)
        logs = [p for p in home.logs.rglob("*") if p.is_file()]
        sizes = [p.stat().st_size for p in logs]
        whole, cycles = _disk(home.root), _disk(home.cycles) + _disk(home.evidence)
        log_disk = _disk(home.logs)
        status = current_status(home)
        return {
            "checkpoint": name,
            "at_min": round((time.monotonic() - traffic.started) / 60, 1),
            "idle": idle,
            "load_1min": round(os.getloadavg()[0], 1),
            "requests": traffic.total(),
            "failed": len(traffic.failures),
            "front_rss_mb": round(front.rss_bytes / 2**20, 1) if front else None,
            "front_open_files": front.open_files if front else None,
            "proxy_pid": front.proxy_pid if front else None,
            "fd_limit": front.fd_limit if front else None,
            "logs_mb": round(sum(sizes) / 2**20, 2),
            "log_files": len(logs),
            "largest_log_mb": round(max(sizes, default=0) / 2**20, 2),
            "home_mb": round(whole / 2**20, 2),
            "cycles_mb": round(cycles / 2**20, 2),
            "rest_mb": round((whole - cycles - log_disk) / 2**20, 3),
            "proxy_replaced": status.watchdog.replaced if status else None,
            "backend_restarts": status.healing.restarts if status else None,
        }
    finally:
        traffic.resume()


@dataclass
class Cycles:
    """Plans run one after another by a supervisor, until ``until`` (monotonic), with a
    checkpoint after each."""

    home: Home
    traffic: Traffic
    until: float
    points: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)
    once: bool = False

    def run(self) -> None:
        for index in itertools.count():
            if time.monotonic() >= self.until or (self.once and self.runs):
                return
            view = None
            for k in range(len(PLANS)):  # the live recipe's own candidate is refused: the next
                candidate = PLANS[(index + k) % len(PLANS)]
                plan = {"hypothesis": "a drafter speeds up decoding", "candidates": [candidate]}
                view = app.propose(self.home, plan, proposed_by="soak", start_supervisor=False)
                if view.accepted:
                    break
            if view is None or not view.accepted:
                self.runs.append({"refused": view.message if view else "no plan"})
                return
            started = time.monotonic()
            code = run_supervisor(self.home, timeout=3600)
            summary = evidence.list_cycles(self.home)[0]
            self.runs.append(
                {
                    "plan": view.candidates[-1],
                    "outcome": summary.outcome.value,
                    "selected": summary.selected,
                    "exit": code,
                    "minutes": round((time.monotonic() - started) / 60, 1),
                }
            )
            if not self.once:
                name = f"after cycle {len(self.runs)}"
                self.points.append(checkpoint(self.home, self.traffic, name))


def judge(points: list[dict[str, Any]], traffic: Traffic) -> dict[str, Any]:
    named = {p["checkpoint"]: p for p in points}
    warm, cycled, end = named["after warm-up"], named["after the cycles"], named["end"]

    def growth(key: str, before: dict[str, Any]) -> float | None:
        if before.get(key) in (None, 0) or end.get(key) is None:
            return None
        return round(end[key] / before[key] - 1, 3)

    figures = {
        "failed": len(traffic.failures),
        "memory_growth": growth("front_rss_mb", warm),
        "open_files_growth": growth("front_open_files", warm),
        "rest_growth_traffic_alone": growth("rest_mb", cycled),
        "largest_log_mb": max(p["largest_log_mb"] for p in points),
    }
    within = [
        figures[k] is not None and figures[k] <= GROWTH_LIMIT
        for k in ("memory_growth", "open_files_growth", "rest_growth_traffic_alone")
    ]
    cap_ok = figures["largest_log_mb"] <= LOG_MAX_BYTES / 2**20 + 0.1  # one line past the cap
    figures["target_held"] = figures["failed"] == 0 and all(within) and cap_ok
    return figures


COLUMNS = [
    ("checkpoint", "checkpoint"),
    ("at_min", "min"),
    ("load_1min", "load"),
    ("requests", "requests"),
    ("failed", "failed"),
    ("front_rss_mb", "front RSS MB"),
    ("front_open_files", "front open files"),
    ("logs_mb", "logs MB"),
    ("log_files", "log files"),
    ("largest_log_mb", "largest log MB"),
    ("home_mb", "home MB"),
    ("cycles_mb", "cycles MB"),
    ("rest_mb", "rest MB"),
    ("proxy_replaced", "proxy replaced"),
]


def _no_recipe_memory(home: Home) -> None:
    """Every plan runs again, as in the demo: recipe memory would skip a drafter measured
    before, and the soak proposes the same few over and over."""
    path = home.user_policy / f"{TEST_POLICY}.yaml"
    data = yaml.safe_load(path.read_text())
    data["recipe_memory"] = False
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def soak(work: Path, minutes: float, workers: int, smoke: bool) -> dict[str, Any]:
    models = build_demo_models(work / "models")
    protocol = _common.SMOKE_PROTOCOL if smoke else {}
    home = make_home(work / "home", models, thresholds=PROMOTE_ANY_GAIN, **protocol)
    _no_recipe_memory(home)
    try:
        config = load_config(home)
        start_live(home)
        traffic = Traffic(f"http://127.0.0.1:{config.port}", workers)
        points = [checkpoint(home, traffic, "start")]
        total_s = minutes * 60
        warmup_s = SMOKE_PHASE_S if smoke else min(300.0, total_s * 0.1)
        traffic.started = time.monotonic()
        end_at = traffic.started + total_s
        traffic.start()
        with frontkit.PeakMemory(home, every_s=1.0) as peak:
            time.sleep(warmup_s)
            points.append(checkpoint(home, traffic, "after warm-up"))
            cycles = Cycles(home, traffic, traffic.started + total_s * CYCLES_UNTIL, points)
            cycles.once = smoke
            cycles.run()
            points.append(checkpoint(home, traffic, "after the cycles"))
            alone_s = SMOKE_PHASE_S if smoke else max(60.0, end_at - time.monotonic())
            for _ in range(int(alone_s // CHECK_EVERY_S)):
                time.sleep(CHECK_EVERY_S)
                points.append(checkpoint(home, traffic, "traffic alone"))
            time.sleep(alone_s % CHECK_EVERY_S)
            points.append(checkpoint(home, traffic, "end"))
        traffic.stop()
        figures = judge(points, traffic)
        return {
            "points": points,
            "cycles": cycles.runs,
            "requests": dict(traffic.counts),
            "left_on_purpose": traffic.left,
            "peak_front_rss_mb": round(peak.peak_bytes / 2**20, 1),
            "failures": [f.__dict__ for f in traffic.failures[:20]],
            **figures,
        }
    finally:
        stop_home(home)


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the traffic runs")
    ap.add_argument("--workers", type=int, default=4, help="clients sending at once (1-64)")
    args = ap.parse_args()
    minutes = 2.0 if args.smoke else args.minutes
    workers = max(1, min(64, args.workers))
    with tempfile.TemporaryDirectory(prefix="mcp-infra-soak-") as tmp:
        result = soak(Path(tmp), minutes, workers, args.smoke)
    print(_common.table(result["points"], COLUMNS))
    for run in result["cycles"]:
        print("cycle:", ", ".join(f"{k} {v}" for k, v in run.items()))
    print(
        f"requests by kind: {result['requests']}; left on purpose: {result['left_on_purpose']}; "
        f"failed: {result['failed']}; the front's peak RSS {result['peak_front_rss_mb']} MB; "
        f"growth after the warm-up: memory "
        f"{result['memory_growth']}, open files {result['open_files_growth']}; the home outside "
        f"the logs with traffic alone: {result['rest_growth_traffic_alone']}; target "
        f"{'held' if result['target_held'] else 'NOT held'}"
    )
    for failure in result["failures"]:
        print("failed:", failure, file=sys.stderr)
    _common.emit({"smoke": args.smoke, **result}, args.json)
    return 0 if result["target_held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
