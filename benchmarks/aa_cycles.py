"""A/A cycles: N real cycles on the demo models whose only candidate is the baseline recipe
under another registry id. Nothing is faster than itself, so it must never qualify.

What: the candidate is `demo-aa:same`, from a manifest written into the home's own registry
(tests/data/demo-aa.yaml): the demo target with mlx_lm.server's default prefill step stated
explicitly (the same process behaviour; an identical knob set would be removed from the plan as
"identical to the recipe already serving"). Each cycle runs the product's own protocol (fresh
starts, interleaved rounds, early stopping) and selector under the policy named (default: the
demo policy), in this process, all in one home: where the policy learns the start-to-start
spread (`learn_spread`), each cycle after the first judges with what the earlier ones taught
(the `learned df` column), as a user's home does. One row per cycle: decision, speedup
estimate, interval, starts and rounds used.

Target: no A/A cycle qualifies (exit status 1 if one does). A qualification now and then is what
the confidence level allows ((1 - confidence) / 2 of cycles at most): count over many cycles.
Takes: a demo-policy cycle each (default 3): one of one candidate took 4.5 minutes on this
2-core machine at load average 6. --smoke: one cycle under the smoke protocol (45 s), no
target judged.

    .venv/bin/python benchmarks/aa_cycles.py [N] [--home DIR] [--policy demo] [--json] [--smoke]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

from mcp_infra.contracts import CandidateRun, FrozenPlan, Verdict
from mcp_infra.demo.homes import make_home, stop_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, read_model

CANDIDATE = "demo-aa:same"
AA_MANIFEST = Path(__file__).resolve().parent.parent / "tests" / "data" / "demo-aa.yaml"


def aa_home(root: Path, models: dict[str, Path], policy: str, smoke: bool) -> Home:
    """A fresh home serving the demo target under ``policy`` (under the smoke protocol on
    the lean one with ``smoke``), the A/A manifest in its registry."""
    shutil.rmtree(root, ignore_errors=True)
    shipped = load_policy(policy).protocol
    # The policy's own history settings (a test home drops them): the cycles share one home,
    # so from the second on an A/A cycle judges with the spread the earlier ones taught.
    protocol: dict[str, object] = {
        "learn_spread": shipped.learn_spread,
        "futility_confidence": shipped.futility_confidence,
    }
    protocol |= _common.SMOKE_PROTOCOL if smoke else {}
    home = make_home(root, models, base=policy, lean=smoke, **protocol)
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / AA_MANIFEST.name).write_text(AA_MANIFEST.read_text())
    return home


def one_cycle(home: Home) -> dict[str, Any]:
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
    learned = read_model(bundle / "plan.json", FrozenPlan).protocol.learned_spread
    return {
        "cycle": summary.cycle_id,
        "decision": judged.decision.value,
        "outcome": summary.outcome.value,
        "speedup": judged.speedup_estimate,
        "ci_low": judged.ci_low,
        "ci_high": judged.ci_high,
        "starts": run.starts,
        "rounds": len({r.round for r in run.rounds}),
        "learned": learned.df if learned else None,
        "seconds": round(time.monotonic() - began),
    }


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("n", nargs="?", type=int, default=3, help="cycles (default 3)")
    ap.add_argument("--home", type=Path, default=None, help="the home to (re)create")
    ap.add_argument("--policy", default="demo", help="the shipped policy to run under")
    args = ap.parse_args()
    cycles = 1 if args.smoke else args.n
    work = Path(tempfile.mkdtemp(prefix="aa-cycles-"))
    models = build_demo_models(work / "models")
    home = aa_home(args.home or work / "home", models, args.policy, smoke=args.smoke)
    rows = []
    try:
        for i in range(cycles):
            rows.append(one_cycle(home))
            print(f"cycle {i + 1}/{cycles}: {rows[-1]['decision']}", file=sys.stderr, flush=True)
    finally:
        stop_home(home)
        if args.home is None:  # a home asked for keeps its models (a symlink into work)
            shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        row["interval"] = (
            f"{row['ci_low']:.3f}x to {row['ci_high']:.3f}x" if row["ci_low"] is not None else None
        )
        row["estimate"] = f"{row['speedup']:.3f}x" if row["speedup"] is not None else None
    columns = [
        ("cycle", "cycle"),
        ("decision", "decision"),
        ("estimate", "speedup"),
        ("interval", "interval"),
        ("starts", "starts"),
        ("rounds", "rounds"),
        ("learned", "learned df"),
        ("seconds", "s"),
    ]
    print(_common.table(rows, columns))
    qualified = sum(1 for r in rows if r["decision"] == "qualified")
    print(f"{qualified} of {len(rows)} A/A cycles qualified (must be 0)")
    if args.smoke:
        print("smoke run: one cycle judges nothing")
    _common.emit({"smoke": args.smoke, "rows": rows, "qualified": qualified}, args.json)
    return 1 if qualified and not args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
