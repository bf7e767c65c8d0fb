"""A configuration's reference answers: the greedy outputs and quality answers its fresh starts
gave, kept so a later cycle whose baseline is the same configuration compares with them instead
of asking them again.

Why it holds: greedy decoding is a deterministic function of the configuration (model files,
runtime, machine, knobs: ``state.references.reference_key``) and of what the process was asked
before. The lossless gate already rests on that (a candidate's greedy outputs must equal the
baseline's, measured in another process). So a greedy output is kept under a digest of the whole
pass up to it (every prompt asked before it in its start, in order, and itself, with their
answer budgets): the server's prompt cache holds earlier prompts' prefixes, and an answer is
reused only where the start would have met the same cache. A quality answer is kept under its
own prompt's digest: its gates (agreement on a budget, the fidelity measures) compare answers of
processes whose earlier requests already differ (a candidate takes two greedy passes before its
tasks, the baseline one).

On the 27B target a baseline's greedy pass over the five selection prompts is 70 s of decode and
the held-out pass 28 s (``benchmarks/cycle_cost.py --reference``); a later cycle on the same live
configuration spends neither.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from mcp_infra.contracts import (
    BASELINE_ID,
    CandidateRun,
    ReferenceAnswer,
    ReferenceAnswers,
    ReferenceSource,
    Sample,
)
from mcp_infra.core.suites import SuitePrompt


def prompt_digest(prompt: SuitePrompt, cap: int) -> str:
    """sha256 of a prompt as asked: its messages and its answer budget under ``cap``."""
    payload = {"messages": prompt.chat_messages(), "max_tokens": prompt.token_budget(cap)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def pass_digests(prompts: Sequence[SuitePrompt], cap: int) -> list[str]:
    """Each greedy answer's digest in a pass over ``prompts`` in order: the chain of every prompt
    asked so far in the start, this one included."""
    out: list[str] = []
    chain = ""
    for prompt in prompts:
        chain = hashlib.sha256(f"{chain}:{prompt_digest(prompt, cap)}".encode()).hexdigest()
        out.append(chain)
    return out


def _first_answers(samples: Iterable[Sample]) -> dict[str, Sample]:
    """Each prompt's first good answer of a first pass (repeat 0), by (start, order)."""
    out: dict[str, Sample] = {}
    for s in sorted(samples, key=lambda s: (s.start, s.repeat, s.order)):
        if s.repeat == 0 and s.error is None and s.prompt_id not in out:
            out[s.prompt_id] = s
    return out


def answers_of(
    run: CandidateRun,
    greedy_pass: Sequence[SuitePrompt],
    tasks: Sequence[SuitePrompt],
    cap: int,
    cycle_id: str,
) -> list[ReferenceAnswer]:
    """The answers ``run`` measured itself: the first greedy pass of its first start, where it
    covers ``greedy_pass`` whole (a pass cut short by a failed gate keeps its answers' digests
    right, so what it gave is kept), and its quality answers. Answers it took from a reference
    are not measured again here, and not kept again."""
    taken = run.reference
    out: list[ReferenceAnswer] = []
    if not (taken and taken.greedy):
        greedy = _first_answers(s for s in run.greedy if s.token_ids is not None)
        for prompt, digest in zip(greedy_pass, pass_digests(greedy_pass, cap), strict=True):
            if prompt.id not in greedy:
                break  # a later answer's digest assumes this one was asked
            out.append(
                ReferenceAnswer(
                    kind="greedy", digest=digest, cycle_id=cycle_id, sample=greedy[prompt.id]
                )
            )
    if not (taken and taken.quality):
        quality = _first_answers(s for s in run.samples if s.phase == "quality")
        for task in tasks:
            if task.id in quality:
                out.append(
                    ReferenceAnswer(
                        kind="quality",
                        digest=prompt_digest(task, cap),
                        cycle_id=cycle_id,
                        sample=quality[task.id],
                    )
                )
    return out


def merged(
    kept: ReferenceAnswers | None, key: str, recipe: str, new: Sequence[ReferenceAnswer]
) -> ReferenceAnswers:
    """``kept`` with ``new`` answers in: one answer per (kind, digest), the newest."""
    answers = {(a.kind, a.digest): a for a in (kept.answers if kept else [])}
    answers |= {(a.kind, a.digest): a for a in new}
    return ReferenceAnswers(key=key, recipe=recipe, answers=list(answers.values()))


class Taken(NamedTuple):
    """What a start need not ask: the baseline's greedy outputs and quality answers from its
    reference (empty where a part is missing), and where they came from."""

    greedy: list[Sample]
    quality: list[Sample]
    source: ReferenceSource | None


def take(
    kept: ReferenceAnswers | None,
    greedy_pass: Sequence[SuitePrompt],
    tasks: Sequence[SuitePrompt],
    cap: int,
    *,
    phase: str,
    logprobs: bool,
) -> Taken:
    """The greedy pass over ``greedy_pass`` and the quality answers to ``tasks`` where ``kept``
    holds every one of them (a part is taken whole or not at all), relabelled as the baseline's
    in ``phase``. ``logprobs``: the plan's fidelity measures read the answers' most likely
    tokens, so an answer kept without them is not enough."""
    if kept is None:
        return Taken([], [], None)
    by: dict[tuple[str, str], ReferenceAnswer] = {(a.kind, a.digest): a for a in kept.answers}

    def whole(kind: str, digests: Sequence[str]) -> list[ReferenceAnswer]:
        found = [a for d in digests if (a := by.get((kind, d))) is not None]
        if not digests or len(found) < len(digests):
            return []
        if logprobs and any(a.sample.top_logprobs is None for a in found):
            return []
        return found

    greedy = whole("greedy", pass_digests(greedy_pass, cap))
    quality = whole("quality", [prompt_digest(t, cap) for t in tasks])
    if not greedy and not quality:
        return Taken([], [], None)
    source = ReferenceSource(
        key=kept.key,
        cycles=sorted({a.cycle_id for a in [*greedy, *quality]})[:64],
        greedy=len(greedy),
        quality=len(quality),
    )
    return Taken(
        [_as_baseline(a.sample, phase) for a in greedy],
        [_as_baseline(a.sample, "quality") for a in quality],
        source,
    )


def _as_baseline(sample: Sample, phase: str) -> Sample:
    return sample.model_copy(
        update={"candidate": BASELINE_ID, "phase": phase, "start": 0, "round": 0}
    )
