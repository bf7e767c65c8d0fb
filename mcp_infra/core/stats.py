"""How much faster is a candidate than the baseline: a speedup summary from measured samples.

Only successful ``measure`` samples count; the metric is decode tokens per second. A
configuration is measured in several fresh server processes ("starts"), each prompt a few times
per start ("repeats"); the starts are the independent observations. Per start and prompt the
median of the repeats (log tok/s); a prompt's level is the mean over starts; the speedup is the
geometric mean over prompts of candidate over baseline. Its interval is a Welch t interval over
the starts (what a two-stage bootstrap of starts and repeats gives, computed exactly), a
prompt's own interval pools the spread over prompts, and the A/A noise floor is how far two sets
of the baseline's own starts differ. Seeded and deterministic: ``evidence verify`` recomputes it.

The distributions, intervals and the learned spread are ``core.intervals``; the method, its
derivation and its measured error rates are docs/statistics.md.
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

from mcp_infra.contracts import MeasureProtocol, PromptStat, Sample
from mcp_infra.core.intervals import (
    ASSUMED_START_NOISE,
    Spread,
    corrected_variance,
    geometric_mean,
    pooled_variance,
    quantile,
    sample_variance,
    welch_half_width,
)


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


SEED = 20261129
"""The seed every shuffle and resample of a cycle derives from (``derive_seed``): the same samples
always reach the same verdict, in the cycle and in ``evidence verify``."""


def derive_seed(seed: int, key: str) -> int:
    """A stable per-candidate seed: sha256, not ``hash()``, which is salted per process."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


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
        starts the t quantile (4.3 to 12.7 at 95%) makes a per-prompt interval so wide that one
        slow request straddles the worst-prompt floor. In log space the prompts of a
        configuration share one noise level, so pooling gives the sum of their degrees of
        freedom; each prompt keeps its own estimate. Asked only for a prompt with two starts or
        more, so the degrees of freedom are at least 1."""
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
    return [sample_variance([d[i] for d in draws]) for i in range(prompts)]


def one_start_pooled(cfg: _Resampled, variances: list[float]) -> list[float]:
    """A configuration measured in one start: each prompt's within-start (bootstrap) variance
    replaced by their mean over the prompts; with two starts or more, ``variances`` as given.

    Why: a start's few repeats per prompt (3 in the demo's held-out check) make each prompt's
    own bootstrap variance an estimate from 3 values, and one slow request among them made a
    held-out prompt's interval straddle the worst-prompt floor. In log space the prompts of one
    start share one noise level (the premise of ``_Resampled.prompt_spread`` for several
    starts), so the mean over prompts estimates it from all the start's requests; each prompt
    keeps its own estimate (the median of its repeats), so a prompt that is slower stays
    slower."""
    if len(cfg.starts) != 1 or not variances:
        return variances
    mean = math.fsum(variances) / len(variances)
    return [mean] * len(variances)


def start_levels(samples: Iterable[Sample], cell: tuple[str, int] | None) -> list[float]:
    """A configuration's level per start (the mean over prompts of each start's median log
    tok/s) in one cell: the values whose spread the learned start-to-start spread describes."""
    table = log_table([s for s in samples if in_cell(s, cell)])
    if not table:
        return []
    return _prepare(table, sorted(table)).start_values(None)


@dataclass(frozen=True)
class SummaryOptions:
    """How one summary is computed: the protocol's confidence, resamples and learned spread,
    the candidate's seed and the look's level (``look_level``; None: ``confidence``)."""

    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    level: float | None = None
    prior: Spread | None = None  # the home's learned start-to-start spread, if any

    @classmethod
    def of(cls, protocol: MeasureProtocol, seed: int, level: float) -> SummaryOptions:
        """The options a frozen protocol gives one candidate (``seed``) at one look."""
        learned = protocol.learned_spread
        prior = Spread(learned.sd, learned.df) if learned is not None else None
        return cls(protocol.confidence, protocol.bootstrap_resamples, seed, level, prior)

    @property
    def look(self) -> float:
        return self.confidence if self.level is None else self.level


@dataclass
class _Draws:
    """The two-stage resamples of one comparison: per resample each side's prompt levels, and
    the A/A distance of the baseline from a second draw of itself."""

    base: list[list[float]]
    cand: list[list[float]]
    aa: list[float]

    @staticmethod
    def mean_variance(draws: list[list[float]]) -> float:
        """The bootstrap variance of a side's mean level over the prompts."""
        return sample_variance([math.fsum(d) / len(d) for d in draws])


def _bootstrap(
    base: _Resampled, cand: _Resampled, prompts: Sequence[str], opts: SummaryOptions
) -> _Draws:
    """``opts.resamples`` two-stage resamples, one ``random.Random(opts.seed)``, in a fixed
    order (baseline, candidate, baseline again), so the result is reproducible bit for bit."""
    rng = random.Random(opts.seed)
    out = _Draws([], [], [])
    for _ in range(opts.resamples):
        b = _draw_levels(rng, base, prompts)
        c = _draw_levels(rng, cand, prompts)
        again = _draw_levels(rng, base, prompts)
        out.base.append(b)
        out.cand.append(c)
        out.aa.append(abs(math.fsum(b) - math.fsum(again)) / len(prompts))
    return out


def _noise_floor_log(base: _Resampled, draws: _Draws, opts: SummaryOptions) -> tuple[float, str]:
    """(log of the A/A noise floor, where the baseline's start spread came from)."""
    nb = len(base.starts)
    boot = _Draws.mean_variance(draws.base)
    z = statistics.NormalDist().inv_cdf((1 + opts.confidence) / 2)
    if nb < 2:
        # Unknown: what two starts of the baseline would show if they differ by the assumed
        # start-to-start spread (the repeats' own noise is in the interval already).
        return z * math.sqrt(2) * ASSUMED_START_NOISE, "this cycle"
    source = pooled_variance(base.start_values(None), opts.prior)[2]
    if source.startswith("learned"):
        # Two equally sized sets of the baseline's starts differ by a normal difference of
        # variance twice the pooled variance of one set's mean.
        return z * math.sqrt(2 * base.variance(boot)[0]), source
    # The A/A draws carry the same double count of within-start noise as the two-stage
    # variance: they are scaled by the same factor (plug-in over two-stage variance).
    aa = sorted(draws.aa)
    plug_in = base.variance(boot)[0] * (nb - 1) / nb
    return quantile(aa, opts.confidence) * (math.sqrt(plug_in / boot) if boot > 0 else 0.0), source


def _prompt_stats(
    sides: tuple[_Resampled, _Resampled],
    raw: tuple[dict[str, float], dict[str, float]],
    draws: _Draws,
    prompts: Sequence[str],
    level: float,
) -> list[PromptStat]:
    """Each prompt's speedup from the raw tok/s, with its interval: the spread of its per-start
    values pooled over the prompts (one-start sides: ``one_start_pooled``)."""
    base, cand = sides
    b_boot = one_start_pooled(base, _prompt_variances(draws.base, len(prompts)))
    c_boot = one_start_pooled(cand, _prompt_variances(draws.cand, len(prompts)))
    out = []
    for i, pid in enumerate(prompts):
        speedup = raw[1][pid] / raw[0][pid]
        parts = [base.variance(b_boot[i], pid), cand.variance(c_boot[i], pid)]
        phw = welch_half_width(parts, level)
        lp = math.log(speedup)
        out.append(
            PromptStat(
                prompt_id=pid,
                baseline_tps=raw[0][pid],
                candidate_tps=raw[1][pid],
                speedup=speedup,
                ci_low=math.exp(lp - phw),
                ci_high=math.exp(lp + phw),
            )
        )
    return out


def speedup_summary(
    baseline: Iterable[Sample],
    candidate: Iterable[Sample],
    options: SummaryOptions | None = None,
    cell: tuple[str, int] | None = None,
) -> SpeedupSummary | None:
    """Summarise candidate vs baseline over the prompts both measured; None if there are none.

    ``cell`` restricts the samples to one workload cell. ``missing_prompts`` lists baseline
    prompts the candidate has no successful measurement of; the selector treats those as a
    failure (a candidate cannot win by skipping slow prompts). The method: module docstring.
    """
    opts = options or SummaryOptions()
    baseline = [s for s in baseline if in_cell(s, cell)]
    candidate = [s for s in candidate if in_cell(s, cell)]
    base_t, cand_t = log_table(baseline), log_table(candidate)
    prompts = sorted(set(base_t) & set(cand_t))
    if not prompts:
        return None
    base = _prepare(base_t, prompts, opts.prior)
    cand = _prepare(cand_t, prompts, opts.prior)
    level = opts.look
    draws = _bootstrap(base, cand, prompts, opts)
    b_var, c_var = _Draws.mean_variance(draws.base), _Draws.mean_variance(draws.cand)
    hw = welch_half_width([base.variance(b_var), cand.variance(c_var)], level)
    floor_log, source = _noise_floor_log(base, draws, opts)
    # Point figures from the raw tok/s: per start the median of the repeats, per prompt their
    # geometric mean over starts (with one start exactly the median of repeats).
    raw = (_point_tps(baseline, cell), _point_tps(candidate, cell))
    per_prompt = _prompt_stats((base, cand), raw, draws, prompts, level)
    speedups = [p.speedup for p in per_prompt]
    estimate = geometric_mean(speedups)
    log_est = math.log(estimate)
    reject_high = None
    if opts.prior is not None:  # the futility stop's end: history at full weight
        unguarded = [base.variance(b_var, guarded=False), cand.variance(c_var, guarded=False)]
        reject_high = max(math.exp(log_est + welch_half_width(unguarded, level)), estimate)
    worst = min(per_prompt, key=lambda p: (p.speedup, p.prompt_id))
    return SpeedupSummary(
        per_prompt=per_prompt,
        estimate=estimate,
        ci_low=min(math.exp(log_est - hw), estimate),
        ci_high=max(math.exp(log_est + hw), estimate),
        confidence=opts.confidence,
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
        noise_floor_assumed=len(base.starts) < 2,
        baseline_starts=len(base.starts),
        candidate_starts=len(cand.starts),
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
