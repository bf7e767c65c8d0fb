"""A continuous measure of how closely a lossy candidate follows the baseline, on the same prompts.

Each prompt's greedy output (the greedy passes and the quality tasks, temperature 0, the same
messages on both sides) is matched with the baseline's first answer; a candidate that answered a
prompt twice (again with its prefix cached) gives two pairs of that prompt. Per pair:

- **identical**: the token ids are equal (the texts, where a runtime gives no token ids);
- **shared prefix**: how many leading tokens (characters, without ids) are equal;
- where both sides carry the runtime's top-k log-probabilities (``Sample.top_logprobs``), the
  next-token distributions at each position from the first up to and including the first
  differing token, where both sides decode from the same context (after it the contexts differ
  and the two distributions answer different questions), as llama.cpp's ``llama-perplexity
  --kl-divergence`` compares a quantized model with its source:
  - **KL divergence**, baseline P to candidate Q, from top-k lists (``next_token_kl``);
  - **top-token agreement**: whether the most likely token is the same on both sides.

Aggregates: the share of pairs identical, the mean shared prefix per pair, the mean KL per
compared position (pooled over prompts, as llama.cpp's mean KLD), and the share of compared
positions whose top token agrees. Each has an interval from a seeded bootstrap that resamples
prompts (both answers of a prompt asked twice travel together), percentile at ``level``.
Pure: samples in, figures out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from mcp_infra.contracts import Interval, QualityMeasure, Sample

# Top log-probabilities asked per output token. mlx_lm.server 0.32.2 allows at most 11 and
# returns, with them, the list only: the chosen token is its most likely entry (greedy).
TOP_LOGPROBS = 10
# A probability the candidate gives no mass to is taken as this, so KL stays finite.
PROB_FLOOR = 1e-10

TopList = Sequence[tuple[int, float]]


def top_token(entries: TopList) -> int | None:
    """The most likely token of a top-k list; ties go to the lowest id, as MLX's argmax picks
    the first of equal values, so this is the token greedy decoding chose."""
    if not entries:
        return None
    return max(entries, key=lambda e: (e[1], -e[0]))[0]


def next_token_kl(baseline: TopList, candidate: TopList) -> float:
    """KL(P || Q) in nats of one position's next-token distributions, from top-k lists.

    The bins are the baseline's top-k tokens and one bin for every other token. P is exact on
    them: each listed token's probability, and the rest 1 - their sum. Q of a listed token is
    the candidate's probability where its own list has the token; the tokens missing from its
    list share the mass its list leaves over (1 - its sum) evenly, each capped at its smallest
    listed probability (a token off its list is no likelier than any on it); Q's other-bin is
    what that leaves. Both sides then sum to 1, so the figure is never negative. Merging bins
    can only lower KL (data processing): where both lists hold the same tokens this is a lower
    bound of the full-vocabulary KL that is tight when the tail is small; the share given to
    missing tokens is an estimate that can err either way. Probabilities are floored at
    ``PROB_FLOOR``.
    """
    p = {token: math.exp(lp) for token, lp in baseline}
    q = {token: math.exp(lp) for token, lp in candidate}
    missing = [token for token in p if token not in q]
    q_left = max(0.0, 1.0 - sum(q.values()))
    share = min(min(q.values(), default=0.0), q_left / len(missing)) if missing else 0.0
    q_on = {token: q.get(token, share) for token in p}
    p_rest = max(0.0, 1.0 - sum(p.values()))
    q_rest = max(0.0, 1.0 - sum(q_on.values()))
    total = sum(pi * math.log(pi / max(q_on[t], PROB_FLOOR)) for t, pi in p.items() if pi > 0)
    if p_rest > 0:
        total += p_rest * math.log(p_rest / max(q_rest, PROB_FLOOR))
    return max(0.0, total)


@dataclass(frozen=True)
class PairFigures:
    """One candidate answer against the baseline's answer to the same prompt."""

    prompt: str
    identical: bool
    prefix: int
    tokens: bool  # compared by token ids (else by text)
    kl: float = 0.0  # summed over the compared positions
    agree: int = 0
    positions: int = 0
    top_k: int | None = None
    asked: bool = False  # both sides asked for log-probabilities (top_logprobs is not None)


def _first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def pair_figures(prompt: str, baseline: Sample | None, candidate: Sample | None) -> PairFigures:
    """The figures of one pair; a missing or failed answer on either side is not identical and
    shares nothing."""
    if baseline is None or candidate is None or baseline.error or candidate.error:
        return PairFigures(prompt, identical=False, prefix=0, tokens=False)
    tokens = baseline.token_ids is not None and candidate.token_ids is not None
    seqs: tuple[Sequence[object], Sequence[object]] = (
        (baseline.token_ids or [], candidate.token_ids or [])
        if tokens
        else (baseline.text, candidate.text)
    )
    at = _first_difference(*seqs)
    prefix = len(seqs[0]) if at is None else at
    figures = PairFigures(prompt, at is None, prefix, tokens)
    tops = baseline.top_logprobs, candidate.top_logprobs
    if tops[0] is None or tops[1] is None:
        return figures
    n = min(len(tops[0]), len(tops[1]))
    upto = n if at is None else min(at + 1, n)
    compared = [(b, c) for b, c in zip(tops[0][:upto], tops[1][:upto], strict=True) if b and c]
    return PairFigures(
        prompt,
        figures.identical,
        prefix,
        tokens,
        kl=sum(next_token_kl(b, c) for b, c in compared),
        agree=sum(top_token(b) == top_token(c) for b, c in compared),
        positions=len(compared),
        top_k=min((min(len(b), len(c)) for b, c in compared), default=None),
        asked=True,
    )


def matched_answers(
    baseline: Sequence[Sample], candidate: Sequence[Sample], group: str = ""
) -> list[PairFigures]:
    """Every candidate answer matched with the baseline's first answer to its prompt (by repeat,
    then order); a prompt one side lacks pairs with nothing. ``group`` prefixes the prompt key
    (greedy passes and quality tasks may share ids)."""
    key = lambda s: (s.prompt_id, s.repeat, s.order)  # noqa: E731
    first: dict[str, Sample] = {}
    for s in sorted(baseline, key=key):
        first.setdefault(s.prompt_id, s)
    answers: dict[str, list[Sample]] = {}
    for s in sorted(candidate, key=key):
        answers.setdefault(s.prompt_id, []).append(s)
    out = []
    for pid in sorted(set(first) | set(answers)):
        given: list[Sample | None] = list(answers.get(pid, [])) or [None]
        out += [pair_figures(group + pid, first.get(pid), answer) for answer in given]
    return out


# --------------------------------------------------------------------------------------------
# Aggregates and their bootstrap intervals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sums:
    pairs: int = 0
    identical: int = 0
    prefix: int = 0
    kl: float = 0.0
    agree: int = 0
    positions: int = 0

    def __add__(self, other: _Sums) -> _Sums:
        return _Sums(
            self.pairs + other.pairs,
            self.identical + other.identical,
            self.prefix + other.prefix,
            self.kl + other.kl,
            self.agree + other.agree,
            self.positions + other.positions,
        )

    def values(self) -> tuple[float, float, float | None, float | None]:
        """(identical share, mean prefix, mean KL, top agreement); None without positions."""
        pos = self.positions
        return (
            self.identical / self.pairs,
            self.prefix / self.pairs,
            self.kl / pos if pos else None,
            self.agree / pos if pos else None,
        )


def _clusters(pairs: Sequence[PairFigures]) -> list[_Sums]:
    by_prompt: dict[str, _Sums] = {}
    for p in pairs:
        one = _Sums(1, int(p.identical), p.prefix, p.kl, p.agree, p.positions)
        by_prompt[p.prompt] = by_prompt.get(p.prompt, _Sums()) + one
    return [by_prompt[k] for k in sorted(by_prompt)]


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _interval(value: float, draws: list[float], level: float) -> Interval:
    if not draws:
        return Interval(value=value, low=value, high=value)
    draws.sort()
    tail = (1 - level) / 2
    low, high = _quantile(draws, tail), _quantile(draws, 1 - tail)
    return Interval(value=value, low=min(low, value), high=max(high, value))


def measure(
    pairs: Sequence[PairFigures], *, level: float, resamples: int, seed: int
) -> QualityMeasure | None:
    """The aggregates of ``pairs`` with their bootstrap intervals (module docstring); None when
    there is no pair."""
    clusters = _clusters(pairs)
    if not clusters:
        return None
    total = sum(clusters, _Sums())
    share, prefix, kl, agree = total.values()
    rng = random.Random(seed)
    columns = [
        [getattr(c, name) for c in clusters]
        for name in ("pairs", "identical", "prefix", "kl", "agree", "positions")
    ]
    draws: list[list[float]] = [[], [], [], []]
    indices = range(len(clusters))
    for _ in range(resamples):
        drawn = rng.choices(indices, k=len(clusters))
        sums = _Sums(*(sum(map(column.__getitem__, drawn)) for column in columns))
        for into, value in zip(draws, sums.values(), strict=True):
            if value is not None:
                into.append(value)
    with_lp = [p for p in pairs if p.positions]
    return QualityMeasure(
        pairs=len(pairs),
        prompts=len(clusters),
        unit="tokens" if all(p.tokens for p in pairs) else "characters",
        identical_share=_interval(share, draws[0], level),
        prefix_length=_interval(prefix, draws[1], level),
        mean_kl=_interval(kl, draws[2], level) if kl is not None else None,
        top_agreement=_interval(agree, draws[3], level) if agree is not None else None,
        positions=total.positions,
        top_k=min((p.top_k for p in with_lp if p.top_k is not None), default=None),
        level=level,
        resamples=resamples,
    )
