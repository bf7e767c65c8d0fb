"""Baseline drift: a machine that changed speed during the cycle makes it inconclusive."""

from __future__ import annotations

import pytest

from mcp_infra.contracts import Decision
from mcp_infra.core.selector import select
from mcp_infra.core.stats import baseline_drift
from tests.helpers.selector_runs import BASELINE, PROTOCOL, THRESHOLDS, make_run


def with_drift(factor: float):
    drift = [
        s.model_copy(update={"phase": "drift", "decode_tps": s.decode_tps * factor})
        for s in BASELINE.samples
        if s.phase == "measure"
    ]
    return BASELINE.model_copy(update={"samples": [*BASELINE.samples, *drift]})


def test_drift_is_the_geometric_mean_ratio_of_medians() -> None:
    assert baseline_drift(with_drift(0.8).samples) == pytest.approx(0.8)
    assert baseline_drift(BASELINE.samples) is None  # nothing re-measured


@pytest.mark.parametrize(
    ("factor", "decision"),
    [
        (1.0, Decision.QUALIFIED),
        (0.95, Decision.QUALIFIED),
        (0.7, Decision.INCONCLUSIVE),
        (1.4, Decision.INCONCLUSIVE),
    ],
)
def test_drift_beyond_tolerance_makes_qualified_inconclusive(
    factor: float, decision: Decision
) -> None:
    protocol = PROTOCOL.model_copy(update={"drift_check": True, "drift_tolerance_pct": 10.0})
    verdict = select(
        with_drift(factor),
        [make_run("m:fast", 1.5)],
        THRESHOLDS,
        protocol,
        {make_run("m:fast").candidate_class: True},
    )
    (cv,) = verdict.candidates
    assert cv.decision == decision
    assert verdict.baseline_drift == pytest.approx(factor)
    if decision == Decision.INCONCLUSIVE:
        assert verdict.selected is None and "drift tolerance" in cv.reasons[-1]


def test_drift_ignored_when_the_policy_does_not_ask() -> None:
    verdict = select(
        with_drift(0.5),
        [make_run("m:fast", 1.5)],
        THRESHOLDS,
        PROTOCOL,
        {make_run("m:fast").candidate_class: True},
    )
    assert verdict.selected == "m:fast" and verdict.baseline_drift is None
