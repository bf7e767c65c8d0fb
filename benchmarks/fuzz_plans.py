"""Fuzz the plan path with N generated inputs (default 10,000) and print what became of them.

    .venv/bin/python benchmarks/fuzz_plans.py [N]

Every input must end as a valid frozen plan or a refusal; the property test in
tests/test_fuzz_plans.py asserts the invariants on each example and fails on the first breach.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_fuzz_plans as fuzz  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

from mcp_infra.core.sanitize import PlanRefused  # noqa: E402


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    outcomes: Counter[str] = Counter()
    started = time.monotonic()

    @settings(
        max_examples=count, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(fuzz.inputs)
    def run(raw: object) -> None:
        fuzz.test_any_input_freezes_validly_or_is_refused.hypothesis.inner_test(raw)
        try:
            fuzz.freeze(raw)
            outcomes["accepted (valid frozen plan)"] += 1
        except PlanRefused as exc:
            outcomes["refused: " + str(exc).removeprefix("plan refused: ").split(":")[0]] += 1

    run()
    total = sum(outcomes.values())
    print(f"{total} generated plans in {time.monotonic() - started:.1f} s; invariants held on all")
    print(f"{'outcome':48} {'count':>7}")
    for outcome, n in outcomes.most_common():
        print(f"{outcome[:48]:48} {n:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
