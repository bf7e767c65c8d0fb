"""A configuration's reference answers (``core.reference``): what a run's answers are kept as,
and what a later baseline takes from them, whole or not at all."""

from __future__ import annotations

from mcp_infra.contracts import BASELINE_ID, CandidateRun, Sample
from mcp_infra.core.reference import answers_of, merged, pass_digests, prompt_digest, take
from mcp_infra.core.suites import SuitePrompt

CAP = 64


def prompt(pid: str, text: str = "", budget: int = 256) -> SuitePrompt:
    return SuitePrompt.model_validate(
        {
            "id": pid,
            "class": "code",
            "max_tokens": budget,
            "messages": [{"role": "user", "content": text or f"say {pid}"}],
        }
    )


PASS = [prompt("a"), prompt("b"), prompt("c")]
TASKS = [prompt("t1"), prompt("t2")]


def greedy(pid: str, *, repeat: int = 0, start: int = 0, tops: bool = False) -> Sample:
    return Sample(
        candidate="cand",
        prompt_id=pid,
        repeat=repeat,
        start=start,
        round=start,
        token_ids=[ord(c) for c in pid] + [repeat],
        text=f"{pid}:{repeat}",
        top_logprobs=[[(1, -0.1)]] if tops else None,
    )


def answer(pid: str, *, tops: bool = True) -> Sample:
    return Sample(
        candidate="cand",
        phase="quality",
        prompt_id=pid,
        repeat=0,
        text=f"answer {pid}",
        token_ids=[1, 2],
        top_logprobs=[[(1, -0.1)]] if tops else None,
    )


def measured(*, passes: int = 2, tops: bool = False) -> CandidateRun:
    """A candidate's first start (two greedy passes: its prompt cache) and a later start's
    greedy-free samples, with its quality answers."""
    return CandidateRun(
        candidate="cand",
        greedy=[greedy(p.id, repeat=r, tops=tops) for r in range(passes) for p in PASS],
        samples=[answer(t.id, tops=tops) for t in TASKS],
    )


def test_a_greedy_digest_is_the_pass_up_to_its_prompt() -> None:
    first = pass_digests(PASS, CAP)
    assert len(set(first)) == 3
    # Another prompt before it: every later answer met another prompt cache, another digest.
    other = pass_digests([prompt("a", "say something else"), *PASS[1:]], CAP)
    assert all(x != y for x, y in zip(first, other, strict=True))
    assert pass_digests(PASS[:2], CAP) == first[:2]  # what came after changes nothing before
    # The answer budget is part of the prompt as asked: a cap below it is another request.
    assert prompt_digest(PASS[0], 256) != prompt_digest(PASS[0], 128)
    assert prompt_digest(prompt("a", budget=64), 256) == prompt_digest(PASS[0], 64)


def test_a_run_keeps_its_first_pass_and_its_quality_answers() -> None:
    kept = answers_of(measured(), PASS, TASKS, CAP, "c-1")
    greedy_kept = [a for a in kept if a.kind == "greedy"]
    assert [a.sample.prompt_id for a in greedy_kept] == ["a", "b", "c"]
    assert all(a.sample.repeat == 0 for a in greedy_kept)  # the cached second pass is not kept
    assert [a.digest for a in greedy_kept] == pass_digests(PASS, CAP)
    assert [a.sample.prompt_id for a in kept if a.kind == "quality"] == ["t1", "t2"]
    assert {a.cycle_id for a in kept} == {"c-1"}


def test_a_pass_cut_short_keeps_only_what_came_before_the_gap() -> None:
    run = measured()
    run = run.model_copy(update={"greedy": [s for s in run.greedy if s.prompt_id != "b"]})
    kept = [a.sample.prompt_id for a in answers_of(run, PASS, [], CAP, "c-1")]
    assert kept == ["a"]  # c's digest says b was asked before it: it was not


def test_answers_a_run_took_from_a_reference_are_not_kept_again() -> None:
    store = merged(None, "0" * 64, "r", answers_of(measured(tops=True), PASS, TASKS, CAP, "c-1"))
    taken = take(store, PASS, TASKS, CAP, phase="measure", logprobs=True)
    run = CandidateRun(
        candidate=BASELINE_ID,
        greedy=taken.greedy,
        samples=taken.quality,
        reference=taken.source,
    )
    assert answers_of(run, PASS, TASKS, CAP, "c-2") == []


def test_a_baseline_takes_a_kept_pass_whole_relabelled_as_its_own() -> None:
    store = merged(None, "f" * 64, "r", answers_of(measured(tops=True), PASS, TASKS, CAP, "c-1"))
    taken = take(store, PASS, TASKS, CAP, phase="heldout", logprobs=True)
    assert [s.prompt_id for s in taken.greedy] == ["a", "b", "c"]
    assert {(s.candidate, s.phase, s.start, s.repeat) for s in taken.greedy} == {
        (BASELINE_ID, "heldout", 0, 0)
    }
    assert [s.token_ids for s in taken.greedy] == [greedy(p.id).token_ids for p in PASS]
    assert {(s.candidate, s.phase) for s in taken.quality} == {(BASELINE_ID, "quality")}
    assert taken.source is not None
    assert (taken.source.key, taken.source.cycles) == ("f" * 64, ["c-1"])
    assert (taken.source.greedy, taken.source.quality) == (3, 2)


def test_a_part_is_taken_whole_or_asked_again() -> None:
    store = merged(None, "0" * 64, "r", answers_of(measured(), PASS, TASKS, CAP, "c-1"))
    longer = [*PASS, prompt("d")]
    taken = take(store, longer, TASKS, CAP, phase="measure", logprobs=False)
    assert taken.greedy == []  # d was never asked: the whole pass is asked again
    assert len(taken.quality) == 2 and taken.source is not None
    assert (taken.source.greedy, taken.source.quality) == (0, 2)
    reordered = take(store, PASS[::-1], [], CAP, phase="measure", logprobs=False)
    assert reordered.greedy == [] and reordered.source is None  # another cache on the way
    assert take(None, PASS, TASKS, CAP, phase="measure", logprobs=False).source is None


def test_answers_kept_without_most_likely_tokens_do_not_serve_a_lossy_plan() -> None:
    store = merged(None, "0" * 64, "r", answers_of(measured(tops=False), PASS, [], CAP, "c-1"))
    assert take(store, PASS, [], CAP, phase="measure", logprobs=True).greedy == []
    assert len(take(store, PASS, [], CAP, phase="measure", logprobs=False).greedy) == 3


def test_the_newest_answer_of_a_prompt_is_kept() -> None:
    old = answers_of(measured(), PASS, TASKS, CAP, "c-1")
    new = answers_of(measured(), PASS[:1], [], CAP, "c-2")
    store = merged(merged(None, "0" * 64, "r", old), "0" * 64, "r", new)
    assert len(store.answers) == 5
    by_prompt = {(a.kind, a.sample.prompt_id): a.cycle_id for a in store.answers}
    assert by_prompt[("greedy", "a")] == "c-2" and by_prompt[("greedy", "b")] == "c-1"
    taken = take(store, PASS, [], CAP, phase="measure", logprobs=False)
    assert taken.source is not None and taken.source.cycles == ["c-1", "c-2"]
