"""Run the demo cycle N times (default 3) and print each run's verdict: is the decision stable?

    .venv/bin/python benchmarks/verdict_stability.py [N]

Same models, same plan, same policy (`demo`) each run; only the measurements differ. Each run
uses a fresh home, serves the plain target as baseline and proposes the demo's three candidates.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mcp_infra.demo.run import DEMO_CANDIDATES, DEMO_HYPOTHESIS, prepare  # noqa: E402
from mcp_infra.flows import api as app
from mcp_infra.flows.cycle import supervise  # noqa: E402
from mcp_infra.procs.service import ensure_serving, stop_service  # noqa: E402
from mcp_infra.state import evidence  # noqa: E402
from mcp_infra.state.store import Home  # noqa: E402


def pct(x: float | None) -> str:
    return "-" if x is None else f"{(x - 1) * 100:+.1f}%"


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    work = Path(tempfile.mkdtemp(prefix="mcp-infra-stability-"))
    print(
        f"{'run':>3}  {'outcome':14} {'selected':22} {'speedup':>8} {'95% interval':>18} "
        f"{'worst prompt':>12}  decisions (k2 / k4 / k4-cache)  time"
    )
    for run in range(1, runs + 1):
        home = Home(work / f"home-{run}")
        started = time.monotonic()
        config = prepare(home)
        ensure_serving(home, config.baseline, config)
        try:
            view = app.propose(
                home,
                {"hypothesis": DEMO_HYPOTHESIS, "candidates": DEMO_CANDIDATES},
                proposed_by="benchmark",
                start_supervisor=False,
            )
            assert view.accepted, view.message
            (summary,) = supervise(home)
        finally:
            stop_service(home)
        verdict = app.evidence_view(home, summary.cycle_id).verdict
        assert verdict is not None
        by_id = {c.candidate: c for c in verdict.candidates}
        chosen = by_id.get(summary.selected or "")
        decisions = " / ".join(by_id[c].decision.value for c in DEMO_CANDIDATES if c in by_id)
        interval = f"[{pct(chosen.ci_low)}, {pct(chosen.ci_high)}]" if chosen else "-"
        worst = pct(chosen.worst_speedup) if chosen else "-"
        ok = evidence.verify(evidence.bundle_path(home, summary.cycle_id)).ok
        print(
            f"{run:>3}  {summary.outcome.value:14} {summary.selected or '-':22} "
            f"{pct(chosen.speedup_estimate) if chosen else '-':>8} {interval:>18} {worst:>12}  "
            f"{decisions}  {time.monotonic() - started:.0f}s{'' if ok else '  VERIFY FAILED'}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
