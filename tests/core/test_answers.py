"""Answer checkers: the answer read out of a sentence, a contradiction stated anywhere failing.

Code answers are run as measurement runs them (``procs.sandbox``: a separate ``python -I``
process under limits), so a code task's verdict here is the one a cycle would record.
"""

from __future__ import annotations

import json

import pytest

from mcp_infra.contracts import CodeRun, Sample
from mcp_infra.core.answers import (
    CodeAnswer,
    JsonAnswer,
    NumberAnswer,
    WordAnswer,
    code_job,
    json_objects,
    numbers,
    prompt_mentions,
)
from mcp_infra.core.gates import DETAIL_LIMIT, TaskCheck, check_sample, check_task, quality_gate
from mcp_infra.core.tasks import QUALITY, SMOKE, TASKS
from mcp_infra.procs.sandbox import with_code_run

FENCE = "```"
ADD_OK = f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}"


def checked(task: str, text: str) -> TaskCheck:
    """A reply judged as a cycle judges it: its code (if any) run first, then checked."""
    sample = Sample(candidate="c:x", phase="quality", prompt_id=task, repeat=0, text=text)
    return check_sample(with_code_run(sample))


# ------------------------------------------------------------------ the traps of the issue


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is definitely not 391, it is 390.",
        "390. Sorry, I mean 391.",  # a wrong number before the right one
        "391. Actually, 392.",  # ... and after it
        "17 times 23 is 391, or maybe 401.",
        "It is 390, not 391.",
        "The answer is not 391.",
        "391 is wrong.",
        "The answer isn't 391",
    ],
)
def test_a_wrong_number_stated_anywhere_fails(reply: str) -> None:
    result = check_task("arithmetic", reply)
    assert not result.passed, result.detail


@pytest.mark.parametrize(
    "reply",
    [
        "391",
        "  391.\n",
        "The answer is 391.",
        "17 multiplied by 23 is 391.",
        "17 * 23 = 391",
        "seventeen times twenty-three is 391",
        "391\n391",
        "<think>17*23 = 17*20 + 17*3 = 340 + 51 = 391</think>\n391",
        "**391**",
    ],
)
def test_the_right_number_in_a_sentence_passes(reply: str) -> None:
    result = check_task("arithmetic", reply)
    assert result.passed, result.detail


def test_the_number_checker_says_what_it_found() -> None:
    assert check_task("arithmetic", "390").detail == "expected 391, got 390"
    assert check_task("arithmetic", "391 or 390").detail == "states 391 but also 390"
    assert check_task("arithmetic", "I do not know").detail.startswith("no number stated")
    assert check_task("arithmetic", "Not 391.").detail.startswith("negates 391")
    assert check_task("num-week", "There are seven days in a week.").passed
    assert not check_task("num-week", "There are seven or eight days in a week.").passed
    assert not check_task("num-half", "Half of 10 is 5, and double 10 is 20.").passed


@pytest.mark.parametrize("reply", ["３９１", "٣٩١", "0391", "00391", "+0391", "३९१", "3 91", ""])
def test_numbers_are_ascii_digits_written_plainly(reply: str) -> None:
    assert not check_task("arithmetic", reply).passed


def test_numbers_are_read_with_signs_commas_and_decimals() -> None:
    found = [(m.literal, str(m.value)) for m in numbers("-6, 1,000 and 2.5 but not x2 or 10-4.")]
    assert found == [("-6", "-6"), ("1,000", "1000"), ("2.5", "2.5"), ("10", "10"), ("4", "4")]


@pytest.mark.parametrize(
    "reply",
    [
        '{"city": "Paris", "country": "France"}',
        ' {"country": "france", "city": "PARIS"}\n',
        'Here it is: {"city": "Paris", "country": "France"}',  # an object inside prose
        '{"city": "Paris", "country": "France"} Hope this helps!',
        '```json\n{"city": "Paris", "country": "France"}\n```',
        '<think>Paris.</think>{"city": "Paris", "country": "France"}',
        '{\r\n  "city": "Paris",\r\n  "country": "France"\r\n}',
    ],
)
def test_a_json_object_is_read_out_of_prose(reply: str) -> None:
    result = check_task("json_object", reply)
    assert result.passed, result.detail


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ('{"city": "Lyon", "country": "France"}', "Lyon"),
        ('{"city": "Paris", "country": "Italy"}', "Italy"),
        ('{"city": "Paris"}', "keys"),
        ('{"city": "Paris", "country": "France", "population": 2}', "keys"),
        ('{"city": ["Paris"], "country": "France"}', "city"),
        ('["Paris", "France"]', "no JSON object"),
        ("Paris, France", "no JSON object"),
        ("{'city': 'Paris', 'country': 'France'}", "no JSON object"),
        (
            '{"city": "Paris", "country": "France"} or {"city": "Lyon", "country": "France"}',
            "JSON object 2",
        ),
        ('{"city": "Rome", "city": "Paris", "country": "France"}', "repeats the JSON key 'city'"),
        ('{"city": "Paris", "country": "France", "x": {"a": 1, "a": 2}}', "repeats"),
    ],
)
def test_a_json_object_that_differs_or_contradicts_fails(reply: str, why: str) -> None:
    result = check_task("json_object", reply)
    assert not result.passed and why in result.detail, result.detail


def test_json_objects_are_found_outside_one_another() -> None:
    assert json_objects('a {"x": {"y": 1}} b {"z": 2} c {broken') == [{"x": {"y": 1}}, {"z": 2}]


@pytest.mark.parametrize(
    ("task", "reply", "passed"),
    [
        ("one_word", "blue", True),
        ("one_word", "Blue.", True),
        ("one_word", "The sky is blue.", True),
        ("one_word", "light blue", True),
        ("one_word", "<think>The sky is blue.</think>\nblue", True),
        ("one_word", "blueish", False),
        ("one_word", "azure", False),
        ("one_word", "The sky is not blue.", False),
        ("one_word", "blue, or maybe grey", False),
        ("one_word", "red", False),
        ("word-france", "The capital of France is Paris.", True),
        ("word-france", "Paris is the capital of France, not Lyon.", False),
        ("word-france", "The capital of France is Istanbul.", False),
        ("word-moo", "Cows say moo.", True),
        ("word-opposite", "The opposite of hot is cold.", True),  # the question's word is fine
    ],
)
def test_one_word_facts(task: str, reply: str, passed: bool) -> None:
    result = check_task(task, reply)
    assert result.passed is passed, result.detail


# ------------------------------------------------------------------ code, run in a sandbox

WRONG_ADD = f"{FENCE}python\ndef add(a, b):\n    return a - b\n{FENCE}"


def test_code_that_defines_add_but_returns_the_wrong_sum_fails() -> None:
    result = checked("python_add", WRONG_ADD)
    assert not result.passed and result.detail == "add(2, 3) returned -1, expected 5"
    almost = f"{FENCE}python\ndef add(a, b):\n    return a + b + 1\n{FENCE}"
    assert not checked("python_add", almost).passed


@pytest.mark.parametrize(
    "reply",
    [
        ADD_OK,
        ADD_OK.replace("\n", "\r\n"),
        f"Here you go:\n{ADD_OK}\nIt adds its arguments.",  # prose around the block
        f"{FENCE}\ndef add(a, b):\n    return a + b\n{FENCE}",  # a fence with no language
        "def add(a, b):\n    return a + b\n\nThat is all.",  # bare code
        f"{FENCE}python\ndef add(x, y):\n    return y + x\n{FENCE}",
        f'{FENCE}python\ndef add(a: int, b: int) -> int:\n    """Sum."""\n'
        f"    return a + b\n{FENCE}",
        f"{FENCE}python\ndef add(a, b):\n    print('hi')\n    return a + b\n\nprint(add(2, 3))\n"
        f"{FENCE}",
        f"{FENCE}python\ndef add(*args):\n    return sum(args)\n{FENCE}",
        f"{FENCE}python\ndef add(a, b):\n    return a + b\n",  # cut off before the fence closed
    ],
)
def test_code_that_adds_passes_its_tests(reply: str) -> None:
    result = checked("python_add", reply)
    assert result.passed, result.detail


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (f"{FENCE}python\ndef plus(a, b):\n    return a + b\n{FENCE}", "no code defining add"),
        (f"{ADD_OK}\n{ADD_OK}", "2 separate blocks"),
        (f"{ADD_OK}\nOr:\ndef add(a, b):\n    return b - a\n", "2 separate blocks"),
        (f"{FENCE}python\ndef add(a, b)\n    return a + b\n{FENCE}", "does not parse"),
        (f"{FENCE}python\ndef add(a, b, c):\n    return a + b\n{FENCE}", "TypeError"),
        (f"{FENCE}python\ndef add(a, b):\n    return a + a\n{FENCE}", "expected 5"),
    ],
)
def test_code_that_cannot_count_fails(reply: str, why: str) -> None:
    result = checked("python_add", reply)
    assert not result.passed and why in result.detail, result.detail


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
        "def helper():\n    global add\n    add = 1",
    ],
)
def test_code_that_binds_add_twice_is_refused_unrun(extra: str) -> None:
    reply = ADD_OK.replace(f"\n{FENCE}", f"\n{extra}\n{FENCE}")
    job, why = code_job(TASKS["python_add"].answer, reply)  # type: ignore[arg-type]
    assert job is None and "more than once" in why
    assert not checked("python_add", reply).passed


def test_a_code_answer_without_its_run_or_with_another_s_fails() -> None:
    assert check_task("python_add", ADD_OK).detail.endswith("was not run against its tests")
    ran = with_code_run(
        Sample(candidate="c", phase="quality", prompt_id="python_add", repeat=0, text=ADD_OK)
    )
    assert ran.code_run is not None and ran.code_run.ok
    other = check_task("python_add", WRONG_ADD, ran.code_run)  # a passing run, other code
    assert not other.passed and "other code" in other.detail
    forged = CodeRun(digest=ran.code_run.digest, passed=0, total=3, detail="add(2, 3) failed")
    assert not check_task("python_add", ADD_OK, forged).passed


def test_checking_never_runs_the_code(tmp_path) -> None:
    marker = tmp_path / "ran"
    reply = (
        f"{FENCE}python\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        f"def add(a, b):\n    return a + b\n{FENCE}"
    )
    assert not check_task("python_add", reply).passed
    assert not marker.exists()


# ------------------------------------------------------------------ every task, both ways

REFERENCE = {
    "add": "def add(a, b):\n    return a + b",
    "subtract": "def subtract(a, b):\n    return a - b",
    "square": "def square(x):\n    return x * x",
    "is_even": "def is_even(n):\n    return n % 2 == 0",
    "maximum": "def maximum(a, b):\n    return a if a > b else b",
    "reverse": "def reverse(s):\n    return s[::-1]",
    "first": "def first(items):\n    return items[0]",
}


def good_reply(task_id: str) -> str:
    answer = TASKS[task_id].answer
    if isinstance(answer, NumberAnswer):
        return f"The answer is {answer.value}."
    if isinstance(answer, WordAnswer):
        return f"It is {answer.accept[0]}."
    if isinstance(answer, JsonAnswer):
        return f"Here is the object: {json.dumps(answer.object)}"
    assert isinstance(answer, CodeAnswer)
    return f"Sure:\n{FENCE}python\n{REFERENCE[answer.function]}\n{FENCE}"


def bad_reply(task_id: str) -> str:
    """The good reply with a contradicting result stated beside it."""
    answer = TASKS[task_id].answer
    if isinstance(answer, NumberAnswer):
        return f"The answer is {answer.value}, or perhaps {answer.value + 1000}."
    if isinstance(answer, WordAnswer):
        return f"It is {answer.accept[0]}, or {answer.contradict[0]}."
    if isinstance(answer, JsonAnswer):
        wrong = {k: (f"not {v}" if isinstance(v, str) else not v) for k, v in answer.object.items()}
        return f"{json.dumps(answer.object)} or {json.dumps(wrong)}"
    assert isinstance(answer, CodeAnswer)
    body = REFERENCE[answer.function]
    return f"{FENCE}python\n{body}\n{FENCE}\nor:\n{FENCE}python\n{body}\n{FENCE}"


@pytest.mark.parametrize("task", [t.id for t in [*SMOKE, *QUALITY]])
def test_every_task_passes_its_answer_and_fails_a_contradiction(task: str) -> None:
    good = checked(task, good_reply(task))
    assert good.passed, good.detail
    bad = checked(task, bad_reply(task))
    assert not bad.passed, bad.detail


def test_no_task_lists_as_a_contradiction_what_its_question_names() -> None:
    for task in TASKS.values():
        if isinstance(task.answer, WordAnswer):
            assert prompt_mentions(task.prompt, task.answer.contradict) == [], task.id
            assert not set(task.answer.accept) & set(task.answer.contradict), task.id


def test_quality_gate_checks_every_quality_sample() -> None:
    def q(task: str, text: str, error: str | None = None) -> Sample:
        s = Sample(candidate="a:b", phase="quality", prompt_id=task, repeat=0, text=text)
        return with_code_run(s.model_copy(update={"error": error}))

    good = [
        q("arithmetic", "17 times 23 is 391."),
        q("json_object", 'Here: {"city": "Paris", "country": "France"}'),
        q("one_word", "The sky is blue."),
        q("python_add", ADD_OK),
    ]
    assert quality_gate(good).passed
    assert quality_gate(good).detail == "all 4 task(s) passed"
    bad = quality_gate([*good[:3], q("python_add", WRONG_ADD)])
    assert not bad.passed and "3 of 4" in bad.detail and "python_add" in bad.detail
    assert not quality_gate([q("arithmetic", "", error="timeout")]).passed
    assert not quality_gate([]).passed
    assert not quality_gate([good[0].model_copy(update={"phase": "measure"})]).passed
    unknown = check_task("nope", "391")
    assert not unknown.passed and "unknown task" in unknown.detail


@pytest.mark.parametrize(
    "reply",
    [
        "1" * 5000,
        "0" + "1" * 5000,
        "red" + "d" * 5000,
        '{"city": "' + "P" * 5000 + '"}',
        '{"' + "k" * 5000 + '": 1}',
        "z" * 5000,
    ],
    ids=["number", "malformed-number", "word", "json-value", "json-key", "prose"],
)
def test_a_long_reply_is_never_repeated_whole_in_the_detail(reply: str) -> None:
    """A reply is untrusted text of any length: what a checker reports of it is cut short."""
    for task in TASKS:
        check = check_task(task, reply)
        assert not check.passed and len(check.detail) <= DETAIL_LIMIT + 1, task
