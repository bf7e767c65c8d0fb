"""The continuous measure: identical outputs, shared prefix, KL and top-token agreement."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import Sample
from mcp_infra.core.fidelity import matched_answers, measure, next_token_kl, pair_figures, top_token


def lp(*pairs: tuple[int, float]) -> list[tuple[int, float]]:
    """A top-k list from (token, probability) pairs."""
    return [(t, math.log(p)) for t, p in pairs]


def greedy(cid: str, pid: str, ids: list[int], tops=None, text: str = "", **kw) -> Sample:
    return Sample(
        candidate=cid, prompt_id=pid, repeat=0, token_ids=ids, top_logprobs=tops, text=text, **kw
    )


def test_kl_is_zero_for_the_same_list_and_exact_where_both_lists_cover_everything() -> None:
    p = lp((1, 0.6), (2, 0.3), (3, 0.1))
    assert next_token_kl(p, p) == 0.0
    q = lp((1, 0.3), (2, 0.6), (3, 0.1))
    exact = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)
    assert next_token_kl(p, q) == pytest.approx(exact)


def test_kl_counts_the_mass_outside_the_lists_as_one_bin() -> None:
    p = lp((1, 0.5), (2, 0.3))  # 0.2 elsewhere
    q = lp((1, 0.5), (2, 0.1))  # 0.4 elsewhere
    exact = 0.3 * math.log(0.3 / 0.1) + 0.2 * math.log(0.2 / 0.4)
    assert next_token_kl(p, q) == pytest.approx(exact)


def test_a_token_missing_from_the_candidates_list_shares_its_leftover_mass() -> None:
    p = lp((1, 0.5), (2, 0.3))
    q = lp((1, 0.5), (9, 0.4))  # token 2 is off the candidate's list: 0.1 left, capped at 0.4
    q2 = 0.1
    q_rest = 1 - 0.5 - q2
    exact = 0.3 * math.log(0.3 / q2) + 0.2 * math.log(0.2 / q_rest)
    assert next_token_kl(p, q) == pytest.approx(exact)
    # Two missing tokens split it, each capped at the candidate's least listed probability.
    assert next_token_kl(lp((1, 0.4), (2, 0.3), (3, 0.2)), lp((1, 0.95), (9, 0.01))) > 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6),
    st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6),
    st.integers(0, 4),
)
def test_kl_is_finite_and_never_negative(a: list[float], b: list[float], shift: int) -> None:
    p = lp(*((i, x / (sum(a) * 1.01)) for i, x in enumerate(a)))
    q = lp(*((i + shift, x / (sum(b) * 1.01)) for i, x in enumerate(b)))
    value = next_token_kl(p, q)
    assert value >= 0 and math.isfinite(value)


def test_the_top_token_breaks_ties_towards_the_lowest_id() -> None:
    assert top_token(lp((7, 0.4), (3, 0.4), (5, 0.2))) == 3
    assert top_token([]) is None


def test_a_pair_compares_positions_up_to_and_including_the_first_difference() -> None:
    same = lp((1, 0.9), (2, 0.1))
    other = lp((2, 0.6), (1, 0.4))
    base = greedy("baseline", "p", [1, 1, 1, 1], [same] * 4)
    cand = greedy("c", "p", [1, 1, 2, 2], [same, same, other, other])
    fig = pair_figures("p", base, cand)
    assert (fig.identical, fig.prefix, fig.positions, fig.agree) == (False, 2, 3, 2)
    assert fig.kl == pytest.approx(next_token_kl(same, other))
    whole = pair_figures("p", base, base)
    assert (whole.identical, whole.prefix, whole.positions, whole.agree) == (True, 4, 4, 4)
    assert whole.kl == 0 and whole.top_k == 2 and whole.asked


def test_a_pair_without_ids_compares_text_and_one_without_logprobs_has_no_positions() -> None:
    base = Sample(candidate="baseline", prompt_id="p", repeat=0, text="hello world")
    cand = Sample(candidate="c", prompt_id="p", repeat=0, text="hello there")
    fig = pair_figures("p", base, cand)
    assert (fig.tokens, fig.prefix, fig.positions, fig.asked) == (False, 6, 0, False)
    assert not pair_figures("p", base, None).identical
    failed = cand.model_copy(update={"error": "HTTP 500"})
    assert pair_figures("p", base, failed).prefix == 0


def test_paired_uses_the_baselines_first_answer_and_every_candidate_answer() -> None:
    base = [greedy("baseline", "a", [1, 2]), greedy("baseline", "b", [3])]
    again = greedy("c", "a", [1, 9]).model_copy(update={"repeat": 1})
    cand = [greedy("c", "a", [1, 2]), again, greedy("c", "z", [5])]
    got = [(p.prompt, p.identical, p.prefix) for p in matched_answers(base, cand, "g:")]
    assert got == [("g:a", True, 2), ("g:a", False, 1), ("g:b", False, 0), ("g:z", False, 0)]


def _pairs(identical: int, total: int) -> list:
    base = [greedy("baseline", f"p{i}", [1, 2, 3], [lp((1, 0.9))] * 3) for i in range(total)]
    cand = [
        greedy("c", f"p{i}", [1, 2, 3] if i < identical else [1, 5, 5], [lp((1, 0.8))] * 3)
        for i in range(total)
    ]
    return matched_answers(base, cand)


def test_the_measure_has_intervals_around_its_values_and_is_seeded() -> None:
    pairs = _pairs(30, 40)
    m = measure(pairs, level=0.95, resamples=500, seed=7)
    assert m is not None and (m.pairs, m.prompts, m.unit) == (40, 40, "tokens")
    assert m.identical_share.value == 0.75
    assert m.identical_share.low < 0.75 < m.identical_share.high
    assert m.prefix_length.value == pytest.approx((30 * 3 + 10 * 1) / 40)
    assert m.mean_kl is not None and m.top_agreement is not None
    per = 0.9 * math.log(0.9 / 0.8) + 0.1 * math.log(0.1 / 0.2)
    assert m.mean_kl.value == pytest.approx(per)
    assert m.top_agreement.value == 1.0 and m.positions == 30 * 3 + 10 * 2
    assert m == measure(pairs, level=0.95, resamples=500, seed=7)
    assert measure([], level=0.95, resamples=500, seed=7) is None


def test_a_prompt_asked_twice_is_resampled_as_one() -> None:
    base = [greedy("baseline", "p", [1])]
    cand = [greedy("c", "p", [1]), greedy("c", "p", [2]).model_copy(update={"repeat": 1})]
    m = measure(matched_answers(base, cand), level=0.9, resamples=200, seed=1)
    assert m is not None and (m.pairs, m.prompts) == (2, 1)
    assert m.identical_share.low == m.identical_share.high == 0.5  # one cluster: no spread
