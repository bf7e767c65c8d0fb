"""Plans as models really write them: a table of replies, each with the plan the extractor must
find or the place (character, line, column) and reason of its error. Pure: no process, no file.

The forms are those seen from models and named in issue 38: trailing commas, ``//`` and ``#``
comments, smart quotes, a fenced block among prose, a Python dict literal, single quotes; and,
for a small served model shown the numbered menu, an answer of numbers (issue 37).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from mcp_infra.contracts import MAX_PLAN_CANDIDATES
from mcp_infra.core.extraction import extract_plan, position_of
from mcp_infra.core.menu import Menu, MenuItem

K2, K4, KV8 = "demo-tiny:draft-k2", "demo-tiny:draft-k4", "demo-tiny:kv8"


@dataclass(frozen=True)
class Row:
    """``reply`` yields a plan naming ``candidates``, or, when ``error`` is set, no plan and a
    problem containing ``error`` whose position is where ``at`` first occurs in the reply
    (``at_end``: the end of the reply)."""

    reply: str
    candidates: tuple[str, ...] = ()
    error: str = ""
    at: str = ""
    at_end: bool = False
    source: str = ""


PLANS: dict[str, Row] = {
    # --- valid, each form alone -------------------------------------------------------------
    "plain JSON": Row(json.dumps({"hypothesis": "h", "candidates": [K4]}), (K4,), source="inline"),
    "trailing commas": Row(
        '{"hypothesis": "h", "candidates": ["demo-tiny:draft-k2", "demo-tiny:draft-k4",],}',
        (K2, K4),
    ),
    "// comments": Row(
        '{\n  "hypothesis": "drafts help", // the idea\n'
        '  "candidates": ["demo-tiny:draft-k4"] // one\n}',
        (K4,),
    ),
    "# comments": Row(
        '{\n  # why\n  "hypothesis": "h",\n  "candidates": ["demo-tiny:draft-k4"]  # k4\n}', (K4,)
    ),
    "/* */ comment": Row(
        '{"hypothesis": "h", /* two */ "candidates": ["demo-tiny:draft-k2", "demo-tiny:draft-k4"]}',
        (K2, K4),
    ),
    "smart double quotes": Row(
        "{\u201chypothesis\u201d: \u201ch\u201d, "
        "\u201ccandidates\u201d: [\u201cdemo-tiny:draft-k4\u201d]}",
        (K4,),
    ),
    "smart single quotes": Row(
        "{\u2018hypothesis\u2019: \u2018h\u2019, "
        "\u2018candidates\u2019: [\u2018demo-tiny:draft-k2\u2019]}",
        (K2,),
    ),
    "single quotes, escaped apostrophe": Row(
        "{'hypothesis': 'it\\'s \"faster\"', 'candidates': ['demo-tiny:draft-k4']}", (K4,)
    ),
    "bare keys": Row(
        '{hypothesis: "h", candidates: ["demo-tiny:draft-k4"], acceptance: null}', (K4,)
    ),
    "fenced block among prose": Row(
        "Sure! Based on the figures:\n```json\n"
        + json.dumps({"hypothesis": "h", "candidates": [K2]}, indent=2)
        + "\n```\nThis keeps outputs identical {as required}.",
        (K2,),
        source="fenced",
    ),
    "Python dict literal": Row(
        "{'hypothesis': 'h', 'candidates': ['demo-tiny:draft-k4'], 'acceptance': None, "
        "'notes': ''}",
        (K4,),
    ),
    "Python dict with a tuple and triple quotes": Row(
        "```python\nplan = {'hypothesis': '''h''', "
        "'candidates': ('demo-tiny:draft-k2', 'demo-tiny:draft-k4')}\n```",
        (K2, K4),
        source="fenced",
    ),
    "wrapped in plan": Row(json.dumps({"plan": {"hypothesis": "h", "candidates": [KV8]}}), (KV8,)),
    "after a thinking block": Row(
        "<think>maybe {'hypothesis': 'x', 'candidates': ['demo-tiny:kv8']}</think>\n"
        "{'hypothesis': 'h', 'candidates': ['demo-tiny:draft-k4'],}",
        (K4,),
    ),
    "everything at once": Row(
        "Here is my plan:\n```\n{\n  \u201chypothesis\u201d: \u201cdrafting\u201d, // why\n"
        "  'candidates': ['demo-tiny:draft-k2', 'demo-tiny:draft-k4',],  # two\n"
        "  acceptance: {min_speedup_pct: 10,},\n}\n```",
        (K2, K4),
        source="fenced",
    ),
    # --- broken: the error says where ---------------------------------------------------------
    "missing comma between ids": Row(
        '{\n  "hypothesis": "h",\n  "candidates": ["demo-tiny:draft-k2" "demo-tiny:draft-k4"]\n}',
        error="expected ',' or a closing bracket",
        at='"demo-tiny:draft-k4"]',
    ),
    "Python strings side by side are not joined": Row(
        "{'hypothesis': 'h', 'candidates': ['demo-tiny:draft-k2' 'demo-tiny:draft-k4']}",
        error="expected ',' or a closing bracket",
        at="'demo-tiny:draft-k4']",
    ),
    "cut off before the end": Row(
        'My plan: {"hypothesis": "h", "candidates": ["demo-tiny:draft-k4"]',
        error="found the end of the reply",
        at_end=True,
    ),
    "cut off inside a fence": Row(
        '```json\n{"hypothesis": "h", "candidates": ["demo-tiny:draft-k4"\n```\nDone.',
        error="found the end of the fence",
        at="```\nDone",
    ),
    "an id without quotes": Row(
        '{"hypothesis": "h", "candidates": [demo-tiny:draft-k4]}',
        error="found ':'",
        at=":draft-k4]",
    ),
    "missing colon": Row(
        '{"hypothesis" "h", "candidates": ["demo-tiny:draft-k4"]}',
        error="expected ':' after a key",
        at='"h",',
    ),
    "unterminated string": Row(
        '{"hypothesis": "h, "candidates": ["demo-tiny:draft-k4"]}',
        error="expected ',' or a closing bracket",
        at='candidates": ["',
    ),
    "a line break inside a string": Row(
        '{"hypothesis": "two\nlines", "candidates": ["demo-tiny:draft-k4"]}',
        error="control character inside a string",
        at="\nlines",
    ),
    "valid JSON, not a valid plan": Row(
        'Plan: {"hypothesis": "h", "candidates": ['
        + ", ".join(f'"a:c{i}"' for i in range(MAX_PLAN_CANDIDATES + 1))
        + "]}",
        error=f"candidates: at most {MAX_PLAN_CANDIDATES} items, got {MAX_PLAN_CANDIDATES + 1}",
        at='{"hypothesis"',
    ),
    "Python True where a number goes": Row(
        "{'hypothesis': 'h', 'candidates': ['demo-tiny:draft-k4'], "
        "'acceptance': {'min_speedup_pct': True}}",
        error="must be a number",
        at="{'hypothesis'",
    ),
    "the position counts past a thinking block": Row(
        "<think>let me see</think>\n{'hypothesis': 'h' 'candidates': ['demo-tiny:draft-k4']}",
        error="expected ',' or a closing bracket",
        at="'candidates'",
    ),
    "prose only": Row("I would try the drafter, it seems fastest.", error="the answer has no '{'"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_model_written_plans(name: str) -> None:
    row = PLANS[name]
    got = extract_plan(row.reply)
    if not row.error:
        assert got.plan is not None, got.problems
        assert tuple(got.plan["candidates"]) == row.candidates
        assert got.source == (row.source or got.source)
        return
    assert got.plan is None
    assert any(row.error in p for p in got.problems), got.problems
    if row.at or row.at_end:
        offset = len(row.reply) if row.at_end else row.reply.index(row.at)
        assert got.position == position_of(row.reply, offset), (got.position, got.problems)
        where = f"line {got.position.line}, column {got.position.column}"
        assert where in got.problems[0]


def test_the_table_covers_each_form_valid_and_broken() -> None:
    valid = [r for r in PLANS.values() if not r.error]
    broken = [r for r in PLANS.values() if r.error]
    assert len(valid) >= 10 and len(broken) >= 10 and len(PLANS) + len(MENU_ANSWERS) >= 20


def test_positions_are_lines_and_columns() -> None:
    text = "ab\ncd\nef"
    assert position_of(text, 0).model_dump() == {"offset": 0, "line": 1, "column": 1}
    assert position_of(text, 4).model_dump() == {"offset": 4, "line": 2, "column": 2}
    assert position_of(text, 8).model_dump() == {"offset": 8, "line": 3, "column": 3}


def test_a_deep_or_huge_object_is_refused_quickly() -> None:
    deep = extract_plan('{"candidates": ' + "[" * 5000)
    assert deep.plan is None and any("nested deeper" in p for p in deep.problems)
    huge = extract_plan('{"hypothesis": "' + "x" * 100_000 + '", "candidates": ["a:b"]}')
    assert huge.plan is None and any("longer than" in p for p in huge.problems)


# ---------------------------------------------------------------------------------------------
# numbered-menu answers
# ---------------------------------------------------------------------------------------------

MENU = Menu(
    items=[
        MenuItem(id=f"demo-tiny:c{n}", title=f"c{n}", candidate_class="server_tuning", lossy=False)
        for n in range(1, 6)
    ]
)

MENU_ANSWERS: dict[str, Row] = {
    "1, 3": Row("1, 3", ("demo-tiny:c1", "demo-tiny:c3")),
    "Candidates: 2 and 4": Row("Candidates: 2 and 4", ("demo-tiny:c2", "demo-tiny:c4")),
    "[1,3]": Row("[1,3]", ("demo-tiny:c1", "demo-tiny:c3")),
    "in a sentence": Row("I pick option 2.", ("demo-tiny:c2",)),
    "bold": Row("**5**", ("demo-tiny:c5",)),
    "one number a line": Row("1\n\n3", ("demo-tiny:c1", "demo-tiny:c3")),
    "a list of numbers": Row("1. 2\n2. 5", ("demo-tiny:c2", "demo-tiny:c5")),
    "a bulleted list": Row("- 1\n- 3", ("demo-tiny:c1", "demo-tiny:c3")),
    "duplicates once": Row("2, 2, 4", ("demo-tiny:c2", "demo-tiny:c4")),
    "the first line of numbers counts": Row(
        "Answer: 4\nbecause it is 30% faster", ("demo-tiny:c4",)
    ),
    "rambling alternatives after the answer": Row(
        "1. 1, 3\n2. 1, 2\n3. 1, 4", ("demo-tiny:c1", "demo-tiny:c3")
    ),
    "a menu line echoed names its id": Row(
        "1. demo-tiny:c4: c4 (server_tuning, lossless, untried)", ("demo-tiny:c4",)
    ),
    "ids named": Row("I choose demo-tiny:c5 and demo-tiny:c2", ("demo-tiny:c5", "demo-tiny:c2")),
    "a JSON plan still counts": Row(
        json.dumps({"hypothesis": "h", "candidates": ["demo-tiny:c5"]}), ("demo-tiny:c5",)
    ),
    "off the menu": Row("Candidates: 2 and 9", error="9 is not on the menu (1 to 5)", at="9"),
    "zero": Row("0", error="0 is not on the menu", at="0"),
    "too many": Row("1, 2, 3, 4", error="4 numbers, at most 3", at="1"),
    "too many ids": Row(
        "demo-tiny:c1, demo-tiny:c2, demo-tiny:c3, demo-tiny:c5",
        error="4 candidates of the menu named, at most 3",
        at="demo-tiny:c1",
    ),
    "an id that only starts like one": Row(
        "I choose demo-tiny:c40", error="expected the numbers (or ids) of 1 to 3 candidates"
    ),
    "prose only": Row("The faster the better.", error="the answer has none"),
}


@pytest.mark.parametrize("name", list(MENU_ANSWERS))
def test_menu_answers(name: str) -> None:
    row = MENU_ANSWERS[name]
    got = extract_plan(row.reply, MENU)
    if not row.error:
        assert got.plan is not None, got.problems
        assert tuple(got.plan["candidates"]) == row.candidates
        if got.source == "menu":
            assert got.numbers == [int(c.removeprefix("demo-tiny:c")) for c in row.candidates]
            assert got.plan["notes"].startswith("planner: served model (menu answer)")
        return
    assert got.plan is None and any(row.error in p for p in got.problems), got.problems
    if row.at:
        assert got.position == position_of(row.reply, row.reply.index(row.at))


def test_without_a_menu_numbers_are_no_plan() -> None:
    got = extract_plan("1, 3")
    assert got.plan is None and got.problems
