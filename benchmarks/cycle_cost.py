"""What a cycle costs on a target, and whether it decides: the product's own round loop
(``flows.simulation.project``: ``start_plan``, ``run_rounds``, ``next_round``, early stopping,
failed gates, ``select``, the drift re-measure, the held-out check, the time budget) over
simulated server starts. Only the server and the clock are simulated, from a target profile.

Profiles: ``qwen27b-m5pro`` (``benchmarks/profiles/qwen27b-m5pro.yaml``, every assumption in the
file) or a path to a profile YAML. Policies: shipped names or paths to policy YAML files (a home's
own, or one a person is weighing: ``protocol.max_tokens`` sets how long the greedy answers the gates
compare are, for instance). Plans: ``drafters`` (two drafters, one truly 1.9x and one 1.4x at one
request, both serial at four), ``null`` (two candidates truly 1.0x) and ``catalog`` (14 candidates
in 4 classes, a generated catalog for the 27B target: drafters at several draft lengths, server
settings, KV bits and quantized builds; ``CATALOG`` says each one's class, semantics and prompt
cache, the profile its assumed truths). A plan of 4 or more is screened (``core.screening``);
``--full-rigour`` adds each such row again without screening, and ``--assumed`` adds rows with every
figure the profile marks ASSUMED (the catalog's generated drafters, KV bits and quantized builds:
their load time, then their decode speed) halved and doubled. ``--reference`` adds each row again
as a later cycle on the same live configuration prices it: the baseline's greedy outputs and
quality answers kept from an earlier cycle (``core.reference``), not asked again. ``--breakdown``
prints where a row's median seed spent its simulated minutes.

``--profile this-home [--bundle DIR | --home DIR]``: the profile derived from a sealed bundle's
own measured timings (``flows.projection.profile_from_bundle``; ``--home``: its newest sealed
bundle), and the bundle's own plan under the policy it ran under, projected and set against what
the cycle measured (wall time, summary started_at..ended_at, and requests answered).

Target: on ``qwen27b-m5pro`` the ``single-user`` policy with the drafters promotes in >= 95% of
seeds, median <= 12 min (the goal is <= 8); the ``default`` policy decides (promotes, or rejects
naming the concurrency-4 loss) in >= 95%, median <= 30 min; the null plan qualifies in 0% of
seeds, median <= 30 min; the catalog, screened, median <= 30 min.

Takes: about 2 s per seed and row on a 2-core machine (40 seeds x 4 rows: 5 minutes);
``--smoke`` runs 2 seeds of one row.

``--load-spread S`` adds other processes' load (``flows.simulation.SimServer.load_spread``);
``--memory-gb`` prices the plan on a machine with that much memory (whether candidates fit
beside the live backend).

Prints one row per (policy, plan): median and p90 minutes (screening and deciding apart),
decided %, qualified %, unserved minutes (the stable port held while candidates run alone),
what screening dropped. ``--json``: last line ``{"rows": [{profile, policy, plan, truth,
seeds, median_minutes, p90_minutes, screening_minutes, deciding_minutes, decided_pct,
qualified_pct, unserved_minutes, screened_out, ...}]}``.

    python benchmarks/cycle_cost.py --profile qwen27b-m5pro --seeds 40 [--json]
        [--load-spread 0.2] [--memory-gb 128]
    python benchmarks/cycle_cost.py --profile qwen27b-m5pro --plans catalog --seeds 20
        --full-rigour --assumed [--breakdown]
    python benchmarks/cycle_cost.py --profile this-home --bundle evidence/<cycle id> [--json]
"""

from __future__ import annotations

import statistics
import sys
from functools import partial
from pathlib import Path
from typing import NamedTuple

import _common
import yaml

from mcp_infra.contracts import ConfigTruth, Knobs, Policy, Recipe, TargetProfile
from mcp_infra.core.screening import SCREEN_FROM
from mcp_infra.flows.projection import (
    COST_RESAMPLES,
    profile_from_bundle,
    replay,
    sealed_bundles,
    simulated_plan,
)
from mcp_infra.flows.simulation import Projection, Setting, history_spread, project, sim_recipe
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.filecache import load_yaml
from mcp_infra.state.store import Home

PROFILES = Path(__file__).resolve().parent / "profiles"
PLANS = {
    "drafters": ("drafter-1.9x", "drafter-1.4x"),
    "null": ("null-a", "null-b"),
}
# The generated catalog for the 27B target: plan id -> (the profile's truth, class, semantics,
# prompt cache off). Drafters run with the prompt cache off (one greedy pass; the pinned DFlash
# drafter in mlx_vlm.server keeps its default, two), as the catalog generates them.
CATALOG: dict[str, tuple[str, str, str, bool]] = {
    "dflash": ("drafter-1.9x", "acceleration_plugin", "lossless", False),
    "draft-0.6b-k2": ("draft-0.6b-k2", "acceleration_plugin", "lossless", True),
    "draft-0.6b-k4": ("draft-0.6b-k4", "acceleration_plugin", "lossless", True),
    "draft-1.7b-k2": ("draft-1.7b-k2", "acceleration_plugin", "lossless", True),
    "prefill-512": ("setting-null", "server_tuning", "lossless", False),
    "pcache-off": ("setting-null", "server_tuning", "lossless", True),
    "decode-c4": ("setting-null", "server_tuning", "lossless", False),
    "prompt-c2": ("setting-null", "server_tuning", "lossless", False),
    "kv8": ("kv8", "kv_cache", "lossy", False),
    "kv4": ("kv4", "kv_cache", "lossy", False),
    "build-q3": ("build-q3", "quantization", "lossy", False),
    "build-mxfp4": ("build-mxfp4", "quantization", "lossy", False),
    "build-q6": ("build-q6", "quantization", "lossy", False),
    "build-q8": ("build-q8", "quantization", "lossy", False),
}
PLANS["catalog"] = tuple(CATALOG)
ASSUMED = ("draft-0.6b-k2", "draft-0.6b-k4", "draft-1.7b-k2", "kv8", "kv4", "build-")
"""The truths the profile marks ASSUMED (no public figure): generated drafters, KV bits and
quantized builds (a name starting with an entry)."""


def load_profile(name: str) -> TargetProfile:
    path = Path(name) if name.endswith((".yaml", ".yml")) else PROFILES / f"{name}.yaml"
    return TargetProfile.model_validate(yaml.safe_load(path.read_text()))


def policy_of(name: str) -> tuple[str, Policy]:
    """A shipped policy by name, or a policy YAML by path (a person's own, as a home keeps it):
    (the name the table shows, the policy)."""
    if not name.endswith((".yaml", ".yml")):
        return name, load_policy(name)
    path = Path(name)
    try:
        return path.stem, Policy.model_validate(load_yaml(path))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SystemExit(f"--policies {name}: {exc}") from exc


def _truth_words(truths: dict[str, ConfigTruth], base: ConfigTruth) -> str:
    return ",".join(f"{t.decode_tps / base.decode_tps:.2f}x" for t in truths.values())


def plan_truths(
    profile: TargetProfile, plan_name: str, scale: tuple[str, float] | None = None
) -> tuple[dict[str, ConfigTruth], dict[str, Recipe]]:
    """The plan's candidates as ``sim:<id>`` with their truths (``scale``: one figure of every
    ASSUMED truth times a factor: ``("load_s", 0.5)``, ``("decode_tps", 2)``) and recipes."""
    truths: dict[str, ConfigTruth] = {}
    recipes: dict[str, Recipe] = {}
    for name in PLANS[plan_name]:
        cid = f"sim:{name}"
        truth_name, klass, semantics, cache_off = CATALOG.get(
            name, (name, "acceleration_plugin", "lossless", False)
        )
        truth = profile.candidates[truth_name]
        if scale and truth_name.startswith(ASSUMED):
            what, factor = scale
            update: dict[str, object] = {what: getattr(truth, what) * factor}
            if what == "decode_tps":
                update["batch_tps"] = {n: v * factor for n, v in truth.batch_tps.items()}
            truth = truth.model_copy(update=update)
        truths[cid] = truth
        recipes[cid] = sim_recipe(cid, semantics).model_copy(
            update={
                "candidate_class": klass,
                "knobs": Knobs(prompt_cache_size=0) if cache_off else Knobs(),
            }
        )
    return truths, recipes


class Conditions(NamedTuple):
    """What every row of a run shares besides its plan: the home's history (degrees of freedom
    of its learned spread and how wrong it is), other processes' load, the resamples per look
    (None: the policy's)."""

    history_df: int = 0
    spread_error: float = 1.0
    load_spread: float = 0.0
    resamples: int | None = None


def row(
    profile: TargetProfile,
    policy_name: str,
    plan_name: str,
    seeds: int,
    conditions: Conditions | None = None,
    variant: Variant | None = None,
) -> dict:
    c = conditions or Conditions()
    variant = variant or Variant()
    policy_name, policy = policy_of(policy_name)
    truths, recipes = plan_truths(profile, plan_name, variant.scale)
    plan = simulated_plan(policy, list(truths))
    learned = history_spread(plan, profile, c.history_df, c.spread_error)
    update: dict[str, object] = {"learned_spread": learned}
    if c.resamples:
        update["bootstrap_resamples"] = c.resamples
    protocol = plan.protocol.model_copy(update=update)
    plan = plan.model_copy(update={"protocol": protocol})
    setting = partial(
        Setting.of,
        policy,
        load_spread=c.load_spread,
        screening=variant.screening,
        reference=variant.reference,
    )
    runs: list[Projection] = [
        project(plan, profile, truths, setting(seed), recipes) for seed in range(seeds)
    ]
    return {
        "profile": profile.name,
        "policy": policy_name,
        "plan": plan_name + variant.label,
        "truth": _truth_words(truths, profile.baseline),
        "history_df": c.history_df,
        "spread_error": c.spread_error,
        "load_spread": c.load_spread,
        "memory_gb": profile.memory_gb,
        **summary(runs),
    }


class Variant(NamedTuple):
    """A row's variation of its plan: screening forced off (the full-rigour comparison), one
    ASSUMED figure scaled, or a later cycle on the same live configuration (its answers kept:
    ``core.reference``)."""

    screening: bool | None = None
    scale: tuple[str, float] | None = None
    reference: bool = False

    @property
    def label(self) -> str:
        if self.reference:
            return " (answers kept)"
        if self.screening is False:
            return " (full rigour)"
        if self.scale:
            what = "load" if self.scale[0] == "load_s" else "decode"
            return f" (assumed {what} x{self.scale[1]:g})"
        return ""


def summary(runs: list[Projection]) -> dict:
    """The figures of one row over its seeds."""
    seeds = len(runs)
    minutes = sorted(r.minutes for r in runs)
    p90 = minutes[min(len(minutes) - 1, round(0.9 * (len(minutes) - 1)))]
    dropped: dict[str, int] = {}
    for r in runs:
        for name in r.screened_out:
            dropped[name] = dropped.get(name, 0) + 1
    middle = sorted(runs, key=lambda r: r.minutes)[(seeds - 1) // 2]
    return {
        "seeds": seeds,
        "median_minutes": round(statistics.median(minutes), 1),
        "p90_minutes": round(p90, 1),
        "screening_minutes": round(statistics.median(r.screening_s for r in runs) / 60, 1),
        "deciding_minutes": round(
            statistics.median(r.minutes - r.screening_s / 60 for r in runs), 1
        ),
        "screened_out": dropped,
        "decisions": _decisions(runs),
        "median_seed_spent": {k: round(v / 60, 2) for k, v in (middle.spent or {}).items()},
        "decided_pct": round(100 * sum(r.decided for r in runs) / seeds, 1),
        "qualified_pct": round(100 * sum(r.outcome == "promoted" for r in runs) / seeds, 1),
        "unserved_minutes": round(statistics.median(r.unserved_s for r in runs) / 60, 1),
        "median_rounds": statistics.median(r.rounds for r in runs),
        "median_requests": statistics.median(r.requests for r in runs),
        "outcomes": {o: sum(r.outcome == o for r in runs) for o in {r.outcome for r in runs}},
        "example_reason": runs[0].reason[:300],
    }


def _decisions(runs: list[Projection]) -> dict[str, dict[str, int]]:
    """Per candidate, how often each decision was reached (screening's drops as
    ``screened out``)."""
    out: dict[str, dict[str, int]] = {}
    for r in runs:
        for v in r.verdict.candidates if r.verdict else []:
            dropped = (
                r.verdict and r.verdict.screening and v.candidate in r.verdict.screening.dropped
            )
            what = "screened out" if dropped else v.decision.value
            name = v.candidate.removeprefix("sim:")
            out.setdefault(name, {})[what] = out.setdefault(name, {}).get(what, 0) + 1
    return out


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
    ap.add_argument(
        "--policies",
        default="single-user,default",
        help="shipped policy names or policy YAML paths, comma-separated",
    )
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
    ap.add_argument(
        "--resamples",
        type=int,
        help=f"bootstrap resamples per look (the policy's else; the product's own cost "
        f"estimate takes {COST_RESAMPLES}: rounds and requests do not move with the last digits "
        "of a bound)",
    )
    ap.add_argument(
        "--full-rigour",
        action="store_true",
        help="a screened plan's row again without screening (every candidate decided in full)",
    )
    ap.add_argument(
        "--assumed",
        action="store_true",
        help="rows with the ASSUMED truths' load time, then decode speed, halved and doubled",
    )
    ap.add_argument(
        "--reference",
        action="store_true",
        help="each row again as a later cycle on the same live configuration: the baseline's "
        "greedy outputs and quality answers kept from the cycle that asked them",
    )
    ap.add_argument(
        "--breakdown", action="store_true", help="where each row's median seed spent its minutes"
    )
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
    conditions = Conditions(args.history_df, args.spread_error, args.load_spread, args.resamples)
    rows = [
        row(profile, p, plan, seeds, conditions, variant)
        for p in policies
        for plan in plans
        for variant in variants(plan, args)
    ]
    print(
        f"profile {profile.name} ({profile.memory_gb:g} GB), history {args.history_df} df "
        f"x{args.spread_error:g}, load spread {args.load_spread:g}, {seeds} seeds"
    )
    print(_common.table(rows, COLUMNS))
    for r in rows:
        print(f"{r['policy']} | {r['plan']}: {r['outcomes']}; screened out {r['screened_out']}")
        if args.breakdown:
            print(f"    median seed, minutes by what: {r['median_seed_spent']}")
            print(f"    decisions over seeds: {r['decisions']}")
    _common.emit({"rows": rows}, args.json)
    return 0


COLUMNS = (
    ("policy", "policy"),
    ("plan", "plan"),
    ("truth", "truth"),
    ("median_minutes", "median min"),
    ("screening_minutes", "screening"),
    ("deciding_minutes", "deciding"),
    ("p90_minutes", "p90 min"),
    ("decided_pct", "decided %"),
    ("qualified_pct", "qualified %"),
    ("unserved_minutes", "unserved min"),
    ("median_rounds", "rounds"),
    ("median_requests", "requests"),
)


def variants(plan: str, args) -> list[Variant]:
    """The rows of one plan: as the cycle runs it, then (``--reference``) as a later cycle on
    the same live configuration runs it, then (a screened plan, ``--full-rigour``) without
    screening, then (``--assumed``) the ASSUMED figures halved and doubled."""
    out = [Variant()]
    if args.reference:
        out.append(Variant(reference=True))
    if args.full_rigour and len(PLANS[plan]) >= SCREEN_FROM:
        out.append(Variant(screening=False))
    if args.assumed:
        out += [Variant(scale=(w, f)) for w in ("load_s", "decode_tps") for f in (0.5, 2.0)]
    return out


if __name__ == "__main__":
    sys.exit(main())
