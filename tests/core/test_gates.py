"""Gates: smoke checks, parsing task checkers, greedy comparison, agreement, and the suites."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_infra.contracts import Sample
from mcp_infra.core.gates import (
    check_task,
    compare_greedy,
    list_tasks,
    lossy_agreement,
    quality_gate,
    smoke_failures,
    smoke_gate,
    strip_think,
)
from mcp_infra.core.suites import Suite
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


# ------------------------------------------------------------------ task checkers

FENCE = "```"
ADD_OK = f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}"


@pytest.mark.parametrize(
    ("task", "text", "passed"),
    [
        # arithmetic: the whole reply must be the number 391
        ("arithmetic", "391", True),
        ("arithmetic", "  391.\n", True),
        ("arithmetic", "<think>17*23 = 17*20 + 17*3 = 340 + 51 = 391</think>\n391", True),
        ("arithmetic", "The answer is definitely not 391, it is 390.", False),
        ("arithmetic", "The answer is 391.", False),
        ("arithmetic", "390", False),
        ("arithmetic", "3 91", False),
        ("arithmetic", "391..", False),
        ("arithmetic", "391\n391", False),
        ("arithmetic", "", False),
        ("arithmetic", "<think>it is 391", False),  # the reasoning never ended: no answer
        # json_object: the whole reply is the object
        ("json_object", '{"city": "Paris", "country": "France"}', True),
        ("json_object", ' {"country": "france", "city": "PARIS"}\n', True),
        ("json_object", '<think>Paris.</think>{"city": "Paris", "country": "France"}', True),
        ("json_object", 'Here it is: {"city": "Paris", "country": "France"}', False),
        ("json_object", '{"city": "Paris", "country": "France"} Hope this helps!', False),
        ("json_object", '```json\n{"city": "Paris", "country": "France"}\n```', False),
        ("json_object", '{"city": "Lyon", "country": "France"}', False),
        ("json_object", '{"city": "Paris", "country": "Italy"}', False),
        ("json_object", '{"city": "Paris"}', False),
        ("json_object", '{"city": "Paris", "country": "France", "population": 2}', False),
        ("json_object", '{"city": ["Paris"], "country": "France"}', False),
        ("json_object", '["Paris", "France"]', False),
        ("json_object", "Paris, France", False),
        # one_word: exactly "blue"
        ("one_word", "blue", True),
        ("one_word", " blue\n", True),
        ("one_word", "<think>The sky is blue.</think>\nblue", True),
        ("one_word", "blueish", False),
        ("one_word", "Blue", False),
        ("one_word", "blue.", False),
        ("one_word", "light blue", False),
        ("one_word", "azure", False),
        ("one_word", "The sky is blue", False),
        # python_add: one python block, parsed, never run
        ("python_add", ADD_OK, True),
        ("python_add", f"{FENCE}python\ndef add(x, y):\n    return y + x\n{FENCE}\n", True),
        (
            "python_add",
            f'{FENCE}python\ndef add(a: int, b: int) -> int:\n    """Sum."""\n    return a + b\n'
            f"{FENCE}",
            True,
        ),
        ("python_add", f"{FENCE}python\ndef add(a, b):\n    return a - b\n{FENCE}", False),
        ("python_add", f"{FENCE}python\ndef add(a, b):\n    return a + a\n{FENCE}", False),
        ("python_add", f"{FENCE}python\ndef add(a, b):\n    return a + 1\n{FENCE}", False),
        ("python_add", f"{FENCE}python\ndef plus(a, b):\n    return a + b\n{FENCE}", False),
        ("python_add", f"{FENCE}python\ndef add(a, b, c):\n    return a + b\n{FENCE}", False),
        ("python_add", f"{FENCE}python\ndef add(*args):\n    return sum(args)\n{FENCE}", False),
        ("python_add", "def add(a, b):\n    return a + b", False),  # no fence
        ("python_add", f"Here you go:\n{ADD_OK}", False),  # prose around the block
        ("python_add", f"{ADD_OK}\n{ADD_OK}", False),  # two blocks
        ("python_add", f"{FENCE}\ndef add(a, b):\n    return a + b\n{FENCE}", False),  # no lang
        ("python_add", f"{FENCE}python\ndef add(a, b)\n    return a + b\n{FENCE}", False),
        (
            "python_add",
            f"{FENCE}python\ndef add(a, b):\n    return a + b\nadd = lambda a, b: a - b\n{FENCE}",
            False,
        ),
        (
            "python_add",
            f"{FENCE}python\ndef add(a, b):\n    print('hi')\n    return a + b\n{FENCE}",
            False,
        ),
    ],
)
def test_task_checker(task, text, passed):
    result = check_task(task, text)
    assert result.task == task
    assert result.passed is passed, result.detail
    assert result.detail


def test_checker_details_say_what_was_wrong():
    assert check_task("arithmetic", "390").detail == "expected 391, got 390"
    assert "Lyon" in check_task("json_object", '{"city": "Lyon", "country": "France"}').detail
    assert "blueish" in check_task("one_word", "blueish").detail
    assert "a - b" in check_task("python_add", ADD_OK.replace("+", "-")).detail
    unknown = check_task("nope", "391")
    assert not unknown.passed and "unknown task" in unknown.detail


def test_python_add_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    code = (
        f"{FENCE}python\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        f"def add(a, b):\n    return a + b\n{FENCE}"
    )
    assert not check_task("python_add", code).passed
    assert not marker.exists()


def test_strip_think():
    assert strip_think("<think>abc</think>\n391") == "\n391"
    assert strip_think("  <think>abc</think>391").strip() == "391"
    assert strip_think("reasoning only</think>391") == "391"  # template opened the block
    assert strip_think("<think>never closed") is None
    assert strip_think("391") == "391"


def test_list_tasks_describes_each_task():
    tasks = {t.id: t for t in list_tasks()}
    assert set(tasks) == {"arithmetic", "json_object", "one_word", "python_add"}
    assert tasks["arithmetic"].prompt == "What is 17 multiplied by 23? Reply with just the number."
    assert all(t.checks for t in tasks.values())


def test_quality_gate():
    def q(task, text, error=None):
        return Sample(
            candidate="a:b", phase="quality", prompt_id=task, repeat=0, text=text, error=error
        )

    good = [
        q("arithmetic", "391"),
        q("json_object", '{"city": "Paris", "country": "France"}'),
        q("one_word", "blue"),
        q("python_add", ADD_OK),
    ]
    assert quality_gate(good).passed
    assert quality_gate(good).detail == "all 4 task(s) passed"
    bad = quality_gate([*good[:3], q("python_add", ADD_OK.replace("+", "-"))])
    assert not bad.passed and "3 of 4" in bad.detail and "python_add" in bad.detail
    assert not quality_gate([q("arithmetic", "", error="timeout")]).passed
    assert not quality_gate([]).passed
    # Measure samples are not quality outputs.
    assert not quality_gate([good[0].model_copy(update={"phase": "measure"})]).passed


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
    assert {"smoke", "general", "demo-speed"} <= set(list_suites())
    for name in ("smoke", "general", "demo-speed"):
        assert load_suite(name).id == name


def test_smoke_suite_matches_the_checkers():
    suite = load_suite("smoke")
    assert suite.kind == "quality"
    tasks = {t.id: t.prompt for t in list_tasks()}
    assert {p.id: p.messages[-1].content for p in suite.prompts} == tasks


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


# ------------------------------------------------------------------ issue 10: checker holes

ADD_OK = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.mark.parametrize("reply", ["３９１", "٣٩١", "0391", "00391", "+0391", "३९१"])
def test_arithmetic_accepts_ascii_digits_without_leading_zero_only(reply: str) -> None:
    result = check_task("arithmetic", reply)
    assert not result.passed and "not just a number" in result.detail


def test_arithmetic_still_accepts_the_plain_answer() -> None:
    assert check_task("arithmetic", "391").passed
    assert check_task("arithmetic", " 391.\n").passed


def test_json_with_a_duplicate_key_is_rejected() -> None:
    reply = '{"city": "Rome", "city": "Paris", "country": "France"}'
    result = check_task("json_object", reply)
    assert not result.passed and "repeats the JSON key 'city'" in result.detail
    nested = '{"city": "Paris", "country": "France", "x": {"a": 1, "a": 2}}'
    assert not check_task("json_object", nested).passed


@pytest.mark.parametrize(
    "extra",
    [
        "from operator import add",
        "import operator as add",
        "from operator import *",
        "add = lambda a, b: a - b",
        "add += 1",
        "def add(a, b):\n    return a - b",
        "class add:\n    pass",
        "for add in range(3):\n    pass",
        "if (add := None):\n    pass",
    ],
)
def test_python_answer_that_rebinds_add_is_rejected(extra: str) -> None:
    reply = ADD_OK.replace("\n```", "\n" + extra + "\n```")
    result = check_task("python_add", reply)
    assert not result.passed
    assert "binds add more than once" in result.detail or "exactly one" in result.detail


def test_python_rebinding_inside_another_function_is_rejected_too() -> None:
    reply = ADD_OK.replace("\n```", "\ndef helper():\n    global add\n    add = 1\n```")
    assert not check_task("python_add", reply).passed


def test_crlf_line_endings_are_tolerated() -> None:
    assert check_task("python_add", ADD_OK).passed
    assert check_task("python_add", ADD_OK.replace("\n", "\r\n")).passed
    assert check_task("arithmetic", "391\r\n").passed
    crlf_json = '{\r\n  "city": "Paris",\r\n  "country": "France"\r\n}'
    assert check_task("json_object", crlf_json).passed
