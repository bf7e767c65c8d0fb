"""Fuzz the plan path with N generated inputs and count what became of them.

What: anything an agent sends must end as a valid frozen plan or a clear refusal: never a crash,
a candidate outside the registry, a threshold looser than the policy allows, or a refusal that
repeats a key the sender invented (a plain word excepted). Each input goes through the product's
own `parse_plan` and `freeze_plan` against a real demo home (the demo models, this machine's
host facts); the inputs come from a seeded generator (plans nearly valid, plans with anything in
any field, their JSON text, any JSON, any text), independent of the property test in
tests/core/test_fuzz_plans.py, which asserts the same invariants with hypothesis on a few hundred
examples.

Target: no invariant broken (exit status 1 if one is; the first breaches are printed).
Takes: 10,000 inputs took 53 s on this 2-core machine (loaded); --smoke: 50 inputs, seconds.

    .venv/bin/python benchmarks/fuzz_plans.py [N] [--seed S] [--json] [--smoke]
"""

from __future__ import annotations

import json
import random
import string
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common

from mcp_infra.contracts import BASELINE_ID, FrozenPlan
from mcp_infra.core.preflight import all_candidates
from mcp_infra.core.sanitize import PlanRefused, parse_plan, shown_name
from mcp_infra.demo.homes import make_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.flows.proposal import freeze_plan
from mcp_infra.state.context import HomeContext

PLAN_FIELDS = {"hypothesis", "candidates", "acceptance", "notes"}
# Injection, traversal and control text, alone or grafted onto a real id (see Inputs.nasty).
HOSTILE = ["$(reboot)", "; rm -rf /", "`id`", "../../etc/passwd", "\x00", "--trust-remote-code"]
CHARS = string.printable + "éü€漢\u200b\ufeff\x00\x7f"
ONE_LINE = string.ascii_letters + string.digits + string.punctuation + " éü€漢"


class Inputs:
    """Seeded random inputs in the shapes an agent (or an attacker) may send."""

    def __init__(self, seed: int, ids: list[str]) -> None:
        self.rng = random.Random(seed)
        self.ids = ids

    def text(self, most: int, chars: str = CHARS) -> str:
        return "".join(self.rng.choice(chars) for _ in range(self.rng.randint(0, most)))

    def number(self) -> Any:
        pick = self.rng.randrange(6)
        if pick == 0:
            return self.rng.choice([float("nan"), float("inf"), -float("inf"), -0.0])
        if pick == 1:
            return self.rng.randint(-(10**9), 10**9)
        if pick == 2:
            return self.text(10)
        if pick == 3:
            return self.rng.choice([None, True, False])
        return self.rng.uniform(-1e6, 1e6)

    def any_json(self, depth: int = 2) -> Any:
        pick = self.rng.randrange(7 if depth > 0 else 5)
        if pick == 5:
            return [self.any_json(depth - 1) for _ in range(self.rng.randint(0, 4))]
        if pick == 6:
            return {self.text(10): self.any_json(depth - 1) for _ in range(self.rng.randint(0, 4))}
        return [None, self.rng.choice([True, False]), self.number(), self.text(50), 1.5][pick]

    def nasty(self) -> str:
        """An id that is almost one of the registry's, or hostile text."""
        real = self.rng.choice(self.ids)
        family, _, variant = real.partition(":")
        return self.rng.choice(
            [
                "",
                "baseline",
                self.rng.choice(HOSTILE),
                f"{real} {self.rng.choice(HOSTILE)}",
                f"{real}\n",
                real.upper(),
                f"{family}:",
                f":{variant}",
                "x" * 200,
                "é:ü",
            ]
        )

    def candidate(self) -> str:
        pick = self.rng.randrange(3)
        if pick == 0:
            return self.rng.choice(self.ids)
        return self.nasty() if pick == 1 else self.text(140)

    def near_valid(self) -> dict[str, Any]:
        """Well formed but for what is probed: most of these reach sanitization."""
        plan: dict[str, Any] = {
            "hypothesis": self.text(300, ONE_LINE) or "h",
            "candidates": [
                self.rng.choice(self.ids) if self.rng.random() < 0.7 else self.nasty()
                for _ in range(self.rng.randint(1, 3))
            ],
        }
        if self.rng.random() < 0.5:
            plan["acceptance"] = {
                k: self.rng.uniform(-1e6, 1e6)
                for k in ("min_speedup_pct", "max_peak_memory_gb")
                if self.rng.random() < 0.5
            }
        if self.rng.random() < 0.3:
            plan["notes"] = self.text(300, ONE_LINE)
        return plan

    def anything(self) -> dict[str, Any]:
        """Every field of any type, and keys nobody asked for."""
        plan: dict[str, Any] = {
            "hypothesis": self.text(400) if self.rng.random() < 0.5 else self.any_json(),
            "candidates": [self.candidate() for _ in range(self.rng.randint(0, 5))]
            if self.rng.random() < 0.6
            else self.any_json(),
        }
        if self.rng.random() < 0.5:
            plan["acceptance"] = {
                "min_speedup_pct": self.number(),
                "max_peak_memory_gb": self.number(),
                "surprise": self.any_json(),
            }
        for key in ("notes", "argv", "template", self.text(12)):
            if self.rng.random() < 0.3:
                plan[key] = self.any_json()
        return plan

    def next(self) -> tuple[str, Any]:
        shape = self.rng.choice(
            ["near-valid", "near-valid", "near-valid as JSON text", "anything"]
            + ["anything as JSON text", "any JSON", "any text"]
        )
        if shape.startswith("near-valid"):
            raw: Any = self.near_valid()
        elif shape.startswith("anything"):
            raw = self.anything()
        else:
            raw = self.any_json() if shape == "any JSON" else self.text(300)
        return shape, json.dumps(raw) if shape.endswith("JSON text") else raw


def breaches(ctx: HomeContext, raw: Any) -> tuple[str, list[str]]:
    """(the outcome, the invariants it broke) for one input."""
    try:
        frozen = freeze_plan(ctx, parse_plan(raw), "fuzz")
    except PlanRefused as exc:
        message = str(exc)
        broken = [] if message.startswith("plan refused") else ["refusal not in our words"]
        broken += ["refusal over 2000 characters"] if len(message) >= 2000 else []
        if isinstance(raw, dict):
            # A plain-word key is named back on purpose (shown_name); any other must not be,
            # except where the same refusal for renamed keys says it anyway.
            invented = [
                k
                for k in raw
                if k not in PLAN_FIELDS and len(k) > 3 and shown_name(k) != k and k in message
            ]
            if invented:
                renamed = {
                    (f"k{i}" if k in invented else k): v for i, (k, v) in enumerate(raw.items())
                }
                again = ""
                try:
                    freeze_plan(ctx, parse_plan(renamed), "fuzz")
                except PlanRefused as other:
                    again = str(other)
                if any(k not in again for k in invented):
                    broken.append("a refusal repeats a key the sender invented")
        reason = message.removeprefix("plan refused: ").split(":")[0]
        return "refused: " + reason, broken
    except Exception as exc:  # the breach this benchmark looks for
        return "CRASHED", [f"{type(exc).__name__}: {exc}"[:200]]
    rest = frozen.candidates[1:]
    limits = ctx.policy.thresholds
    checks = {
        "the baseline is not first": frozen.candidates[0] == BASELINE_ID,
        "not 1-3 distinct candidates": 1 <= len(rest) <= 3 and len(set(rest)) == len(rest),
        "a candidate outside the registry": set(rest) <= set(all_candidates(ctx.manifests)),
        "min speedup outside the policy's bounds": (
            limits.min_speedup_pct.default
            <= frozen.thresholds.min_speedup_pct
            <= limits.min_speedup_pct.high
        ),
        "memory cap above the policy's": (
            frozen.thresholds.max_peak_memory_gb <= limits.max_peak_memory_gb.default
        ),
        "frozen plan does not round-trip": (
            FrozenPlan.model_validate_json(frozen.model_dump_json()) == frozen
        ),
        "a refused id unbounded": all(
            len(r.id) <= 130 and "\n" not in r.id for r in frozen.refused
        ),
    }
    broken = [name for name, held in checks.items() if not held]
    return "accepted (valid frozen plan)", broken


def main() -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("count", nargs="?", type=int, default=10_000, help="inputs (default 10,000)")
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    count = 50 if args.smoke else args.count
    with tempfile.TemporaryDirectory(prefix="mcp-infra-fuzz-") as tmp:
        models = build_demo_models(Path(tmp) / "models")
        ctx = HomeContext(make_home(Path(tmp) / "home", models))
        inputs = Inputs(args.seed, all_candidates(ctx.manifests))
        outcomes: Counter[str] = Counter()
        shapes: Counter[str] = Counter()
        found: list[dict[str, Any]] = []  # the first breaches
        breached = 0
        started = time.monotonic()
        for _ in range(count):
            shape, raw = inputs.next()
            outcome, broken = breaches(ctx, raw)
            outcomes[outcome] += 1
            shapes[shape] += 1
            breached += bool(broken)
            if broken and len(found) < 10:
                found.append({"input": repr(raw)[:300], "outcome": outcome, "broken": broken})
        took = time.monotonic() - started
    print(
        f"{count} generated inputs (seed {args.seed}) in {took:.1f} s; "
        + (f"{breached} broke an invariant" if breached else "invariants held on all")
    )
    rows = [{"outcome": o[:60], "count": n} for o, n in outcomes.most_common()]
    print(_common.table(rows, [("outcome", "outcome"), ("count", "count")]))
    for breach in found:
        print(f"BREACH {breach['broken']}: {breach['input']}")
    _common.emit(
        {
            "inputs": count,
            "seed": args.seed,
            "seconds": round(took, 1),
            "outcomes": dict(outcomes),
            "shapes": dict(shapes),
            "breached": breached,
            "first_breaches": found,
        },
        args.json,
    )
    return 1 if breached else 0


if __name__ == "__main__":
    raise SystemExit(main())
