"""The quality tasks: each one's exact prompt and the answer its checker reads (core.answers).

A quality suite (``policy/suites/*.yaml``, kind ``quality``) lists tasks by id and must carry
each task's prompt exactly (``core.suites``), so a checker is never matched with a question it
was not written for. ``smoke`` is the quick check of four tasks; ``quality`` holds 35 short
tasks phrased so that a small instruct model (SmolLM2-135M-Instruct) can answer some of them
("answer with a number", "answer in one sentence"): numbers, JSON objects, Python functions
run against tests, and one-word facts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from mcp_infra.contracts import JSONValue
from mcp_infra.core.answers import (
    Answer,
    CodeAnswer,
    CodeTest,
    JsonAnswer,
    NumberAnswer,
    WordAnswer,
    describe,
)


class TaskSpec(BaseModel):
    """A quality task: its exact prompt, the answer its checker reads, and that rule in words."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prompt: str
    answer: Answer
    checks: str


def _task(task_id: str, prompt: str, answer: Answer) -> TaskSpec:
    return TaskSpec(id=task_id, prompt=prompt, answer=answer, checks=describe(answer))


def _number(task_id: str, question: str, value: int) -> TaskSpec:
    return _task(task_id, f"{question} Answer with a number.", NumberAnswer(value=value))


def _word(task_id: str, prompt: str, accept: list[str], contradict: list[str]) -> TaskSpec:
    return _task(task_id, prompt, WordAnswer(accept=accept, contradict=contradict))


def _json(task_id: str, prompt: str, obj: dict[str, str | int | float | bool]) -> TaskSpec:
    return _task(task_id, prompt, JsonAnswer(object=obj))


Calls = list[tuple[list[JSONValue], JSONValue]]


def _code(task_id: str, prompt: str, function: str, calls: Calls) -> TaskSpec:
    tests = [CodeTest(args=args, expect=expect) for args, expect in calls]
    return _task(task_id, prompt, CodeAnswer(function=function, tests=tests))


def _add_tests() -> Calls:
    return [([2, 3], 5), ([-1, 1], 0), ([10, 20], 30)]


_COLOURS = ["red", "green", "yellow", "orange", "purple", "pink", "grey", "gray", "black", "brown"]

SMOKE = [
    _task(
        "arithmetic",
        "What is 17 multiplied by 23? Reply with just the number.",
        NumberAnswer(value=391),
    ),
    _json(
        "json_object",
        'Return only a JSON object, no prose and no code fence, with exactly the keys "city" and '
        '"country" for the capital of France.',
        {"city": "Paris", "country": "France"},
    ),
    _word(
        "one_word",
        "Answer with exactly one lowercase word and no punctuation: what colour is a clear "
        "midday sky?",
        ["blue"],
        _COLOURS,
    ),
    _code(
        "python_add",
        "Write a Python function named add that returns the sum of two arguments. Reply with "
        "only a python code block.",
        "add",
        _add_tests(),
    ),
]

_ONE_SENTENCE = "Answer in one sentence."
_ONE_WORD = "Answer in one word."

QUALITY = [
    _number("num-add-small", "What is 7 plus 5?", 12),
    _number("num-sub-small", "What is 15 minus 6?", 9),
    _number("num-times-small", "What is 6 times 7?", 42),
    _number("num-add-tens", "What is 20 plus 30?", 50),
    _number("num-double", "What is double 8?", 16),
    _number("num-half", "What is half of 10?", 5),
    _number("num-times-ten", "What is 9 times 10?", 90),
    _number("num-add-hundred", "What is 100 plus 25?", 125),
    _number("num-week", "How many days are in a week?", 7),
    _number("num-months", "How many months are in a year?", 12),
    _number("num-hard", "What is 17 multiplied by 23?", 391),
    _word(
        "word-france",
        f"What is the capital of France? {_ONE_SENTENCE}",
        ["Paris"],
        ["Lyon", "Marseille", "London", "Berlin", "Rome", "Madrid", "Istanbul", "Brussels"],
    ),
    _word(
        "word-japan",
        f"What is the capital of Japan? {_ONE_SENTENCE}",
        ["Tokyo"],
        ["Kyoto", "Osaka", "Beijing", "Seoul", "Hiroshima"],
    ),
    _word(
        "word-italy",
        f"What is the capital of Italy? {_ONE_SENTENCE}",
        ["Rome"],
        ["Milan", "Venice", "Naples", "Florence", "Paris"],
    ),
    _word(
        "word-planet",
        f"What is the largest planet in our solar system? {_ONE_SENTENCE}",
        ["Jupiter"],
        ["Saturn", "Earth", "Mars", "Neptune", "Uranus", "Venus", "Mercury"],
    ),
    _word("word-sky", f"What colour is the sky on a clear day? {_ONE_WORD}", ["blue"], _COLOURS),
    _word(
        "word-grass",
        f"What colour is grass? {_ONE_WORD}",
        ["green"],
        ["blue", "red", "yellow", "brown", "purple", "orange"],
    ),
    _word(
        "word-moo",
        f"Which farm animal says moo? {_ONE_WORD}",
        ["cow", "cows"],
        ["dog", "cat", "sheep", "pig", "horse", "duck", "goat", "chicken"],
    ),
    _word(
        "word-ice",
        f"What does water turn into when it freezes? {_ONE_WORD}",
        ["ice"],
        ["steam", "vapour", "vapor", "gas"],
    ),
    _word(
        "word-sunrise",
        f"In which direction does the sun rise? {_ONE_WORD}",
        ["east"],
        ["west", "north", "south"],
    ),
    _word(
        "word-opposite",
        f"What is the opposite of hot? {_ONE_WORD}",
        ["cold"],
        ["warm", "boiling"],
    ),
    _json(
        "json-city", 'Write a JSON object with the key "city" set to "Paris".', {"city": "Paris"}
    ),
    _json(
        "json-person",
        'Write a JSON object with "name" set to "Alice" and "age" set to 30.',
        {"name": "Alice", "age": 30},
    ),
    _json(
        "json-color", 'Write a JSON object with one key, "color", set to "red".', {"color": "red"}
    ),
    _json("json-done", 'Write a JSON object with the key "done" set to true.', {"done": True}),
    _json(
        "json-sum",
        'Write a JSON object with the key "sum" set to the sum of 2 and 3.',
        {"sum": 5},
    ),
    _json(
        "json-capital",
        'Write a JSON object with the keys "country" and "capital" for Japan.',
        {"country": "Japan", "capital": "Tokyo"},
    ),
    _json(
        "json-pet",
        'Write a JSON object with "animal" set to "dog" and "legs" set to 4.',
        {"animal": "dog", "legs": 4},
    ),
    _code(
        "code-add",
        "Write a Python function named add that returns the sum of two numbers.",
        "add",
        _add_tests(),
    ),
    _code(
        "code-subtract",
        "Write a Python function named subtract that takes a and b and returns a minus b.",
        "subtract",
        [([5, 3], 2), ([0, 4], -4), ([10, 10], 0)],
    ),
    _code(
        "code-square",
        "Write a Python function named square that returns a number multiplied by itself.",
        "square",
        [([3], 9), ([-4], 16), ([0], 0)],
    ),
    _code(
        "code-is-even",
        "Write a Python function named is_even that returns True if a number is even and "
        "False otherwise.",
        "is_even",
        [([4], True), ([7], False), ([0], True)],
    ),
    _code(
        "code-maximum",
        "Write a Python function named maximum that returns the larger of two numbers.",
        "maximum",
        [([3, 8], 8), ([9, 2], 9), ([-1, -5], -1)],
    ),
    _code(
        "code-reverse",
        "Write a Python function named reverse that returns a string reversed.",
        "reverse",
        [(["abc"], "cba"), ([""], ""), (["hello"], "olleh")],
    ),
    _code(
        "code-first",
        "Write a Python function named first that returns the first item of a list.",
        "first",
        [([[1, 2, 3]], 1), ([["a", "b"]], "a")],
    ),
]

TASKS: dict[str, TaskSpec] = {t.id: t for t in [*SMOKE, *QUALITY]}
