"""Made-up candidate runs for the selector's tests (tests/core/): three prompts, three server
starts, a fixed decode rate times a factor, the same greedy tokens unless a test changes them."""

from __future__ import annotations

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    EffectiveThresholds,
    MeasureProtocol,
    Sample,
    Semantics,
)

PROMPTS = ("p1", "p2", "p3")
TOKENS = [11, 12, 13, 14, 15, 16]
GOOD_TEXT = "A clear and ordinary answer that does not repeat itself."

THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5.0,
    max_peak_memory_gb=16.0,
    max_error_rate=0.0,
    worst_prompt_tolerance_pct=10.0,
    lossy_min_identical_fraction=0.5,
)
PROTOCOL = MeasureProtocol(bootstrap_resamples=400)
ALL = {c: True for c in CandidateClass}


STARTS = 3  # fresh server starts per configuration (issue 10: at least 2)


def measure(
    cid: str,
    tps: dict[str, list[float]],
    errors: int = 0,
    starts: int = STARTS,
    spread: tuple[float, ...] | None = None,
) -> list[Sample]:
    """The same repeats in each start, times ``spread[start]`` (a whole process running
    faster or slower); no start-to-start spread unless a test adds one."""
    rows = [
        Sample(
            candidate=cid,
            prompt_id=pid,
            repeat=i,
            decode_tps=v * (spread[st] if spread else 1.0),
            completion_tokens=64,
            start=st,
            round=st,
        )
        for st in range(starts)
        for pid, values in tps.items()
        for i, v in enumerate(values)
    ]
    rows += [
        Sample(candidate=cid, prompt_id=PROMPTS[0], repeat=100 + i, error="HTTP 500")
        for i in range(errors)
    ]
    return rows


def make_run(
    cid: str,
    factor: float | dict[str, float] = 1.0,
    *,
    noise: tuple[float, ...] = (0.99, 1.0, 1.01),
    greedy_ids: dict[str, list[int]] | None = None,
    texts: dict[str, str] | None = None,
    klass: CandidateClass | None = CandidateClass.SERVER_TUNING,
    semantics: Semantics = Semantics.LOSSLESS,
    **fields,
) -> CandidateRun:
    factors = factor if isinstance(factor, dict) else dict.fromkeys(PROMPTS, factor)
    tps = {p: [100.0 * factors[p] * n for n in noise] for p in PROMPTS}
    greedy = [
        Sample(
            candidate=cid,
            prompt_id=p,
            repeat=0,
            text=(texts or {}).get(p, GOOD_TEXT),
            token_ids=(greedy_ids or {}).get(p, TOKENS),
        )
        for p in PROMPTS
    ]
    errors = fields.pop("errors", 0)
    starts = fields.pop("starts", STARTS)
    spread = fields.pop("spread", None)
    return CandidateRun(
        candidate=cid,
        candidate_class=klass,
        semantics=semantics,
        samples=measure(cid, tps, errors, len(spread) if spread else starts, spread),
        greedy=greedy,
        **fields,
    )


BASELINE = make_run("baseline", klass=None)


def only(verdict):
    [cv] = verdict.candidates
    return cv
