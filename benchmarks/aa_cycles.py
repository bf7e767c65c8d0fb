"""A/A cycles: N real cycles on the demo models whose only candidate is the baseline recipe under
another registry id. Nothing is faster than itself, so it must never qualify.

    .venv/bin/python benchmarks/aa_cycles.py 3 [--home DIR] [--policy demo] [--json]

The candidate is `demo-aa:same`, from a manifest written into the home's own registry: the demo
target with mlx_lm.server's default prefill step stated explicitly (the same process behaviour;
an identical knob set would be removed from the plan as "identical to the recipe already
serving"). Each cycle runs the product's own protocol (fresh starts, interleaved rounds, early
stopping) and selector under the policy named (default: the demo policy). Prints one row per
cycle: decision, speedup estimate, interval, starts and rounds used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from mcp_infra.contracts import CandidateRun, Recipe, ServiceConfig, Verdict  # noqa: E402
from mcp_infra.demo.models import build_demo_models  # noqa: E402
from mcp_infra.flows import api as app
from mcp_infra.flows.cycle import supervise  # noqa: E402
from mcp_infra.procs.runtime import free_port  # noqa: E402
from mcp_infra.procs.service import ensure_serving, stop_service, stop_stray_candidates
from mcp_infra.state import evidence  # noqa: E402
from mcp_infra.state.catalog import policy_dir  # noqa: E402
from mcp_infra.state.context import load_config  # noqa: E402
from mcp_infra.state.store import Home, read_model, write_model  # noqa: E402

CANDIDATE = "demo-aa:same"
AA_MANIFEST = (Path(__file__).resolve().parent.parent / "tests" / "demo-aa.yaml").read_text()


def make_home(root: Path, policy: str) -> Home:
    """A fresh home serving the demo target, the A/A manifest in its registry."""
    home = Home(root).ensure()
    paths = build_demo_models(home.models)
    data = yaml.safe_load((policy_dir() / f"{policy}.yaml").read_text())
    data["name"] = "aa"
    home.user_policy.mkdir(parents=True, exist_ok=True)
    (home.user_policy / "aa.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "demo-aa.yaml").write_text(AA_MANIFEST)
    port = free_port()
    scratch = free_port()
    write_model(
        home.config,
        ServiceConfig(
            port=port,
            scratch_port=scratch if scratch != port else free_port(),
            policy="aa",
            baseline=Recipe(
                candidate_id="demo-tiny:target",
                template="mlx_lm_server",
                model_path=str(paths["target"]),
            ),
        ),
    )
    return home


def one_cycle(home: Home) -> dict:
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    view = app.propose(
        home,
        {"hypothesis": "A/A: the baseline recipe under another id", "candidates": [CANDIDATE]},
        start_supervisor=False,
    )
    if not view.accepted:
        raise SystemExit(f"plan refused: {view.message}")
    began = time.monotonic()
    (summary,) = supervise(home)
    bundle = evidence.bundle_path(home, summary.cycle_id)
    verdict = read_model(bundle / "verdict.json", Verdict)
    (judged,) = verdict.candidates
    run = read_model(bundle / "runs" / "demo-aa__same.json", CandidateRun)
    return {
        "cycle": summary.cycle_id,
        "decision": judged.decision.value,
        "outcome": summary.outcome.value,
        "speedup": judged.speedup_estimate,
        "ci_low": judged.ci_low,
        "ci_high": judged.ci_high,
        "starts": run.starts,
        "rounds": len({r.round for r in run.rounds}),
        "seconds": time.monotonic() - began,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--policy", default="demo")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = args.home or Path(tempfile.mkdtemp(prefix="aa-cycles-"))
    shutil.rmtree(root, ignore_errors=True)
    home = make_home(root, args.policy)
    rows = []
    try:
        for _ in range(args.n):
            rows.append(one_cycle(home))
            row = rows[-1]
            interval = (
                f"{row['ci_low']:.3f}x to {row['ci_high']:.3f}x"
                if row["ci_low"] is not None
                else "-"
            )
            speed = f"{row['speedup']:.3f}x" if row["speedup"] is not None else "-"
            if len(rows) == 1:
                print(
                    f"{'cycle':<28} {'decision':<13} {'speedup':>8}  {'interval':<20} "
                    f"{'starts':>6} {'rounds':>6} {'seconds':>7}"
                )
            print(
                f"{row['cycle']:<28} {row['decision']:<13} {speed:>8}  {interval:<20} "
                f"{row['starts']:>6} {row['rounds']:>6} {row['seconds']:>7.0f}",
                flush=True,
            )
    finally:
        stop_stray_candidates(home, grace=3)
        stop_service(home, grace=3)
    qualified = sum(1 for r in rows if r["decision"] == "qualified")
    print(f"{qualified} of {len(rows)} A/A cycles qualified (must be 0)")
    if args.json:
        print(json.dumps({"rows": rows, "qualified": qualified}))
    return 1 if qualified else 0


if __name__ == "__main__":
    raise SystemExit(main())
