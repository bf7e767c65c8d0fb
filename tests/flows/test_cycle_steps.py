"""`run_steps` past the time budget: which steps are skipped, which end the cycle (pure: the
steps are stand-ins that record their names; the real steps are covered by the cycle tests)."""

from __future__ import annotations

from types import SimpleNamespace

from mcp_infra.contracts import Outcome
from mcp_infra.flows.cycle import PAST_BUDGET, STEPS, run_steps
from mcp_infra.flows.promotion import CycleResult


def context(clock: float, deadline: float) -> SimpleNamespace:
    notes: list[str] = []
    return SimpleNamespace(
        clock=lambda: clock,
        deadline=deadline,
        loaded=SimpleNamespace(policy=SimpleNamespace(budgets=SimpleNamespace(cycle_minutes=1))),
        journal=lambda state, text, **fields: notes.append(text),
        notes=notes,
    )


def recording(ran: list[str], end_at: str = "promote"):
    def step_named(name: str):
        def step(c) -> CycleResult | None:
            ran.append(name)
            return CycleResult(Outcome.PROMOTED, "x", "done") if name == end_at else None

        return step

    return [(name, step_named(name)) for name, _ in STEPS]


def test_within_the_budget_every_step_runs_in_order() -> None:
    ran: list[str] = []
    result = run_steps(context(clock=0, deadline=10), recording(ran))
    assert ran == [name for name, _ in STEPS]
    assert result.outcome == Outcome.PROMOTED


def test_past_the_budget_drift_is_skipped_select_runs_and_confirm_ends_the_cycle() -> None:
    ran: list[str] = []
    c = context(clock=11, deadline=10)
    result = run_steps(c, recording(ran))
    assert ran == ["preflight", "prepare", "baseline", "maintenance", "experiment", "select"]
    assert result.outcome == Outcome.KEPT_BASELINE
    assert "before the confirm step; the baseline is kept" in result.reason
    assert any("before the drift step; it is skipped" in n for n in c.notes)


def test_a_step_that_ends_the_cycle_past_the_budget_still_ends_it() -> None:
    """Select deciding 'no candidate qualified' is the result, not the budget note."""
    ran: list[str] = []
    result = run_steps(context(clock=11, deadline=10), recording(ran, end_at="select"))
    assert ran[-1] == "select" and result.outcome == Outcome.PROMOTED


def test_only_the_steps_after_the_experiment_look_at_the_budget() -> None:
    names = [name for name, _ in STEPS]
    assert set(PAST_BUDGET) < set(names[names.index("experiment") + 1 :])
    assert set(PAST_BUDGET.values()) <= {"skip", "end"}
