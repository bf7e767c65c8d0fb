"""Run the demo cycle N times and print each run's verdict: is the decision stable?

What: same models, same plan, same policy (`demo`) each run; only the measurements differ. Each
run prepares a fresh demo home exactly as `mcp-infra demo` does, serves the plain target as the
baseline, proposes the demo's three candidates and runs the cycle in this process
(`flows.supervisor.supervise`); the sealed bundle is verified.

Target: every run reaches the same outcome and selects the same candidate, and every bundle
verifies (exit status 1 if a bundle does not; a change of decision is printed, not an error).
Takes: one demo each (default 3 runs): 174-240 s a run on 2 cores (README). --smoke: one run of
one candidate (demo-tiny:draft-k2) under the smoke protocol, about 75 s.

    .venv/bin/python benchmarks/verdict_stability.py [N] [--json] [--smoke]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

from mcp_infra.demo.homes import stop_home, use_test_policy
from mcp_infra.demo.run import DEMO_CANDIDATES, DEMO_HYPOTHESIS, prepare
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.store import Home


def pct(x: float | None) -> str:
    return "-" if x is None else f"{(x - 1) * 100:+.1f}%"


def one_run(home: Home, candidates: list[str], smoke: bool) -> dict[str, Any]:
    started = time.monotonic()
    config = prepare(home)
    if smoke:
        config = use_test_policy(home, config, **_common.SMOKE_PROTOCOL)
    ensure_serving(home, config.baseline, config)
    try:
        view = app.propose(
            home,
            {"hypothesis": DEMO_HYPOTHESIS, "candidates": candidates},
            proposed_by="benchmark",
            start_supervisor=False,
        )
        if not view.accepted:
            raise RuntimeError(f"plan refused: {view.message}")
        (summary,) = supervise(home)
    finally:
        stop_home(home)
    verdict = app.evidence_view(home, summary.cycle_id).verdict
    if verdict is None:
        raise RuntimeError(f"cycle {summary.cycle_id} sealed without a verdict")
    by_id = {c.candidate: c for c in verdict.candidates}
    chosen = by_id.get(summary.selected or "")
    return {
        "cycle": summary.cycle_id,
        "outcome": summary.outcome.value,
        "selected": summary.selected,
        "speedup": pct(chosen.speedup_estimate) if chosen else None,
        "interval": f"[{pct(chosen.ci_low)}, {pct(chosen.ci_high)}]" if chosen else None,
        "worst_prompt": pct(chosen.worst_speedup) if chosen else None,
        "decisions": " / ".join(by_id[c].decision.value for c in candidates if c in by_id),
        "verified": evidence.verify(evidence.bundle_path(home, summary.cycle_id)).ok,
        "seconds": round(time.monotonic() - started),
    }


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("runs", nargs="?", type=int, default=3, help="cycles to run (default 3)")
    args = ap.parse_args()
    runs, candidates = (1, ["demo-tiny:draft-k2"]) if args.smoke else (args.runs, DEMO_CANDIDATES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcp-infra-stability-") as tmp:
        for run in range(1, runs + 1):
            home = Home(Path(tmp) / f"home-{run}")
            rows.append({"run": run, **one_run(home, candidates, args.smoke)})
            print(f"run {run}/{runs}: {rows[-1]['outcome']}", file=sys.stderr, flush=True)
    columns = [
        ("run", "run"),
        ("outcome", "outcome"),
        ("selected", "selected"),
        ("speedup", "speedup"),
        ("interval", "interval"),
        ("worst_prompt", "worst prompt"),
        ("decisions", "decisions (" + " / ".join(c.split(":")[1] for c in candidates) + ")"),
        ("verified", "verified"),
        ("seconds", "s"),
    ]
    print(_common.table(rows, columns))
    stable = len({(r["outcome"], r["selected"]) for r in rows}) == 1
    print(f"{len(rows)} runs: {'the same decision' if stable else 'DIFFERENT decisions'}")
    _common.emit({"smoke": args.smoke, "rows": rows, "stable": stable}, args.json)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
