"""Early stopping's schedule: what the look after each round of fresh starts may decide.

The round loop (``flows.rounds``) judges all data so far after each round. Whether that look may
qualify, only reject, or decide nothing depends on the round, the protocol's minimum of starts,
whether a learned start-to-start spread gives one start an interval, and, in a screened plan,
what the screening round timed. Pure: the cycle, the cost model and
``benchmarks/decision_quality.py`` ask the same functions.
"""

from __future__ import annotations

from enum import Enum

from mcp_infra.contracts import MeasureProtocol
from mcp_infra.core.screening import SCREEN_ROUND, screen_cell
from mcp_infra.core.workload import cell_key


class MayDecide(Enum):
    """What the look after a round may decide."""

    NOTHING = "nothing"
    REJECTIONS = "rejections"
    ANYTHING = "anything"


def early_rejections(protocol: MeasureProtocol) -> bool:
    """Whether the rounds before ``min_starts`` are judged for rejections: only where a learned
    spread gives one start an interval and the protocol stops futile candidates."""
    return protocol.learned_spread is not None and protocol.futility_confidence is not None


def may_decide(rounds_done: int, protocol: MeasureProtocol, *, screened: bool = False) -> MayDecide:
    """What the look after ``rounds_done`` rounds may decide. Before ``min_starts``: rejections
    where ``early_rejections``, else nothing. From ``min_starts`` on: anything, except on one
    start a side without a learned spread (a policy with ``min_starts: 1``): that side's
    interval would rest on the assumed spread alone, a guess about this machine, so the first
    look then waits for a second start. With history, one start a side decides (the learned
    spread with its degrees of freedom is its interval; the same alpha spending over the looks
    from the first start on keeps the error rate, docs/statistics.md), and the round loop holds
    back a busy start there (``history_alone``, ``flows.rounds.busy_so_far``). In a ``screened``
    plan the screening round times the headline cell alone: a look after it may qualify only
    where that is every decisive and guard cell of the workload (a gate start times none of
    them)."""
    early = MayDecide.REJECTIONS if early_rejections(protocol) else MayDecide.NOTHING
    if rounds_done < protocol.min_starts:
        return early
    if rounds_done < 2 and protocol.learned_spread is None:
        return MayDecide.NOTHING
    if screened and rounds_done == SCREEN_ROUND + 1 and not _screen_times_all(protocol):
        return early
    return MayDecide.ANYTHING


def _screen_times_all(protocol: MeasureProtocol) -> bool:
    """Whether a screening start times every decisive and guard cell: the headline is all."""
    head = cell_key(screen_cell(protocol))
    return all(cell_key(c) == head for c in protocol.workload if c.role in ("decisive", "guard"))


def history_alone(rounds_done: int, protocol: MeasureProtocol) -> bool:
    """Whether a look rests on history alone: before ``min_starts``, or on one start a side,
    where no spread of the cycle's own stands beside the learned one."""
    return rounds_done < max(2, protocol.min_starts)
