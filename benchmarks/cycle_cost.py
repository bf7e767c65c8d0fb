"""What a cycle costs on a target, and whether it decides: the product's own round loop
(``flows.simulation.project``: ``start_plan``, ``run_rounds``, ``next_round``, early stopping,
failed gates, ``select``, the drift re-measure, the held-out check, the time budget) over
simulated server starts. Only the server and the clock are simulated, from a target profile.

Profiles: ``qwen27b-m5pro`` (``benchmarks/profiles/qwen27b-m5pro.yaml``, every assumption in the
file) or a path to a profile YAML. Plans: ``drafters`` (two drafters, one truly 1.9x and one
1.4x at one request, both serial at four) and ``null`` (two candidates truly 1.0x).

``--profile this-home [--bundle DIR | --home DIR]``: the profile derived from a sealed bundle's
own measured timings (``flows.projection.profile_from_bundle``; ``--home``: its newest sealed
bundle), and the bundle's own plan under the policy it ran under, projected and set against what
the cycle measured (wall time, summary started_at..ended_at, and requests answered).

Target: on ``qwen27b-m5pro`` the ``single-user`` policy with the drafters promotes in >= 95% of
seeds, median <= 12 min; the ``default`` policy decides (promotes, or rejects naming the
concurrency-4 loss) in >= 95%, median <= 30 min; the null plan qualifies in 0% of seeds,
median <= 30 min.

Takes: about 2 s per seed and row on a 2-core machine (40 seeds x 4 rows: 5 minutes);
``--smoke`` runs 2 seeds of one row.

``--load-spread S`` adds other processes' load (``flows.simulation.SimServer.load_spread``);
``--memory-gb`` prices the plan on a machine with that much memory (whether candidates fit
beside the live backend).

Prints one row per (policy, plan): median and p90 minutes, decided %, qualified %, unserved
minutes (the stable port held while candidates run alone). ``--json``: last line
``{"rows": [{profile, policy, plan, truth, seeds, median_minutes, p90_minutes, decided_pct,
qualified_pct, unserved_minutes, ...}]}``.

    python benchmarks/cycle_cost.py --profile qwen27b-m5pro --seeds 40 [--json]
        [--load-spread 0.2] [--memory-gb 128]
    python benchmarks/cycle_cost.py --profile this-home --bundle evidence/<cycle id> [--json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import _common
import yaml

from mcp_infra.contracts import ConfigTruth, TargetProfile
from mcp_infra.flows.projection import (
    COST_RESAMPLES,
    profile_from_bundle,
    replay,
    sealed_bundles,
    simulated_plan,
)
from mcp_infra.flows.simulation import Projection, Setting, history_spread, project
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.store import Home

PROFILES = Path(__file__).resolve().parent / "profiles"
PLANS = {
    "drafters": ("drafter-1.9x", "drafter-1.4x"),
    "null": ("null-a", "null-b"),
}


def load_profile(name: str) -> TargetProfile:
    path = Path(name) if name.endswith((".yaml", ".yml")) else PROFILES / f"{name}.yaml"
    return TargetProfile.model_validate(yaml.safe_load(path.read_text()))


def _truth_words(truths: dict[str, ConfigTruth], base: ConfigTruth) -> str:
    return ",".join(f"{t.decode_tps / base.decode_tps:.2f}x" for t in truths.values())


def row(
    profile: TargetProfile,
    policy_name: str,
    plan_name: str,
    seeds: int,
    history_df: int = 0,
    spread_error: float = 1.0,
    *,
    load_spread: float = 0.0,
) -> dict:
    policy = load_policy(policy_name)
    names = PLANS[plan_name]
    truths = {f"sim:{n}": profile.candidates[n] for n in names}
    plan = simulated_plan(policy, list(truths))
    learned = history_spread(plan, profile, history_df, spread_error)
    protocol = plan.protocol.model_copy(update={"learned_spread": learned})
    plan = plan.model_copy(update={"protocol": protocol})
    runs: list[Projection] = [
        project(plan, profile, truths, Setting.of(policy, seed, load_spread=load_spread))
        for seed in range(seeds)
    ]
    return {
        "profile": profile.name,
        "policy": policy_name,
        "plan": plan_name,
        "truth": _truth_words(truths, profile.baseline),
        "history_df": history_df,
        "spread_error": spread_error,
        "load_spread": load_spread,
        "memory_gb": profile.memory_gb,
        **summary(runs),
    }


def summary(runs: list[Projection]) -> dict:
    """The figures of one row over its seeds."""
    seeds = len(runs)
    minutes = sorted(r.minutes for r in runs)
    p90 = minutes[min(len(minutes) - 1, round(0.9 * (len(minutes) - 1)))]
    return {
        "seeds": seeds,
        "median_minutes": round(statistics.median(minutes), 1),
        "p90_minutes": round(p90, 1),
        "decided_pct": round(100 * sum(r.decided for r in runs) / seeds, 1),
        "qualified_pct": round(100 * sum(r.outcome == "promoted" for r in runs) / seeds, 1),
        "unserved_minutes": round(statistics.median(r.unserved_s for r in runs) / 60, 1),
        "median_rounds": statistics.median(r.rounds for r in runs),
        "median_requests": statistics.median(r.requests for r in runs),
        "outcomes": {o: sum(r.outcome == o for r in runs) for o in {r.outcome for r in runs}},
        "example_reason": runs[0].reason[:300],
    }


def bundle_row(bundle: Path, seeds: int, resamples: int | None = None) -> dict:
    """A sealed bundle's own plan projected on the profile of its own measured timings, beside
    what the cycle measured (``resamples``: fewer bootstrap resamples than the plan's, as the
    product's own cost estimate takes)."""
    found = profile_from_bundle(bundle)
    if resamples:
        protocol = found.plan.protocol.model_copy(update={"bootstrap_resamples": resamples})
        found = found._replace(plan=found.plan.model_copy(update={"protocol": protocol}))
    runs = [replay(found, seed) for seed in range(seeds)]
    measured_min = found.measured.wall_s / 60
    out = {
        "profile": "this-home",
        "policy": found.policy.name if found.policy else "?",
        "plan": bundle.name,
        "truth": _truth_words(found.truths, found.profile.baseline),
        "history_df": 0,
        "spread_error": 1.0,
        **summary(runs),
        "measured_minutes": round(measured_min, 2),
        "measured_requests": found.measured.requests,
    }
    out["minutes_vs_measured"] = round(statistics.median(r.minutes for r in runs) / measured_min, 3)
    out["requests_vs_measured"] = round(out["median_requests"] / found.measured.requests, 3)
    out["derived"] = found.profile.model_dump(mode="json", exclude={"schema_version"})
    return out


def this_home(args) -> int:
    """``--profile this-home``: one row, the bundle's own plan against what it measured."""
    if args.bundle:
        bundle = Path(args.bundle)
    else:
        found = sealed_bundles(Home(args.home), limit=1) if args.home else []
        if not found:
            print("this-home needs --bundle DIR or --home DIR with a sealed cycle", file=sys.stderr)
            return 2
        bundle = found[0]
    seeds = 2 if args.smoke else args.seeds
    r = bundle_row(bundle, seeds, COST_RESAMPLES if args.smoke else None)
    print(f"profile this-home from {bundle}, {seeds} seeds")
    print("plan | policy | truth | median min | p90 min | measured min | requests | measured")
    print(
        f"{r['plan']} | {r['policy']} | {r['truth']} | {r['median_minutes']} | "
        f"{r['p90_minutes']} | {r['measured_minutes']} ({r['minutes_vs_measured']}x) | "
        f"{r['median_requests']} | {r['measured_requests']} ({r['requests_vs_measured']}x)  "
        f"(rounds {r['median_rounds']}, {r['outcomes']})"
    )
    _common.emit({"rows": [r]}, args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--profile", default="qwen27b-m5pro", help="a profile name or YAML path")
    ap.add_argument("--policies", default="single-user,default")
    ap.add_argument("--plans", default="drafters,null")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument(
        "--history-df",
        type=int,
        default=8,
        help="degrees of freedom of the home's learned start spread (0: no history)",
    )
    ap.add_argument("--spread-error", type=float, default=1.0, help="learned spread / true spread")
    ap.add_argument(
        "--load-spread",
        type=float,
        default=0.0,
        help="other processes' load: the log slowdown over one start is |N(0, this)|",
    )
    ap.add_argument("--memory-gb", type=float, help="the target's memory (the profile's else)")
    ap.add_argument("--bundle", help="this-home: a sealed bundle folder")
    ap.add_argument("--home", help="this-home: a home whose newest sealed bundle is used")
    args = ap.parse_args(argv)
    if args.profile == "this-home":
        return this_home(args)
    profile = load_profile(args.profile)
    if args.memory_gb:
        profile = profile.model_copy(update={"memory_gb": args.memory_gb})
    policies, plans, seeds = args.policies.split(","), args.plans.split(","), args.seeds
    if args.smoke:
        policies, plans, seeds = policies[:1], plans[:1], 2
    rows = [
        row(
            profile,
            p,
            plan,
            seeds,
            args.history_df,
            args.spread_error,
            load_spread=args.load_spread,
        )
        for p in policies
        for plan in plans
    ]
    head = ("policy", "plan", "truth", "median min", "p90 min", "decided", "qualified", "unserved")
    print(
        f"profile {profile.name} ({profile.memory_gb:g} GB), history {args.history_df} df "
        f"x{args.spread_error:g}, load spread {args.load_spread:g}, {seeds} seeds"
    )
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r['policy']} | {r['plan']} | {r['truth']} | "
            f"{r['median_minutes']} | "
            f"{r['p90_minutes']} | {r['decided_pct']}% | {r['qualified_pct']}% | "
            f"{r['unserved_minutes']} min  (rounds {r['median_rounds']}, "
            f"requests {r['median_requests']}, {r['outcomes']})"
        )
    _common.emit({"rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
