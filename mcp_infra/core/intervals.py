"""Intervals and quantiles of the decision: Student t and F distributions, Welch intervals,
the early-stopping looks, and the start-to-start spread pooled with a learned one.

Pure and self-contained: ``core.stats`` builds a speedup summary on these, and the selector
judges workload cells with ``log_interval``. The derivations are in docs/statistics.md.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log x)); math.fsum makes the sum exact, hence independent of order."""
    if not values:
        raise ValueError("geometric mean of nothing")
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (type 7) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of nothing")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


ASSUMED_START_NOISE = 0.05
"""Start-to-start spread (log sd per start) assumed when a configuration has a single start."""


def sample_variance(values: Sequence[float]) -> float:
    """The sample variance (n - 1 in the denominator); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def corrected_variance(boot_variance: float, starts: int) -> tuple[float, float]:
    """(variance, degrees of freedom) of a configuration's mean log level from its starts.

    S >= 2 starts: the bootstrap variance scaled by S/(S-1), with S-1 degrees of freedom. One
    start: its within-start variance plus the assumed start-to-start variance, taken as known.
    """
    if starts >= 2:
        return boot_variance * starts / (starts - 1), float(starts - 1)
    return boot_variance + ASSUMED_START_NOISE**2, math.inf


class Spread(NamedTuple):
    """A learned start-to-start spread: the sd of a configuration's per-start log level, and
    the degrees of freedom it was estimated with (``MeasureProtocol.learned_spread``)."""

    sd: float
    df: int


PRIOR_STARTS = 3
"""History speaks for the first looks only: from this many starts on a side's own spread decides
alone, so a learned spread that is wrong (a noisier or a quieter machine then) cannot cost the
long cycles their power or their error rate."""

PRIOR_MAX_DF = 4
"""History counts as at most this many degrees of freedom in the pool, however many it has: a
machine that became noisier than its history cannot be seen by an F test on one or two starts,
so history may narrow an early look only as much as four starts of this cycle would (a history
half as noisy as the machine then keeps the error rate within its bound: docs/statistics.md)."""

SPREAD_CONSISTENCY = 0.99
"""A cycle's own spread that exceeds the learned one beyond this F quantile disagrees with
history: the cycle's spread alone is used, as without history."""


def f_cdf(x: float, d1: float, d2: float) -> float:
    """Fisher's F distribution function."""
    if x <= 0:
        return 0.0
    return _betainc(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2))


def pooled_spread(level_sets: Iterable[Sequence[float]]) -> tuple[float, int]:
    """(sd, degrees of freedom) of per-start levels around each set's own mean, pooled over the
    sets (one set per cycle: day-to-day drift between cycles does not count as spread)."""
    squares, df = 0.0, 0
    for levels in level_sets:
        if len(levels) >= 2:
            mean = math.fsum(levels) / len(levels)
            squares += math.fsum((v - mean) ** 2 for v in levels)
            df += len(levels) - 1
    return (math.sqrt(squares / df) if df else 0.0), df


def pooled_variance(
    values: Sequence[float], prior: Spread | None, *, guarded: bool = True
) -> tuple[float, float, str]:
    """(variance, degrees of freedom, source) of the mean of per-start ``values`` (two or more).

    Without a prior, the sample variance over S starts, S - 1 degrees of freedom (as
    ``corrected_variance``). With a learned spread from this home's history and at most
    ``PRIOR_STARTS`` starts, the two estimates pooled (degrees of freedom add, history's capped
    at ``PRIOR_MAX_DF``), never below the cycle's own figure, unless this cycle's spread is
    larger than history allows at ``SPREAD_CONSISTENCY`` (an F test): then the cycle disagrees
    with history and its own spread is used alone. A cycle quieter than history keeps the wider
    pooled figure (conservative) until it has starts enough of its own.

    ``guarded=False`` is for the futility stop, which can only reject: there history counts
    with all its degrees of freedom and may narrow the interval below the cycle's own figure
    (a wrong history then costs a good candidate its chance, never a false qualification)."""
    n = len(values)
    own = sample_variance(values)
    if prior is None or prior.df <= 0 or prior.sd <= 0:
        return own / n, float(n - 1), "this cycle"
    if n > PRIOR_STARTS:
        return own / n, float(n - 1), "this cycle"
    ratio = own / prior.sd**2
    if f_cdf(ratio, n - 1, prior.df) > SPREAD_CONSISTENCY:
        return own / n, float(n - 1), "this cycle (it disagrees with the learned spread)"
    weight = min(prior.df, PRIOR_MAX_DF) if guarded else prior.df
    pooled = (weight * prior.sd**2 + (n - 1) * own) / (weight + n - 1)
    if guarded:
        pooled = max(pooled, own)
    return pooled / n, float(weight + n - 1), "learned, pooled with this cycle"


def welch_half_width(parts: Sequence[tuple[float, float]], level: float) -> float:
    """Half-width (log space) of a two-sided ``level`` t interval of a difference of means,
    from each side's (variance, degrees of freedom), Welch-Satterthwaite."""
    total = math.fsum(v for v, _ in parts)
    if total <= 0:
        return 0.0
    denom = math.fsum(v * v / df for v, df in parts if math.isfinite(df) and v > 0)
    df = total * total / denom if denom > 0 else math.inf
    return t_quantile(1 - (1 - level) / 2, df) * math.sqrt(total)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c if abs(1 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c if abs(1 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student t distribution function (df may be fractional or infinite)."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(t)
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


@functools.lru_cache(maxsize=8192)
def _t_quantile(p: float, df: float) -> float:
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    hi = 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:  # converged to adjacent floats
            break
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return hi


def t_quantile(p: float, df: float) -> float:
    """Upper quantile (p > 0.5) of Student's t; df rounded down to 1/1000 (conservative)."""
    if not 0.5 < p < 1:
        raise ValueError("t_quantile needs 0.5 < p < 1")
    df = math.inf if df > 1e6 else max(math.floor(df * 1000) / 1000, 0.001)
    return _t_quantile(p, df)


EARLY_LOOK_ALPHA = 2 * (1 - statistics.NormalDist().cdf(3.0))
"""Error rate spent at each look before the last (Haybittle-Peto: |z| >= 3, about 0.27%)."""


def look_level(confidence: float, starts: int, min_starts: int, max_starts: int) -> float:
    """Confidence of the interval at the look taken after ``starts`` starts, when early stopping
    may decide after every start from ``min_starts`` to ``max_starts``.

    Haybittle-Peto spending: each look before the last spends a small error rate
    (``EARLY_LOOK_ALPHA``, at most half the total shared among them), the last look spends what
    is left. The per-look rates add up to the total 1 - confidence, so by the union bound the
    chance of a wrong decision at any look stays within it however correlated the looks are.
    Early looks, with few starts and few degrees of freedom, seldom decide anyway; keeping
    nearly all of the error rate for the last look keeps its power close to a fixed protocol's.
    A single look (min_starts == max_starts) gets the full confidence, and so does a decision
    on fewer starts than ``min_starts``: that is no early-stopping look but a protocol without
    rounds (a cycle or bundle from before them). Early stopping must not decide before
    ``min_starts`` rounds.
    """
    alpha = 1 - confidence
    top = max(1, max_starts)
    first = min(max(1, min_starts), top)
    early_looks = top - first
    if early_looks == 0 or starts < first:
        return confidence
    early = min(EARLY_LOOK_ALPHA, alpha / (2 * early_looks))
    if starts < top:
        return 1 - early
    return 1 - (alpha - early * early_looks)


def log_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    level: float,
    prior: Spread | None = None,
    *,
    guarded: bool = True,
) -> tuple[float, float, float]:
    """(estimate, low, high) of exp(mean(candidate) - mean(baseline)) from per-start log values
    (one value per start), Welch t; a side with one start gets the assumed start noise.
    ``guarded``: as ``pooled_variance``."""
    if not baseline or not candidate:
        raise ValueError("an interval needs at least one start on each side")
    est = math.fsum(candidate) / len(candidate) - math.fsum(baseline) / len(baseline)
    parts = [_side_variance(side, prior, guarded) for side in (baseline, candidate)]
    hw = welch_half_width(parts, level)
    return math.exp(est), math.exp(est - hw), math.exp(est + hw)


def _side_variance(
    side: Sequence[float], prior: Spread | None, guarded: bool
) -> tuple[float, float]:
    if len(side) >= 2:
        return pooled_variance(side, prior, guarded=guarded)[:2]
    if prior is not None:
        return prior.sd**2, float(prior.df)
    return ASSUMED_START_NOISE**2, math.inf
