"""Pure statistics over measured samples: how much faster is a candidate than the baseline?

Only successful ``measure`` samples count; the metric is decode tokens per second. Each prompt is
summarised by the median of its repeats (robust to one slow request), each prompt's speedup is the
ratio of medians, and the overall estimate is the geometric mean of those ratios (the right mean
for ratios: a 2x gain and a 2x loss cancel). Uncertainty comes from a seeded bootstrap over the
repeats, so the same samples always give the same interval, bit for bit.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
    median tok/s re-measured after the experiments (phase ``drift``) / median before."""
    samples = list(samples)
    before = measured_tps(samples)
    after = measured_tps(s.model_copy(update={"phase": "measure"}) for s in samples
                         if s.phase == "drift")
    ratios = [statistics.median(after[p]) / statistics.median(before[p])
              for p in sorted(after) if p in before]
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


def bootstrap_interval(
    baseline: Mapping[str, Sequence[float]],
    candidate: Mapping[str, Sequence[float]],
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile interval of the geometric-mean speedup, resampling each prompt's repeats.

    Baseline and candidate repeats are resampled independently (they are independent runs);
    prompts are fixed (the suite is chosen, not sampled). Prompts are visited in sorted order and
    all draws come from one ``random.Random(seed)``, so the result is reproducible bit for bit.
    """
    prompts = sorted(set(baseline) & set(candidate))
    if not prompts:
        raise ValueError("no prompt measured on both sides")
    rng = random.Random(seed)
    estimates: list[float] = []
    for _ in range(resamples):
        logs = []
        for pid in prompts:
            b, c = baseline[pid], candidate[pid]
            b_med = statistics.median(rng.choices(b, k=len(b)))
            c_med = statistics.median(rng.choices(c, k=len(c)))
            logs.append(math.log(c_med) - math.log(b_med))
        estimates.append(math.exp(math.fsum(logs) / len(logs)))
    estimates.sort()
    alpha = 1.0 - confidence
    return quantile(estimates, alpha / 2), quantile(estimates, 1 - alpha / 2)


def speedup_summary(
    baseline: Iterable[Sample],
    candidate: Iterable[Sample],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> SpeedupSummary | None:
    """Summarise candidate vs baseline over the prompts both measured; None if there are none.

    ``missing_prompts`` lists baseline prompts the candidate has no successful measurement of;
    the selector treats those as a failure (a candidate cannot win by skipping slow prompts).
    """
    baseline = list(baseline)
    candidate = list(candidate)
    base = measured_tps(baseline)
    cand = measured_tps(candidate)
    prompts = sorted(set(base) & set(cand))
    if not prompts:
        return None
    per_prompt = []
    for pid in prompts:
        b_med = statistics.median(base[pid])
        c_med = statistics.median(cand[pid])
        stat = PromptStat(
            prompt_id=pid, baseline_tps=b_med, candidate_tps=c_med, speedup=c_med / b_med
        )
        per_prompt.append(stat)
    speedups = [p.speedup for p in per_prompt]
    estimate = geometric_mean(speedups)
    low, high = bootstrap_interval(
        base, cand, confidence=confidence, resamples=resamples, seed=seed
    )
    # A percentile bootstrap of a median-based statistic is discrete and may be skewed: with few
    # repeats the point estimate can fall just outside the resampled percentiles. The decision
    # rules compare the bounds with a threshold and rely on low <= estimate <= high (so that
    # "low >= threshold" also means "estimate >= threshold"); clamping keeps them consistent and
    # can only widen the interval, i.e. it never makes a verdict more confident than the data.
    low, high = min(low, estimate), max(high, estimate)
    worst = min(per_prompt, key=lambda p: (p.speedup, p.prompt_id))
    weights = _token_weights(baseline, candidate, prompts)
    token_weighted = math.fsum(w * s for w, s in zip(weights, speedups, strict=True)) / math.fsum(
        weights
    )
    return SpeedupSummary(
        per_prompt=per_prompt,
        estimate=estimate,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        mean=math.fsum(speedups) / len(speedups),
        median=float(statistics.median(speedups)),
        token_weighted=token_weighted,
        worst_prompt=worst.prompt_id,
        worst_speedup=worst.speedup,
        baseline_tps=geometric_mean([p.baseline_tps for p in per_prompt]),
        candidate_tps=geometric_mean([p.candidate_tps for p in per_prompt]),
        repeats=min(min(len(base[p]), len(cand[p])) for p in prompts),
        missing_prompts=sorted(set(base) - set(cand)),
    )


def _token_weights(
    baseline: Sequence[Sample], candidate: Sequence[Sample], prompts: Sequence[str]
) -> list[float]:
    """Weight of each prompt = its baseline completion tokens (the work the user waits for).

    Falls back to the candidate's count, then to 1, when a runtime does not report tokens.
    """
    base = completion_tokens(baseline)
    cand = completion_tokens(candidate)
    return [base.get(p) or cand.get(p) or 1.0 for p in prompts]


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
