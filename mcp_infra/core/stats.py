"""Pure statistics over measured samples: how much faster is a candidate than the baseline?

Only successful ``measure`` samples count; the metric is decode tokens per second. The data has
two levels: a configuration is measured in several fresh server processes ("starts"), and in each
start every prompt is requested a few times ("repeats"). A fresh process can run a few percent
faster or slower as a whole, so repeats of one start are not independent evidence: the statistics
must see the starts.

The method (``speedup_summary``):

* Per start and prompt, the median of the repeats' log tok/s (robust to one slow request). A
  prompt's level in a configuration is the mean of those over the starts (a geometric mean of
  per-start medians); a prompt's speedup is the ratio of levels; the headline estimate is the
  geometric mean of the per-prompt speedups (the right mean for ratios: 2x and 0.5x cancel).
* Uncertainty comes from a hierarchical (two-stage) bootstrap, seeded and deterministic: each
  configuration independently draws its starts with replacement, then, inside each drawn start,
  each prompt's repeats with replacement (drawn exactly from the resampled median's distribution).
  Resampling both stages counts the within-start noise twice (it is already inside the spread
  between starts); with that second count removed, the bootstrap variance of a configuration's
  mean level is, in the limit of many resamples, exactly the plug-in variance of the mean of its
  per-start values, so for S >= 2 starts that is computed directly, free of Monte Carlo noise
  (``_Resampled.variance``). Few starts make it too narrow (low by (S-1)/S, and the variance is
  itself estimated from S values), so it is scaled by S/(S-1) and the interval is a Student t
  interval in log space with Welch-Satterthwaite degrees of freedom (S-1 per configuration). In
  effect each start is one independent observation, as it should be. A prompt's own interval
  takes the spread of its per-start values pooled over the configuration's prompts (P(S-1)
  degrees of freedom instead of S-1; ``_Resampled.prompt_spread``), around its own estimate.
  A configuration measured in one start (each side of the held-out check) pools the same way:
  each prompt's within-start bootstrap variance is the mean of its prompts' (``one_start_pooled``;
  decision method 5).
  The interval's confidence is the protocol's, adjusted for early stopping: the error rate is
  spent over the looks (one per start from min_starts to max_starts), Haybittle-Peto style
  (``look_level``), so stopping at the first decisive look does not inflate the error rate.
* What the error rate means. A candidate qualifies only if the interval's lower bound clears the
  bar (below), a one-sided question: the lower bound of a two-sided interval at confidence C is a
  one-sided (1 + C)/2 bound, so a candidate whose true speedup is at the bar qualifies at most
  (1 - C)/2 of the time, over all looks together (the per-look rates add up to 1 - C, and the
  union bound holds however correlated the looks are). The default C is 0.96 (``MeasureProtocol``):
  at most 2% wrongly qualified; the looks being correlated, the benchmark sees 1.3% to 1.7% at
  a true speedup equal to the threshold. The upper bound, which rejects a candidate as too slow,
  has the same 2% on its side.
* How many starts that takes. Each start is one observation of a configuration's level, so with
  start-to-start spread s (log sd) and S starts each, the standard error of the log speedup is
  about s * sqrt(2 / S). Telling a true 1.15x from a 1.05x threshold (0.091 apart in log space)
  at that 2% bound (1% at the last look, the rest spent on the early ones) with 90% power needs
  0.091 to be about 4.5 standard errors, once the t quantiles' few degrees of freedom and the
  looks are paid for: a standard error of about 0.02, S about 13 at s = 5% and 5 at s = 3%.
  Hence the default ``max_starts`` of 13; early stopping ends a clear case far sooner
  (benchmarks/decision_quality.py measures all of this; figures in the README).
* A configuration measured in a single start cannot show its start-to-start spread: its variance
  is the bootstrap's (the repeats, resampled) plus ``ASSUMED_START_NOISE`` squared (5% per start,
  the largest this method is validated for, see benchmarks/decision_quality.py), taken as known
  (normal quantiles on that side).
* A/A noise floor: the baseline resampled against itself the same way (two independent two-stage
  draws of its own starts, scaled like the variance above to remove the double count); the floor
  is the confidence quantile of that ratio (at least 1): how far two equally sized sets of the
  baseline's own starts can differ by chance. A candidate must clear it as well as the
  threshold. It exists for the candidate that is the baseline under another name: identical
  measurements never qualify (the estimate is not above 1), and one measured in starts of its
  own must clear both its interval and the floor. At a threshold of 0, where nothing else
  stands in its way, the benchmark qualified such a candidate in 0 of 300 cycles (1.7% with
  the floor switched off, 0.7% with the floor at the median A/A distance). The floor is about as
  wide as the interval's half-width, so with few starts it sits above a 5% threshold and costs
  power: with the old 2 to 4 starts at 5% start noise a few points of the chance to qualify a
  true 1.15x (the starts, not the floor, were what was missing). At the default 13 starts it
  mostly lies below a 5% threshold and costs under one point of that power (94.7% against
  95.3% with the median floor, on the same simulated cycles), so it stays at the confidence
  quantile. With one baseline start it is
  unknown and is computed from the assumed start noise instead:
  exp(z * sqrt(2) * ASSUMED_START_NOISE), about 1.148x at 95% and 1.157x at 96%.

Token-weighted speedup is Σ output tokens / Σ decode time of the candidate over the same of the
baseline (a time-weighted rate, not a mean of ratios).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mcp_infra.contracts import PromptStat, Sample


@dataclass(frozen=True)
class SpeedupSummary:
    """Everything the selector needs to know about one candidate's speed."""

    per_prompt: list[PromptStat]
    estimate: float
    ci_low: float
    ci_high: float
    confidence: float
    mean: float
    median: float
    token_weighted: float
    worst_prompt: str
    worst_speedup: float
    baseline_tps: float
    candidate_tps: float
    repeats: int
    missing_prompts: list[str]
    noise_floor: float = 1.0
    noise_floor_assumed: bool = False
    baseline_starts: int = 1
    candidate_starts: int = 1
    level: float = 0.95
    spread: str = "this cycle"  # where the start-to-start spread came from (``pooled_spread``)
    # The upper end with a learned spread at its full weight (``pooled_variance(guarded=False)``):
    # the futility stop's, which can only reject. None: the same as ``ci_high``.
    reject_high: float | None = None


def _valid(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def measured_tps(samples: Iterable[Sample]) -> dict[str, list[float]]:
    """Decode tok/s per prompt from successful measure samples, in (repeat, order) order.

    Non-finite or non-positive rates are dropped: they are not measurements of speed.
    """
    rows = sorted(
        (s for s in samples if s.phase == "measure" and s.error is None and _valid(s.decode_tps)),
        key=lambda s: (s.prompt_id, s.repeat, s.order),
    )
    out: dict[str, list[float]] = {}
    for s in rows:
        out.setdefault(s.prompt_id, []).append(float(s.decode_tps))  # type: ignore[arg-type]
    return out


def baseline_drift(samples: Iterable[Sample]) -> float | None:
    """How the baseline's speed moved during the cycle: the geometric mean over prompts of
    median tok/s re-measured after the experiments (phase ``drift``) / median before, in the
    workload cells the re-measure covered (a short re-measure takes the headline cell only)."""
    samples = list(samples)
    again = [s for s in samples if s.phase == "drift"]
    cells = {(s.request_class, s.concurrency) for s in again}
    before = measured_tps(s for s in samples if (s.request_class, s.concurrency) in cells)
    after = measured_tps(s.model_copy(update={"phase": "measure"}) for s in again)
    ratios = [
        statistics.median(after[p]) / statistics.median(before[p])
        for p in sorted(after)
        if p in before
    ]
    return geometric_mean(ratios) if ratios else None


def completion_tokens(samples: Iterable[Sample]) -> dict[str, float]:
    """Median completion tokens per prompt (successful measure samples that report them)."""
    per: dict[str, list[int]] = {}
    for s in samples:
        if s.phase == "measure" and s.error is None and s.completion_tokens:
            per.setdefault(s.prompt_id, []).append(s.completion_tokens)
    return {pid: float(statistics.median(v)) for pid, v in per.items()}


def error_count(samples: Iterable[Sample]) -> tuple[int, int]:
    """(failed, total) over measure samples: the basis of the error-rate rule."""
    measure = [s for s in samples if s.phase == "measure"]
    return sum(1 for s in measure if s.error is not None), len(measure)


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


def derive_seed(seed: int, key: str) -> int:
    """A stable per-candidate seed: sha256, not ``hash()``, which is salted per process."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


ASSUMED_START_NOISE = 0.05
"""Start-to-start spread (log sd per start) assumed when a configuration has a single start."""


def in_cell(sample: Sample, cell: tuple[str, int] | None) -> bool:
    """Whether a sample belongs to a workload cell (request class, concurrency); None: any."""
    return cell is None or (sample.request_class, sample.concurrency) == cell


def log_table(
    samples: Iterable[Sample], cell: tuple[str, int] | None = None
) -> dict[str, dict[int, list[float]]]:
    """prompt -> start -> sorted log decode tok/s of the successful measure samples."""
    out: dict[str, dict[int, list[float]]] = {}
    for s in samples:
        if s.phase == "measure" and s.error is None and _valid(s.decode_tps) and in_cell(s, cell):
            out.setdefault(s.prompt_id, {}).setdefault(s.start, []).append(
                math.log(s.decode_tps)  # type: ignore[arg-type]
            )
    for per in out.values():
        for values in per.values():
            values.sort()
    return out


def _median_sorted(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


@functools.lru_cache(maxsize=128)
def _median_cdf(k: int) -> tuple[float, ...] | None:
    """P(median of k draws with replacement <= the j-th smallest of k values), j = 1..k.

    The median of an odd-sized resample is one of the original values, so one uniform number
    draws it exactly (instead of k draws and a sort). None for even k (not a single value).
    """
    if k % 2 == 0:
        return None
    need = (k + 1) // 2
    cdf = [
        math.fsum(
            math.comb(k, i) * (j / k) ** i * (1 - j / k) ** (k - i) for i in range(need, k + 1)
        )
        for j in range(1, k + 1)
    ]
    cdf[-1] = 1.0
    return tuple(cdf)


def _draw_median(rng: random.Random, values: list[float], cdf: tuple[float, ...] | None) -> float:
    if cdf is None:
        return _median_sorted(sorted(rng.choices(values, k=len(values))))
    return values[bisect.bisect_left(cdf, rng.random())]


@dataclass
class _Resampled:
    """One configuration's data, prepared for fast two-stage resampling."""

    starts: list[int]
    cells: dict[str, dict[int, tuple[list[float], tuple[float, ...] | None]]]
    level: dict[str, float]  # point estimate: mean over starts of the per-start median log tok/s
    prior: Spread | None = None  # the home's learned start-to-start spread, if any

    def start_values(self, prompt: str | None) -> list[float]:
        """Per start: the prompt's median log tok/s, or (None) the mean of it over prompts."""
        if prompt is not None:
            return [_median_sorted(v) for v, _ in self.cells[prompt].values()]
        out = []
        for st in self.starts:
            values = [_median_sorted(per[st][0]) for per in self.cells.values() if st in per]
            out.append(math.fsum(values) / len(values))
        return out

    def variance(
        self, boot: float, prompt: str | None = None, *, guarded: bool = True
    ) -> tuple[float, float]:
        """(variance, degrees of freedom) of this configuration's mean log level (overall, or
        one prompt's), from ``boot``, the two-stage bootstrap variance of it.

        The two-stage bootstrap counts the within-start noise twice: once inside the spread
        between starts, and again by resampling inside each drawn start. With the second count
        removed, its variance (in the limit of many resamples) is exactly the plug-in variance
        of the mean of the per-start values, which is therefore computed directly, without
        Monte Carlo noise, and scaled by S/(S-1) (``corrected_variance``): the sample variance
        of the S start values over S, with S-1 degrees of freedom. A single start has no spread
        between starts: its bootstrap variance (within the start) is all there is, plus the
        assumed start-to-start spread.
        """
        values = self.start_values(prompt)
        n = len(values)
        if n >= 2 and prompt is not None:
            spread, df = self.prompt_spread
            return spread / n, df
        if n >= 2:
            return pooled_variance(values, self.prior, guarded=guarded)[:2]
        if self.prior is not None:
            return boot + self.prior.sd**2, float(self.prior.df)
        return corrected_variance(boot, 1)

    @functools.cached_property
    def prompt_spread(self) -> tuple[float, float]:
        """(variance, degrees of freedom) of one prompt's per-start value around that prompt's
        own mean, pooled over the prompts (one-way analysis of variance).

        Why pooled: a prompt's own S values give S - 1 degrees of freedom, and with 2 or 3
        starts the t quantile (4.3 to 12.7 at 95%) made every per-prompt interval so wide that
        one slow request straddled the worst-prompt floor (demo runs: 0.56x to 5.9x around
        1.8x). In log space the prompts of a configuration share one noise level, so pooling
        gives the sum of their degrees of freedom; each prompt keeps its own estimate. Asked
        only for a prompt with two starts or more, so the degrees of freedom are at least 1."""
        squares = 0.0
        df = 0
        for prompt in self.cells:
            values = self.start_values(prompt)
            if len(values) >= 2:
                mean = math.fsum(values) / len(values)
                squares += math.fsum((v - mean) ** 2 for v in values)
                df += len(values) - 1
        return squares / df, float(df)


def _prepare(
    table: Mapping[str, Mapping[int, list[float]]],
    prompts: Sequence[str],
    prior: Spread | None = None,
) -> _Resampled:
    cells = {
        p: {st: (vals, _median_cdf(len(vals))) for st, vals in sorted(table[p].items())}
        for p in prompts
    }
    level = {
        p: math.fsum(_median_sorted(v) for v, _ in per.values()) / len(per)
        for p, per in cells.items()
    }
    starts = sorted({st for p in prompts for st in table[p]})
    return _Resampled(starts=starts, cells=cells, level=level, prior=prior)


def _draw_levels(rng: random.Random, cfg: _Resampled, prompts: Sequence[str]) -> list[float]:
    """One two-stage resample: starts with replacement, then each drawn start's repeats."""
    n = len(cfg.starts)
    chosen = [cfg.starts[rng.randrange(n)] for _ in range(n)]
    uniform = rng.random
    find = bisect.bisect_left
    out = []
    for p in prompts:
        per = cfg.cells[p]
        values = []
        for st in chosen:
            cell = per.get(st)
            if cell is None:
                continue
            vals, cdf = cell
            # The same draws as _draw_median, inlined: this loop is the bootstrap's cost.
            values.append(
                vals[find(cdf, uniform())] if cdf is not None else _draw_median(rng, vals, None)
            )
        out.append(math.fsum(values) / len(values) if values else cfg.level[p])
    return out


def _prompt_variances(draws: Sequence[Sequence[float]], prompts: int) -> list[float]:
    """Per prompt: the bootstrap variance of its level over the resamples ``draws``."""
    return [_variance([d[i] for d in draws]) for i in range(prompts)]


def one_start_pooled(cfg: _Resampled, variances: list[float]) -> list[float]:
    """A configuration measured in one start: each prompt's within-start (bootstrap) variance
    replaced by their mean over the prompts; with two starts or more, ``variances`` as given.

    Why: a start's few repeats per prompt (3 in the demo's held-out check) make each prompt's
    own bootstrap variance an estimate from 3 values, and one slow request among them made a
    held-out prompt's interval 0.83x to 1.92x around 1.26x, straddling the worst-prompt floor:
    7 of 11 demo held-out checks failed so on 2026-12-03. In log space the prompts of one start
    share one noise level (the premise of ``_Resampled.prompt_spread`` for several starts), so
    the mean over prompts estimates it from all the start's requests; each prompt keeps its
    own estimate (the median of its repeats), so a prompt that is slower stays slower."""
    if len(cfg.starts) != 1 or not variances:
        return variances
    mean = math.fsum(variances) / len(variances)
    return [mean] * len(variances)


def _variance(values: Sequence[float]) -> float:
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
so history may narrow an early look only as much as four starts of this cycle would
(decision_quality.py with the learned spread half the truth: 2.8% qualified at the threshold
with history's full weight, 1.5% capped at 4; docs/statistics.md)."""

SPREAD_CONSISTENCY = 0.99
"""A cycle's own spread that exceeds the learned one beyond this F quantile disagrees with
history: the cycle's spread alone is used, as without history."""


def f_cdf(x: float, d1: float, d2: float) -> float:
    """Fisher's F distribution function."""
    if x <= 0:
        return 0.0
    return _betainc(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2))


def start_levels(samples: Iterable[Sample], cell: tuple[str, int] | None) -> list[float]:
    """A configuration's level per start (the mean over prompts of each start's median log
    tok/s) in one cell: the values whose spread the learned start-to-start spread describes."""
    table = log_table([s for s in samples if in_cell(s, cell)])
    if not table:
        return []
    return _prepare(table, sorted(table)).start_values(None)


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
    own = _variance(values)
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


def speedup_summary(  # noqa: PLR0913  keyword-only options of one summary, each named at its call
    baseline: Iterable[Sample],
    candidate: Iterable[Sample],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    level: float | None = None,
    cell: tuple[str, int] | None = None,
    prior: Spread | None = None,
) -> SpeedupSummary | None:
    """Summarise candidate vs baseline over the prompts both measured; None if there are none.

    See the module docstring for the method. ``level`` is the interval's confidence at this
    look of early stopping (``look_level``); None: ``confidence``.
    ``cell`` restricts the samples to one workload cell. ``missing_prompts`` lists baseline
    prompts the candidate has no successful measurement of; the selector treats those as a
    failure (a candidate cannot win by skipping slow prompts). A side measured in one start
    gives each prompt's interval the within-start variance pooled over its prompts
    (``one_start_pooled``).
    """
    baseline = [s for s in baseline if in_cell(s, cell)]
    candidate = [s for s in candidate if in_cell(s, cell)]
    base_t = log_table(baseline)
    cand_t = log_table(candidate)
    prompts = sorted(set(base_t) & set(cand_t))
    if not prompts:
        return None
    base = _prepare(base_t, prompts, prior)
    cand = _prepare(cand_t, prompts, prior)
    level = confidence if level is None else level

    rng = random.Random(seed)
    b_draws: list[list[float]] = []
    c_draws: list[list[float]] = []
    aa: list[float] = []
    for _ in range(resamples):
        b = _draw_levels(rng, base, prompts)
        c = _draw_levels(rng, cand, prompts)
        again = _draw_levels(rng, base, prompts)
        b_draws.append(b)
        c_draws.append(c)
        aa.append(abs(math.fsum(b) - math.fsum(again)) / len(prompts))

    nb, nc = len(base.starts), len(cand.starts)

    def parts(b_var: float, c_var: float, prompt: str | None = None) -> list[tuple[float, float]]:
        return [base.variance(b_var, prompt), cand.variance(c_var, prompt)]

    b_boot = _prompt_variances(b_draws, len(prompts))
    c_boot = _prompt_variances(c_draws, len(prompts))
    b_boot, c_boot = one_start_pooled(base, b_boot), one_start_pooled(cand, c_boot)

    b_mean = [math.fsum(d) / len(d) for d in b_draws]
    c_mean = [math.fsum(d) / len(d) for d in c_draws]
    hw = welch_half_width(parts(_variance(b_mean), _variance(c_mean)), level)

    boot = _variance(b_mean)
    source = "this cycle"
    if nb >= 2:
        source = pooled_variance(base.start_values(None), prior)[2]
    if nb >= 2 and source.startswith("learned"):
        # Two equally sized sets of the baseline's starts differ by a normal difference of
        # variance twice the pooled variance of one set's mean.
        z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
        floor_log = z * math.sqrt(2 * base.variance(boot)[0])
    elif nb >= 2:
        # The A/A draws carry the same double count of within-start noise as the two-stage
        # variance: they are scaled by the same factor (plug-in over two-stage variance).
        aa.sort()
        plug_in = base.variance(boot)[0] * (nb - 1) / nb
        floor_log = quantile(aa, confidence) * (math.sqrt(plug_in / boot) if boot > 0 else 0.0)
    else:
        # Unknown: what two starts of the baseline would show if they differ by the assumed
        # start-to-start spread (the repeats' own noise is in the interval already).
        z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
        floor_log = z * math.sqrt(2) * ASSUMED_START_NOISE

    # Point figures from the raw tok/s: per start the median of the repeats, per prompt their
    # geometric mean over starts (with one start exactly the old median of repeats).
    raw_b, raw_c = _point_tps(baseline, cell), _point_tps(candidate, cell)
    per_prompt = []
    for i, pid in enumerate(prompts):
        speedup = raw_c[pid] / raw_b[pid]
        lp = math.log(speedup)
        phw = welch_half_width(parts(b_boot[i], c_boot[i], pid), level)
        per_prompt.append(
            PromptStat(
                prompt_id=pid,
                baseline_tps=raw_b[pid],
                candidate_tps=raw_c[pid],
                speedup=speedup,
                ci_low=math.exp(lp - phw),
                ci_high=math.exp(lp + phw),
            )
        )
    speedups = [p.speedup for p in per_prompt]
    estimate = geometric_mean(speedups)
    log_est = math.log(estimate)
    reject_high = None
    if prior is not None:  # the futility stop's end: history at full weight
        unguarded = [
            base.variance(_variance(b_mean), guarded=False),
            cand.variance(_variance(c_mean), guarded=False),
        ]
        reject_high = max(math.exp(log_est + welch_half_width(unguarded, level)), estimate)
    worst = min(per_prompt, key=lambda p: (p.speedup, p.prompt_id))
    return SpeedupSummary(
        per_prompt=per_prompt,
        estimate=estimate,
        ci_low=min(math.exp(log_est - hw), estimate),
        ci_high=max(math.exp(log_est + hw), estimate),
        confidence=confidence,
        mean=math.fsum(speedups) / len(speedups),
        median=float(statistics.median(speedups)),
        token_weighted=token_weighted_speedup(baseline, candidate, prompts),
        worst_prompt=worst.prompt_id,
        worst_speedup=worst.speedup,
        baseline_tps=geometric_mean([p.baseline_tps for p in per_prompt]),
        candidate_tps=geometric_mean([p.candidate_tps for p in per_prompt]),
        repeats=min(len(v) for t in (base_t, cand_t) for p in prompts for v in t[p].values()),
        missing_prompts=sorted(set(base_t) - set(cand_t)),
        noise_floor=math.exp(max(floor_log, 0.0)),
        noise_floor_assumed=nb < 2,
        baseline_starts=nb,
        candidate_starts=nc,
        level=level,
        spread=source,
        reject_high=reject_high,
    )


def _point_tps(samples: Sequence[Sample], cell: tuple[str, int] | None) -> dict[str, float]:
    """Per prompt: the geometric mean over starts of each start's median decode tok/s."""
    per: dict[str, dict[int, list[float]]] = {}
    for s in samples:
        if s.phase == "measure" and s.error is None and _valid(s.decode_tps) and in_cell(s, cell):
            per.setdefault(s.prompt_id, {}).setdefault(s.start, []).append(float(s.decode_tps))  # type: ignore[arg-type]
    out = {}
    for pid, starts in per.items():
        medians = [float(statistics.median(v)) for _, v in sorted(starts.items())]
        out[pid] = medians[0] if len(medians) == 1 else geometric_mean(medians)
    return out


def _decode_time_and_tokens(s: Sample) -> tuple[float, float] | None:
    """(decode seconds, tokens decoded in them) of one sample; None if it cannot tell."""
    if not _valid(s.decode_tps):
        return None
    rate = float(s.decode_tps)  # type: ignore[arg-type]
    if _valid(s.decode_s):
        seconds = float(s.decode_s)  # type: ignore[arg-type]
    else:
        tokens = s.completion_tokens if s.completion_tokens and s.completion_tokens > 0 else 1
        seconds = tokens / rate
    return seconds, rate * seconds


def token_weighted_speedup(
    baseline: Iterable[Sample], candidate: Iterable[Sample], prompts: Sequence[str]
) -> float:
    """(Σ tokens / Σ decode seconds) of the candidate over the same of the baseline, on the
    successful measure samples of ``prompts``: what a user waiting on all of them would see."""
    rates = []
    for side in (baseline, candidate):
        pairs = [
            tt
            for s in side
            if s.phase == "measure"
            and s.error is None
            and s.prompt_id in prompts
            and (tt := _decode_time_and_tokens(s)) is not None
        ]
        rates.append(math.fsum(t for _, t in pairs) / math.fsum(sec for sec, _ in pairs))
    return rates[1] / rates[0]


def repeats_to_decide(
    estimate: float, ci_low: float, ci_high: float, threshold: float, repeats: int
) -> int | None:
    """Repeats per prompt that would likely move the interval off the threshold.

    Assumes the interval's half-width shrinks as 1/sqrt(n) (in log space, where a ratio's
    interval is symmetric enough): the half-width on the threshold's side, h at n repeats, must
    shrink to the distance d between estimate and threshold, so n' = n * (h/d)^2. Returns None
    when that cannot be estimated: no repeats, an estimate exactly on the threshold, a degenerate
    interval, or non-positive figures.
    """
    if repeats < 1 or min(estimate, ci_low, ci_high, threshold) <= 0:
        return None
    log_est = math.log(estimate)
    d = abs(log_est - math.log(threshold))
    h = log_est - math.log(ci_low) if estimate >= threshold else math.log(ci_high) - log_est
    if d == 0 or h <= 0:
        return None
    needed = math.ceil(repeats * (h / d) ** 2)
    return max(needed, repeats + 1)
