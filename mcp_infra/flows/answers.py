"""A configuration's kept answers around a cycle (``core.reference`` says what is kept and why,
``state.references`` where): what a cycle keeps of the answers its runs measured, and whether a
plan's baseline would find its greedy pass kept (its projection then prices none).
"""

from __future__ import annotations

from typing import Literal

from mcp_infra.contracts import CandidateRun, FrozenPlan, MeasureProtocol, Recipe
from mcp_infra.core.reference import answers_of, take
from mcp_infra.core.suites import SuitePrompt
from mcp_infra.flows.confirm import heldout_protocol
from mcp_infra.flows.measure import first_asks, prompts_by_class
from mcp_infra.state import references
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.store import Home

Split = Literal["selection", "heldout"]


def _asked(protocol: MeasureProtocol, split: Split) -> tuple[list[SuitePrompt], list[SuitePrompt]]:
    """What a first start over ``split`` asks: its greedy pass, and the quality tasks (the
    held-out check asks none)."""
    if split == "heldout":
        protocol = heldout_protocol(protocol)
    return first_asks(protocol, prompts_by_class(load_suite(protocol.suite), split))


def keep(
    home: Home, plan: FrozenPlan, cycle_id: str, recipe: Recipe, run: CandidateRun, split: Split
) -> None:
    """What ``run`` measured of ``recipe``'s answers (its first greedy pass over the ``split``
    prompts, its quality answers), kept for a later cycle whose baseline it is. A write that
    fails costs that cycle only the time of asking again."""
    every, tasks = _asked(plan.protocol, split)
    answers = answers_of(run, every, tasks, plan.protocol.max_tokens, cycle_id)
    try:
        references.keep(home, recipe, answers)
    except OSError:
        return


def kept_for(home: Home, recipe: Recipe, protocol: MeasureProtocol) -> bool:
    """Whether a cycle under ``protocol`` on ``recipe`` as its baseline finds its greedy pass
    over the selection prompts kept (a projection then prices none; the held-out pass, kept
    with it by every cycle that promoted or checked a winner, is priced as kept too)."""
    every, _ = _asked(protocol, "selection")
    kept = references.load(home, recipe)
    cap = protocol.max_tokens
    return bool(take(kept, every, [], cap, phase="measure", logprobs=False).greedy)
