"""Quality and equality gates: pure checks of what a server answered.

Task checkers (core.answers) read the answer out of a reply (a number, a JSON object, a word, a
function run against tests) and fail a reply that states a contradicting result anywhere, so
"not 391, it is 390" cannot pass for "391". Smoke checks catch broken output (empty, U+FFFD,
runaway loops) and are judged relative to the baseline, because tiny demo models loop by
themselves and a candidate cannot be blamed for the baseline's own failure. The lossy budget's
gates are core.budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from mcp_infra.contracts import CodeRun, Comparison, GateResult, Sample
from mcp_infra.core.answers import check_answer
from mcp_infra.core.tasks import TASKS
from mcp_infra.core.tasks import TaskSpec as TaskSpec  # the task list's type, named here too

# --------------------------------------------------------------------------------------------
# Smoke checks
# --------------------------------------------------------------------------------------------

# Thresholds for runaway repetition. Degenerate decoding repeats a unit until max_tokens, so real
# loops are long; legitimate text rarely repeats the same unit back to back more than a few times.
# Word loops: a block of 1..64 words repeated back to back, at least 4 copies covering >= 32
# words ("very very very" or a sentence said twice is fine; the same sentence 4+ times is not).
WORD_MAX_PERIOD = 64
WORD_MIN_COPIES = 4
WORD_MIN_SPAN = 32
# Character loops catch what has no spaces ("ingingingin…", "!!!!…", CJK): a unit of 1..16
# characters with >= 8 copies covering >= 100 characters. 100 is above the usual 72–80 column
# rulers ("=" * 80) that code and Markdown legitimately contain.
CHAR_MAX_PERIOD = 16
CHAR_MIN_COPIES = 8
CHAR_MIN_SPAN = 100
# Whitespace-only loops ("\n\n\n…") need a longer run: indentation and blank lines are normal.
WHITESPACE_MIN_SPAN = 200

SMOKE_CHECKS = ("empty", "replacement_char", "repetition")


def _periodic_runs(seq: Sequence[str], period: int) -> Iterable[tuple[int, int]]:
    """(start, length) of every maximal span of ``seq`` that repeats with ``period``."""
    start = None
    n = len(seq)
    for i in range(n - period + 1):
        same = i + period < n and seq[i] == seq[i + period]
        if same and start is None:
            start = i
        elif not same and start is not None:
            yield start, i - start + period
            start = None


def _find_loop(
    seq: Sequence[str],
    max_period: int,
    min_copies: int,
    min_span: int,
    accept: Callable[[int, int], bool] = lambda start, period: True,
) -> tuple[int, int, int] | None:
    """Longest back-to-back repetition (start, period, span) meeting the thresholds, if any.

    ``accept(start, period)`` can refuse a unit. Ties go to the earliest start, then the shortest
    period, so the answer is deterministic.
    """
    best: tuple[int, int, int] | None = None
    for period in range(1, min(max_period, len(seq) // 2) + 1):
        for start, span in _periodic_runs(seq, period):
            if span // period < min_copies or span < min_span or not accept(start, period):
                continue
            if best is None or (span, -start, -period) > (best[2], -best[0], -best[1]):
                best = (start, period, span)
    return best


def _preview(unit: str, limit: int = 40) -> str:
    return repr(unit if len(unit) <= limit else unit[:limit] + "…")


def repetition_failure(text: str) -> str | None:
    """Describe a runaway loop anywhere in ``text`` (also one that starts late), or None."""
    words = text.split()
    loop = _find_loop(words, WORD_MAX_PERIOD, WORD_MIN_COPIES, WORD_MIN_SPAN)
    if loop:
        start, period, span = loop
        unit = " ".join(words[start : start + period])
        return (
            f"runaway repetition: {_preview(unit)} ({period} word(s)) repeated "
            f"{span // period} times from word {start}"
        )
    # Whitespace-only units are left to the blank-run rule below (indentation is normal).
    loop = _find_loop(
        text,
        CHAR_MAX_PERIOD,
        CHAR_MIN_COPIES,
        CHAR_MIN_SPAN,
        accept=lambda start, period: bool(text[start : start + period].strip()),
    )
    if loop:
        start, period, span = loop
        return (
            f"runaway repetition: {_preview(text[start : start + period])} repeated "
            f"{span // period} times from character {start}"
        )
    blank = max((len(m.group()) for m in re.finditer(r"\s+", text)), default=0)
    if blank >= WHITESPACE_MIN_SPAN:
        return f"runaway repetition: a run of {blank} whitespace characters"
    return None


def smoke_checks(text: str) -> dict[str, str]:
    """Failed smoke checks keyed by check name (see SMOKE_CHECKS), each with its description."""
    if not text.strip():
        return {"empty": "empty output"}
    failed = {}
    bad = text.count("\ufffd")
    if bad:
        failed["replacement_char"] = (
            f"contains {bad} U+FFFD replacement character(s) (undecodable output)"
        )
    loop = repetition_failure(text)
    if loop:
        failed["repetition"] = loop
    return failed


def smoke_failures(text: str) -> list[str]:
    """Broken-output checks: empty, U+FFFD (undecodable bytes), runaway repetition."""
    return list(smoke_checks(text).values())


def smoke_gate(baseline: Sequence[Sample], candidate: Sequence[Sample]) -> GateResult:
    """Smoke checks on the candidate's outputs, excused where the baseline fails the same check.

    Outputs are grouped by prompt id; a check fails for a prompt if any output of that prompt
    fails it. Samples with a request error are left to the error-rate rule.
    """
    base = _kinds_by_prompt(baseline)
    cand = _kinds_by_prompt(candidate)
    blamed: list[str] = []
    excused: list[str] = []
    for pid in sorted(cand):
        for kind, failure in sorted(cand[pid].items()):
            if kind in base.get(pid, {}):
                excused.append(f"{pid}: {kind} excused because the baseline fails it too")
            else:
                blamed.append(f"{pid}: {failure}")
    if not cand:
        return GateResult(gate="smoke", passed=True, detail="no outputs to check")
    parts = []
    if blamed:
        parts.append("failed on " + "; ".join(blamed))
    else:
        parts.append(f"all {len(cand)} prompt(s) pass where the baseline passes")
    if excused:
        parts.append("excused: " + "; ".join(excused))
    return GateResult(gate="smoke", passed=not blamed, detail=". ".join(parts))


def _kinds_by_prompt(samples: Sequence[Sample]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for s in sorted(samples, key=lambda s: (s.prompt_id, s.phase, s.repeat, s.order)):
        if s.error is not None:
            continue
        kinds = out.setdefault(s.prompt_id, {})
        for kind, failure in smoke_checks(s.text).items():
            kinds.setdefault(kind, failure)
    return out


# --------------------------------------------------------------------------------------------
# Task checkers (quality suites; the checkers themselves are core.answers, the tasks core.tasks)
# --------------------------------------------------------------------------------------------


class TaskCheck(BaseModel):
    """Outcome of one task checker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    passed: bool
    detail: str


_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_OPEN_THINK = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</(think|thinking|reasoning)>", re.IGNORECASE)
_HARMONY_FINAL = "<|channel|>final<|message|>"


def _without_thinking(text: str) -> tuple[str, bool]:
    """(the reply's answer part, whether a thinking block was left open)."""
    if _HARMONY_FINAL in text:
        text = text.rsplit(_HARMONY_FINAL, 1)[1]
    text = _THINK.sub("", text)
    closes = list(_CLOSE_THINK.finditer(text))
    if closes:  # a template opened the block in the prompt: the reply starts inside it
        text = text[closes[-1].end() :]
    opened = _OPEN_THINK.search(text)
    return (text[: opened.start()], True) if opened else (text, False)


def strip_thinking(text: str) -> str:
    """The answer part of a reply: the harmony final channel, closed thinking blocks removed,
    text before a lone closing tag dropped (templates that open the block in the prompt), an
    unclosed block dropped. The one thinking stripper: checkers and the planner use it."""
    return _without_thinking(text)[0]


def strip_think(text: str) -> str | None:
    """The answer a checker judges: as ``strip_thinking``, but None when a thinking block never
    closes (a reply still thinking has given no answer)."""
    answer, unclosed = _without_thinking(text)
    return None if unclosed else answer


def reply_text(text: str) -> str | None:
    """The part of a reply a checker reads: CRLF line endings made LF, thinking removed; None
    when a thinking block never closes."""
    return strip_think(text.replace("\r\n", "\n"))


def list_tasks() -> list[TaskSpec]:
    """Every quality task with its exact prompt and what its checker requires."""
    return list(TASKS.values())


DETAIL_LIMIT = 300
"""The longest detail a task check reports: the checkers quote the reply, which is untrusted."""


def _capped(detail: str) -> str:
    return detail if len(detail) <= DETAIL_LIMIT else detail[:DETAIL_LIMIT] + "…"


def check_task(task_id: str, text: str, code_run: CodeRun | None = None) -> TaskCheck:
    """Check one reply against its task, after removing a leading reasoning block. A code task
    needs the ``CodeRun`` that ran this reply's code (``procs.sandbox``)."""
    spec = TASKS.get(task_id)
    if spec is None:
        return TaskCheck(task=task_id, passed=False, detail=f"unknown task {task_id!r}")
    reply = reply_text(text)
    if reply is None:
        return TaskCheck(task=task_id, passed=False, detail="reasoning block never closed")
    passed, detail = check_answer(spec.answer, spec.prompt, reply, code_run)
    return TaskCheck(task=task_id, passed=passed, detail=_capped(detail))


def check_sample(sample: Sample) -> TaskCheck:
    """A quality sample (prompt id = task id) checked against its task; a failed request fails."""
    if sample.error is not None:
        return TaskCheck(
            task=sample.prompt_id, passed=False, detail=f"request failed ({sample.error})"
        )
    return check_task(sample.prompt_id, sample.text, sample.code_run)


def quality_gate(samples: Sequence[Sample]) -> GateResult:
    """Every ``quality`` sample (prompt id = task id) must pass its task checker: how plans
    frozen before quality budgets judged a lossy candidate (core.budget judges it against the
    baseline's own answers)."""
    rows = sorted(
        (s for s in samples if s.phase == "quality"), key=lambda s: (s.prompt_id, s.repeat, s.order)
    )
    if not rows:
        return GateResult(gate="quality", passed=False, detail="no quality outputs to check")
    failed = []
    for s in rows:
        check = check_sample(s)
        if not check.passed:
            failed.append(f"{s.prompt_id}: {check.detail}")
    if failed:
        detail = f"{len(rows) - len(failed)} of {len(rows)} task(s) passed; failed " + "; ".join(
            failed
        )
    else:
        detail = f"all {len(rows)} task(s) passed"
    return GateResult(gate="quality", passed=not failed, detail=detail)


# --------------------------------------------------------------------------------------------
# Greedy comparison (lossless) and agreement (lossy)
# --------------------------------------------------------------------------------------------

CONTEXT_TOKENS = 3
CONTEXT_CHARS = 20


def _first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _token_context(ids: Sequence[int], at: int) -> str:
    before = " ".join(str(t) for t in ids[max(0, at - CONTEXT_TOKENS) : at])
    here = f"[{ids[at]}]" if at < len(ids) else "[end]"
    after = " ".join(str(t) for t in ids[at + 1 : at + 1 + CONTEXT_TOKENS])
    return " ".join(part for part in (before, here, after) if part)


def _text_context(text: str, at: int) -> str:
    before = text[max(0, at - CONTEXT_CHARS) : at]
    here = f"[{text[at]}]" if at < len(text) else "[end]"
    after = text[at + 1 : at + 1 + CONTEXT_CHARS]
    return repr(before + here + after)


def compare_outputs(prompt_id: str, baseline: Sample, candidate: Sample) -> Comparison:
    """Compare two greedy outputs: token ids when both have them, else text."""
    if baseline.token_ids is not None and candidate.token_ids is not None:
        ids = baseline.token_ids, candidate.token_ids
        at = _first_difference(*ids)
        if at is None:
            return Comparison(prompt_id=prompt_id, identical=True, compared="token_ids")
        contexts = _token_context(ids[0], at), _token_context(ids[1], at)
        return _diverged(prompt_id, "token_ids", at, contexts)
    at = _first_difference(baseline.text, candidate.text)
    if at is None:
        return Comparison(prompt_id=prompt_id, identical=True, compared="text")
    contexts = _text_context(baseline.text, at), _text_context(candidate.text, at)
    return _diverged(prompt_id, "text", at, contexts)


def _diverged(
    prompt_id: str, compared: Literal["token_ids", "text"], at: int, contexts: tuple[str, str]
) -> Comparison:
    return Comparison(
        prompt_id=prompt_id,
        identical=False,
        compared=compared,
        first_divergence=at,
        baseline_context=contexts[0],
        candidate_context=contexts[1],
    )


def _greedy_by_prompt(samples: Sequence[Sample]) -> dict[str, Sample]:
    """One greedy output per prompt: the first by (repeat, order) when there are several."""
    out: dict[str, Sample] = {}
    for s in sorted(samples, key=lambda s: (s.prompt_id, s.repeat, s.order)):
        out.setdefault(s.prompt_id, s)
    return out


def _pair_greedy(
    baseline: Sequence[Sample], candidate: Sequence[Sample]
) -> tuple[list[Comparison], list[str]]:
    """Comparisons for prompts both sides answered, and problems (missing or failed outputs)."""
    base = _greedy_by_prompt(baseline)
    cand = _greedy_by_prompt(candidate)
    # A candidate may answer a prompt more than once (again with the prompt cached): every
    # answer must equal the baseline's first.
    repeats = [
        s
        for s in sorted(candidate, key=lambda s: (s.prompt_id, s.repeat, s.order))
        if s.prompt_id in cand and s is not cand[s.prompt_id]
    ]
    comparisons: list[Comparison] = []
    problems: list[str] = []
    for pid in sorted(set(base) | set(cand)):
        if pid not in cand:
            problems.append(f"{pid}: missing from the candidate")
        elif pid not in base:
            problems.append(f"{pid}: missing from the baseline")
        elif base[pid].error is not None:
            problems.append(f"{pid}: baseline request failed ({base[pid].error})")
        else:
            for sample in [cand[pid], *(s for s in repeats if s.prompt_id == pid)]:
                label = pid if sample is cand[pid] else f"{pid} (asked again, prefix cached)"
                if sample.error is not None:
                    problems.append(f"{label}: candidate request failed ({sample.error})")
                else:
                    comparisons.append(compare_outputs(label, base[pid], sample))
    return comparisons, problems


def _divergences(comparisons: Sequence[Comparison]) -> list[str]:
    return [
        f"{c.prompt_id} diverges at {'token' if c.compared == 'token_ids' else 'character'} "
        f"{c.first_divergence} (baseline {c.baseline_context} vs candidate {c.candidate_context})"
        for c in comparisons
        if not c.identical
    ]


def compare_greedy(baseline: Sequence[Sample], candidate: Sequence[Sample]) -> GateResult:
    """Lossless gate: every prompt's greedy output must equal the baseline's exactly."""
    comparisons, problems = _pair_greedy(baseline, candidate)
    total = len(comparisons) + len(problems)
    identical = sum(1 for c in comparisons if c.identical)
    if total == 0:
        return GateResult(gate="lossless", passed=False, detail="no greedy outputs to compare")
    detail = f"{identical} of {total} greedy output(s) identical"
    issues = _divergences(comparisons) + problems
    if issues:
        detail += "; " + "; ".join(issues)
    return GateResult(
        gate="lossless", passed=identical == total, detail=detail, comparisons=comparisons
    )


def lossy_agreement(
    baseline: Sequence[Sample], candidate: Sequence[Sample], min_identical_fraction: float
) -> GateResult:
    """Lossy gate: enough prompts must still match the baseline's greedy output exactly.

    A prompt missing or failed on either side counts as not identical. The mean first-divergence
    position is over the prompts that diverge (how early the outputs part ways).
    """
    comparisons, problems = _pair_greedy(baseline, candidate)
    total = len(comparisons) + len(problems)
    if total == 0:
        return GateResult(gate="agreement", passed=False, detail="no greedy outputs to compare")
    identical = sum(1 for c in comparisons if c.identical)
    fraction = identical / total
    positions = [c.first_divergence for c in comparisons if c.first_divergence is not None]
    detail = (
        f"{identical} of {total} greedy output(s) identical ({fraction:.0%}; at least "
        f"{min_identical_fraction:.0%} required)"
    )
    if positions:
        detail += f"; mean first divergence at position {sum(positions) / len(positions):.1f}"
    if problems:
        detail += "; " + "; ".join(problems)
    return GateResult(
        gate="agreement",
        passed=fraction >= min_identical_fraction and not problems,
        detail=detail,
        comparisons=comparisons,
    )


def split_agreement(
    baseline: Sequence[Sample],
    candidate: Sequence[Sample],
    min_identical_fraction: float,
    ranks: int,
) -> GateResult:
    """A model split over ranks: the lossless comparison is reported with its first divergence
    (a split changes the order of reductions, so greedy tokens may part from one process's),
    and the recipe is judged as lossy, by the agreement it keeps."""
    lossless = compare_greedy(baseline, candidate)
    agreement = lossy_agreement(baseline, candidate, min_identical_fraction)
    words = (
        f"split over {ranks} ranks, judged as lossy; lossless comparison: {lossless.detail}; "
        f"agreement: {agreement.detail}"
    )
    return agreement.model_copy(update={"detail": words})
