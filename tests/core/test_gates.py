"""Gates: smoke checks, greedy comparison, agreement, and the suites."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import Sample
from mcp_infra.core.gates import (
    compare_greedy,
    list_tasks,
    lossy_agreement,
    smoke_failures,
    smoke_gate,
    strip_think,
)
from mcp_infra.core.suites import Suite
from mcp_infra.core.tasks import QUALITY, SMOKE
from mcp_infra.state.catalog import list_suites, load_suite

PROSE = (
    "Speculative decoding drafts a few tokens with a small model and lets the large model "
    "verify them in one pass. When the draft is usually right, the large model emits several "
    "tokens per step; when it is usually wrong, the extra work makes every step slower. "
    "Measuring on the actual machine is therefore the only honest way to decide."
)
CODE = """```python
def fizzbuzz(n: int) -> str:
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)


# ==============================================================================
for i in range(1, 16):
    print(fizzbuzz(i))
```"""


# ------------------------------------------------------------------ smoke checks


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PROSE, []),
        (CODE, []),
        ("391", []),
        ("very very very good", []),
        ("| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |", []),
        ("=" * 80, []),  # a ruler, not a loop
        ("x = 1\n" + " " * 150 + "y = 2", []),  # deep whitespace is not a loop by itself
        ("", ["empty output"]),
        ("   \n\t ", ["empty output"]),
    ],
)
def test_smoke_passes_or_flags_exactly(text, expected):
    assert smoke_failures(text) == expected


def test_smoke_flags_replacement_character():
    [failure] = smoke_failures("Caf\ufffd au lait \ufffd")
    assert "U+FFFD" in failure and "2" in failure


def test_smoke_flags_phrase_loop_starting_late():
    text = PROSE + " " + PROSE.replace("Measuring", "Testing") + " "
    text += "and then the model said so. " * 12
    [failure] = smoke_failures(text)
    assert failure.startswith("runaway repetition")
    assert "'and then the model said so.'" in failure
    start = len((PROSE + " " + PROSE).split())
    assert f"from word {start}" in failure


@pytest.mark.parametrize(
    "text",
    [
        "ing" * 60,  # a sub-word loop without spaces
        "!" * 120,
        "好的" * 60,
        "the the the the " * 10,
        "a" + "\n" * 250 + "b",
    ],
)
def test_smoke_flags_other_loops(text):
    failures = smoke_failures(text)
    assert len(failures) == 1 and failures[0].startswith("runaway repetition")


def test_smoke_a_sentence_said_twice_is_fine():
    assert smoke_failures("I agree. I agree. " + PROSE) == []
    assert smoke_failures(PROSE + " " + PROSE) == []


@settings(max_examples=50, deadline=None)
@given(
    prefix=st.lists(st.from_regex(r"[a-z]{3,9}", fullmatch=True), min_size=0, max_size=300),
    unit=st.lists(st.from_regex(r"[a-z]{2,8}", fullmatch=True), min_size=1, max_size=12),
    copies=st.integers(min_value=40, max_value=60),
)
def test_smoke_finds_any_long_loop_anywhere(prefix, unit, copies):
    text = " ".join(prefix + unit * copies)
    assert any(f.startswith("runaway repetition") for f in smoke_failures(text))


def test_suite_texts_pass_smoke():
    for name in list_suites():
        for prompt in load_suite(name).prompts:
            for message in prompt.messages:
                assert smoke_failures(message.content) == [], (name, prompt.id)


# ------------------------------------------------------------------ reasoning blocks
# (the task checkers themselves are tested in test_answers.py)


def test_strip_think():
    assert strip_think("<think>abc</think>\n391") == "\n391"
    assert strip_think("  <think>abc</think>391").strip() == "391"
    assert strip_think("reasoning only</think>391") == "391"  # template opened the block
    assert strip_think("<think>never closed") is None
    assert strip_think("391") == "391"


# ------------------------------------------------------------------ greedy comparison


def g(cid, pid, text="", ids=None, error=None):
    return Sample(candidate=cid, prompt_id=pid, repeat=0, text=text, token_ids=ids, error=error)


def test_compare_greedy_identical_token_ids():
    base = [g("baseline", "p1", "x", [1, 2, 3]), g("baseline", "p2", "y", [4, 5])]
    cand = [g("a:b", "p2", "different text", [4, 5]), g("a:b", "p1", "x", [1, 2, 3])]
    result = compare_greedy(base, cand)
    assert result.passed and result.gate == "lossless"
    assert result.detail == "2 of 2 greedy output(s) identical"
    assert [c.compared for c in result.comparisons] == ["token_ids", "token_ids"]


def test_compare_greedy_reports_first_token_divergence_with_context():
    base = [g("baseline", "p1", ids=[10, 11, 12, 13, 14, 15, 16, 17])]
    cand = [g("a:b", "p1", ids=[10, 11, 12, 13, 14, 99, 16, 17])]
    result = compare_greedy(base, cand)
    assert not result.passed
    [c] = result.comparisons
    assert c.first_divergence == 5 and c.compared == "token_ids"
    assert c.baseline_context == "12 13 14 [15] 16 17"
    assert c.candidate_context == "12 13 14 [99] 16 17"
    assert "0 of 1" in result.detail and "token 5" in result.detail


def test_compare_greedy_prefix_diverges_at_the_shorter_end():
    result = compare_greedy([g("baseline", "p1", ids=[1, 2, 3])], [g("a:b", "p1", ids=[1, 2])])
    [c] = result.comparisons
    assert not result.passed and c.first_divergence == 2
    assert c.baseline_context == "1 2 [3]" and c.candidate_context == "1 2 [end]"


def test_compare_greedy_falls_back_to_text():
    base = [g("baseline", "p1", "The quick brown fox jumps", [1, 2])]
    cand = [g("a:b", "p1", "The quick brown cat jumps")]  # no token ids on one side
    result = compare_greedy(base, cand)
    [c] = result.comparisons
    assert not result.passed and c.compared == "text"
    assert c.first_divergence == 16
    assert "[f]" in c.baseline_context and "[c]" in c.candidate_context
    assert "character 16" in result.detail
    same = compare_greedy(base, [g("a:b", "p1", "The quick brown fox jumps")])
    assert same.passed and same.comparisons[0].compared == "text"


@pytest.mark.parametrize(
    ("base", "cand", "problem"),
    [
        ([g("baseline", "p1", "x"), g("baseline", "p2", "y")], [g("a:b", "p1", "x")], "p2"),
        ([g("baseline", "p1", "x")], [g("a:b", "p1", "x"), g("a:b", "p3", "z")], "p3"),
        ([g("baseline", "p1", "x")], [g("a:b", "p1", "x", error="boom")], "boom"),
        ([], [], "no greedy outputs"),
    ],
)
def test_compare_greedy_missing_or_failed_prompt_fails(base, cand, problem):
    result = compare_greedy(base, cand)
    assert not result.passed
    assert problem in result.detail


def test_lossy_agreement():
    base = [g("baseline", f"p{i}", ids=[1, 2, 3, 4]) for i in range(4)]
    cand = [
        g("a:b", "p0", ids=[1, 2, 3, 4]),
        g("a:b", "p1", ids=[1, 2, 3, 4]),
        g("a:b", "p2", ids=[1, 9, 9, 9]),
        g("a:b", "p3", ids=[1, 2, 3, 9]),
    ]
    half = lossy_agreement(base, cand, 0.5)
    assert half.passed and half.gate == "agreement"
    assert "2 of 4" in half.detail and "50%" in half.detail
    assert "mean first divergence at position 2.0" in half.detail
    assert not lossy_agreement(base, cand, 0.75).passed
    missing = lossy_agreement(base, cand[:3], 0.5)
    assert not missing.passed and "p3: missing from the candidate" in missing.detail


# ------------------------------------------------------------------ smoke gate


LOOP = "round and round we go " * 12


def test_smoke_gate_blames_only_new_failures():
    base = [g("baseline", "p1", PROSE), g("baseline", "p2", PROSE)]
    cand = [g("a:b", "p1", PROSE), g("a:b", "p2", LOOP)]
    result = smoke_gate(base, cand)
    assert not result.passed and result.gate == "smoke"
    assert "p2: runaway repetition" in result.detail


def test_smoke_gate_excuses_the_baselines_own_failures():
    base = [g("baseline", "p1", LOOP), g("baseline", "p2", "")]
    cand = [g("a:b", "p1", "spin " * 40), g("a:b", "p2", "")]
    result = smoke_gate(base, cand)
    assert result.passed
    assert "p1: repetition excused because the baseline fails it too" in result.detail
    assert "p2: empty excused because the baseline fails it too" in result.detail


def test_smoke_gate_does_not_excuse_a_different_check():
    base = [g("baseline", "p1", LOOP)]
    cand = [g("a:b", "p1", "caf\ufffd")]
    result = smoke_gate(base, cand)
    assert not result.passed and "U+FFFD" in result.detail


def test_smoke_gate_passes_clean_outputs_and_skips_errors():
    base = [g("baseline", "p1", PROSE)]
    cand = [g("a:b", "p1", PROSE), g("a:b", "p2", "", error="timeout")]
    result = smoke_gate(base, cand)
    assert result.passed and "1 prompt(s)" in result.detail


# ------------------------------------------------------------------ suites


def test_shipped_suites_load():
    assert {"smoke", "quality", "general", "demo-speed"} <= set(list_suites())
    for name in ("smoke", "quality", "general", "demo-speed"):
        assert load_suite(name).id == name


@pytest.mark.parametrize(("name", "tasks"), [("smoke", SMOKE), ("quality", QUALITY)])
def test_quality_suites_match_the_checkers(name, tasks):
    suite = load_suite(name)
    assert suite.kind == "quality"
    assert {p.id: p.messages[-1].content for p in suite.prompts} == {t.id: t.prompt for t in tasks}


def test_the_quality_suite_has_every_kind_of_task_and_short_prompts():
    suite = load_suite("quality")
    kinds = {}
    for task in QUALITY:
        kinds[task.answer.kind] = kinds.get(task.answer.kind, 0) + 1
    assert len(suite.prompts) >= 30
    assert set(kinds) == {"number", "json", "code", "word"} and min(kinds.values()) >= 6
    assert all(len(p.messages) == 1 and len(p.messages[0].content) <= 120 for p in suite.prompts)
    assert all(p.max_tokens <= 160 for p in suite.prompts)
    assert {t.id for t in list_tasks()} == {t.id for t in [*SMOKE, *QUALITY]}


def test_general_suite_covers_every_class_and_long_context():
    suite = load_suite("general")
    assert suite.kind == "speed"
    classes = {p.prompt_class for p in suite.prompts}
    assert classes == {"code", "reasoning", "prose", "long_context", "multi_turn"}
    [long] = [p for p in suite.prompts if p.prompt_class == "long_context"]
    text = " ".join(m.content for m in long.messages)
    # BPE tokenizers emit at least one token per word or punctuation mark in English prose, so
    # this count is a lower bound on prompt tokens.
    assert len(re.findall(r"\w+|[^\w\s]", text)) >= 2000
    for p in suite.prompts:
        if p.prompt_class == "multi_turn":
            assert len(p.messages) >= 3
            assert {"user", "assistant"} <= {m.role for m in p.messages}


def test_demo_suite_is_short():
    suite = load_suite("demo-speed")
    assert suite.kind == "speed"
    short = [
        p for p in suite.prompts if p.split == "selection" and p.prompt_class != "long_context"
    ]
    assert 3 <= len(short) <= 4
    assert all(p.max_tokens == 64 for p in short)
    assert len({p.prompt_class for p in short}) == len(short)
    long = [p for p in suite.prompts if p.prompt_class == "long_context"]
    assert all(p.max_tokens <= 16 for p in long)  # a long document, a short answer
    assert 1 <= sum(1 for p in suite.prompts if p.split == "heldout") <= 3


def _suite(**over):
    data = {
        "schema_version": 1,
        "id": "x",
        "kind": "speed",
        "prompts": [
            {
                "id": "p1",
                "class": "prose",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ],
    }
    data.update(over)
    return data


@pytest.mark.parametrize(
    "over",
    [
        {"surprise": 1},
        {"kind": "latency"},
        {"prompts": []},
        {"prompts": [_suite()["prompts"][0]] * 2},  # duplicate id
        {"prompts": [{**_suite()["prompts"][0], "class": "poetry"}]},
        {
            "prompts": [
                {**_suite()["prompts"][0], "messages": [{"role": "assistant", "content": "x"}]}
            ]
        },
        {"prompts": [{**_suite()["prompts"][0], "messages": [{"role": "tool", "content": "x"}]}]},
        {"kind": "quality"},  # p1 is not a task
        {
            "kind": "quality",
            "prompts": [
                {
                    "id": "arithmetic",
                    "class": "reasoning",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                }
            ],
        },
    ],
)
def test_suite_model_refuses(over):
    with pytest.raises(ValueError):
        Suite.model_validate(_suite(**over))


def test_load_suite_errors(tmp_path):
    with pytest.raises(ValueError):
        load_suite("../policy/suites/smoke")
    with pytest.raises(FileNotFoundError):
        load_suite("nope", suites_dir=tmp_path)
    (tmp_path / "mine.yaml").write_text(
        "schema_version: 1\nid: other\nkind: speed\nprompts:\n"
        "  - {id: p1, class: code, max_tokens: 4, messages: [{role: user, content: hi}]}\n"
    )
    with pytest.raises(ValueError, match="declares id"):
        load_suite("mine", suites_dir=tmp_path)
    (tmp_path / "ok.yaml").write_text((tmp_path / "mine.yaml").read_text().replace("other", "ok"))
    assert load_suite("ok", suites_dir=tmp_path).prompts[0].messages[0].content == "hi"


def test_compare_greedy_checks_every_answer_of_a_prompt_asked_twice():
    """The second answer reuses the prompt cache: it must match the baseline's output too."""
    base = [g("baseline", "p1", "x", [1, 2, 3])]
    first = g("a:b", "p1", "x", [1, 2, 3])
    again = g("a:b", "p1", "x", [1, 2, 9]).model_copy(update={"repeat": 1})
    result = compare_greedy(base, [first, again])
    assert not result.passed
    assert result.detail.startswith("1 of 2 greedy output(s) identical")
    assert "p1 (asked again, prefix cached) diverges at token 2" in result.detail
