"""What slowed the starts: each selection start's level against the CPU taken from it.

What: reads every sealed bundle under the given homes (``evidence/*``), and for each
configuration measured in two or more selection starts, each start's level (the product's
``stats.start_levels``: the mean over prompts of the start's median log decode tok/s in the
single-request short cell) less the configuration's median level, beside what its round record
says was taken from it (``core.machine``): other processes' share of the CPUs and the
hypervisor's steal. Starts are binned by steal (with other processes under 6%) and by other
processes' CPU (with steal under 5%); each bin prints its starts, the mean and lowest deviation,
and the script prints the correlation of each share with the deviation.

Why: a rule that reads the load (the quiet wait, the set-aside rule, the learned spread's quiet
starts, the words of an open verdict) must read what actually slows a start on the machine. On
this project's 2-CPU VM that was steal (2026-12-03, five demo homes, 195 starts: about -0.19 in
log tok/s at 20-30% steal, correlation -0.57; other processes' CPU none), which is why
``core.machine.taken_fraction`` counts it.

Target: none enforced; a reading of evidence already sealed (exit 0). Takes: seconds.
--smoke: the committed example bundle alone.

    .venv/bin/python benchmarks/start_load.py HOME [HOME ...] [--json] [--smoke]
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, NamedTuple

import _common

from mcp_infra.contracts import CandidateRun, MachineLoad
from mcp_infra.core.machine import stolen_fraction
from mcp_infra.core.stats import start_levels
from mcp_infra.state.store import CorruptFile, read_model

REPO = Path(__file__).resolve().parents[1]
CELL = ("short", 1)
STEAL_BINS = [(0.0, 0.05), (0.05, 0.1), (0.1, 0.2), (0.2, 0.3), (0.3, 1.01)]
OTHER_BINS = [(0.0, 0.06), (0.06, 0.15), (0.15, 0.25), (0.25, 1.01)]


class StartPoint(NamedTuple):
    deviation: float
    steal: float
    other: float


def run_points(run: CandidateRun) -> list[StartPoint]:
    """Each recorded selection start of one run: its level less the run's median level."""
    loads: dict[int, MachineLoad] = {
        r.start: r.machine for r in run.rounds if r.machine is not None and not r.set_aside
    }
    levels = {}
    for start in sorted({s.start for s in run.samples if s.phase == "measure"}):
        level = start_levels([s for s in run.samples if s.start == start], CELL)
        if level:
            levels[start] = level[0]
    if len(levels) < 2:
        return []
    median = statistics.median(levels.values())
    return [
        StartPoint(level - median, stolen_fraction(loads[k]), loads[k].other_cpu_fraction)
        for k, level in levels.items()
        if k in loads and loads[k].steal_s is not None
    ]


def bundle_points(bundle: Path) -> list[StartPoint]:
    points: list[StartPoint] = []
    for path in sorted((bundle / "runs").glob("*.json")):
        if path.name.startswith(("live--", "heldout--")):
            continue
        try:
            points += run_points(read_model(path, CandidateRun))
        except (CorruptFile, ValueError):
            continue  # a run file of another schema: not this reading's business
    return points


def binned(points: list[StartPoint], by: str) -> list[dict[str, Any]]:
    rows = []
    for lo, hi in STEAL_BINS if by == "steal" else OTHER_BINS:
        chosen = [
            p
            for p in points
            if lo <= getattr(p, by) < hi and (p.other < 0.06 if by == "steal" else p.steal < 0.05)
        ]
        if chosen:
            rows.append(
                {
                    "by": by,
                    "bin": f"{lo:.0%}-{min(hi, 1.0):.0%}",
                    "starts": len(chosen),
                    "mean_dev": round(statistics.fmean(p.deviation for p in chosen), 3),
                    "lowest_dev": round(min(p.deviation for p in chosen), 3),
                }
            )
    return rows


def correlation(xs: list[float], ys: list[float]) -> float | None:
    try:
        return round(statistics.correlation(xs, ys), 3)
    except statistics.StatisticsError:  # fewer than two points, or a constant share
        return None


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("homes", nargs="*", type=Path, help="homes whose evidence/ to read")
    args = ap.parse_args()
    bundles = (
        sorted(p.parent for p in (REPO / "evidence").glob("*/MANIFEST.json"))
        if args.smoke
        else sorted(
            p.parent for home in args.homes for p in (home / "evidence").glob("*/MANIFEST.json")
        )
    )
    points = [p for b in bundles for p in bundle_points(b)]
    rows = binned(points, "steal") + binned(points, "other")
    print(f"{len(points)} start(s) with a steal reading in {len(bundles)} bundle(s)")
    columns = [
        ("by", "share"),
        ("bin", "bin"),
        ("starts", "starts"),
        ("mean_dev", "mean dev (log)"),
        ("lowest_dev", "lowest dev"),
    ]
    print(_common.table(rows, columns))
    deviations = [p.deviation for p in points]
    steal_r = correlation([p.steal for p in points], deviations)
    other_r = correlation([p.other for p in points], deviations)
    print(f"correlation with the deviation: steal {steal_r}, other processes {other_r}")
    _common.emit(
        {
            "bundles": len(bundles),
            "starts": len(points),
            "rows": rows,
            "steal_correlation": steal_r,
            "other_correlation": other_r,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
