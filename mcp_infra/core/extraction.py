"""A plan out of a model's free-form reply. Pure: text in, a plan or problems out.

What models write is taken as it is: thinking blocks, code fences and prose around the object;
trailing commas, ``//``, ``/* */`` and ``#`` comments, smart quotes, single quotes, bare keys and
Python's ``True``/``False``/``None``; a Python dict literal (read with ``ast.literal_eval``,
never evaluated); and, given the numbered menu the model was shown, an answer naming its ids
or its numbers (``1, 3``, ``Candidates: 2 and 4``, ``[1,3]``). The last valid JSON plan wins,
fenced ones first; of a menu answer, the first line that lists numbers.
Nothing is guessed: a reply without a plan gets the place and the reason (line, column and
character of the answer, what was expected there, what was found) instead.

Written here rather than taken from a library: ``json5`` reads trailing commas, comments and
single quotes but not ``#`` comments, smart quotes or Python's constants, and its errors are a
formatted string; ``json-repair`` repairs anything, so it never says where an answer went wrong;
``dirtyjson`` has had no release since 2022. The standard library's ``json`` gives the position
and the reason of an error, and the lexer below keeps the map back to the model's characters.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import JSONValue
from mcp_infra.core.gates import strip_thinking
from mcp_infra.core.menu import Menu, menu_plan
from mcp_infra.core.sanitize import PlanRefused, parse_plan

MAX_REPLY = 200_000
MAX_SPANS = 50  # objects tried per reply (a failed one counts: the work is bounded)
MAX_SPAN = 65_536  # a plan is at most 16 KiB; an object longer than this is not one
MAX_DEPTH = 32

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.DOTALL)
_DOUBLE_OPEN = '"\u201c\u201d\u201e\u201f'  # " and the smart double quotes
_SINGLE_OPEN = "'\u2018\u2019\u201a\u201b"  # ' and the smart single quotes
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_PYTHON_WORDS = {"True": "true", "False": "false", "None": "null"}


class Position(BaseModel):
    """Where in the reply: ``offset`` counts characters from 0; line and column from 1."""

    model_config = ConfigDict(extra="forbid")

    offset: int
    line: int
    column: int


class Extraction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: dict[str, JSONValue] | None = None
    source: Literal["fenced", "inline", "menu", "none"] = "none"
    found_objects: int = 0
    problems: list[str] = Field(default_factory=list)
    position: Position | None = Field(None, description="where the first problem is")
    numbers: list[int] = Field(default_factory=list, description="a menu answer's numbers")


def position_of(text: str, offset: int) -> Position:
    line = text.count("\n", 0, offset) + 1
    return Position(offset=offset, line=line, column=offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _near(text: str, offset: int) -> str:
    snippet = " ".join(text[max(0, offset - 12) : offset + 12].split()).replace("`", "'")
    return f"`{snippet}`"


def _where(text: str, offset: int) -> str:
    at = position_of(text, offset)
    return f"line {at.line}, column {at.column} (character {at.offset})"


# ---------------------------------------------------------------------------------------------
# lenient JSON: a lexer that writes strict JSON and remembers each character's origin
# ---------------------------------------------------------------------------------------------


@dataclass
class _Lexer:
    """Rewrites the object that opens at ``start`` as strict JSON, character by character:
    comments and trailing commas dropped, every quote style made a double-quoted string, bare
    keys quoted, Python's constants made JSON's. ``origin[k]`` is the reply offset of output
    character ``k``; ``end`` is just past the closing brace (or where the text ran out)."""

    text: str
    start: int
    stop: int
    out: list[str] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)
    end: int = 0
    problem: str | None = None

    def emit(self, chars: str, at: int) -> None:
        self.out.append(chars)
        self.origin += [at] * len(chars)

    def run(self) -> _Lexer:
        i, depth, text = self.start, 0, self.text
        stop = min(self.stop, self.start + MAX_SPAN)
        while i < stop:
            ch = text[i]
            if ch in _DOUBLE_OPEN or ch in _SINGLE_OPEN:
                i = self.string(i, stop)
            elif (ch == "/" and text[i + 1 : i + 2] in ("/", "*")) or ch == "#":
                i = self.comment(i, stop)
            elif ch == ",":
                i = self.comma(i, stop)
            elif ch.isascii() and (ch.isalpha() or ch == "_"):
                i = self.word(i, stop)
            else:
                self.emit(ch, i)
                depth += (ch in "{[") - (ch in "}]")
                i += 1
                if depth > MAX_DEPTH:
                    self.problem = f"nested deeper than {MAX_DEPTH} levels"
                    break
                if depth == 0:
                    break
        self.end = i
        if depth and self.problem is None and i >= self.start + MAX_SPAN:
            self.problem = f"longer than {MAX_SPAN} characters without closing"
        return self

    def string(self, i: int, stop: int) -> int:
        opener, text = self.text[i], self.text
        closers = '"' if opener == '"' else "'" if opener == "'" else None
        if closers is None:
            closers = _DOUBLE_OPEN if opener in _DOUBLE_OPEN else _SINGLE_OPEN
        self.emit('"', i)
        j = i + 1
        while j < stop and text[j] not in closers:
            ch = text[j]
            if ch == "\\" and j + 1 < stop:
                escaped = text[j + 1]
                self.emit(escaped if escaped == "'" else "\\" + escaped, j)
                j += 2
                continue
            self.emit('\\"' if ch == '"' else ch, j)
            j += 1
        if j < stop:
            self.emit('"', j)
            return j + 1
        return j  # unterminated: json reports it where the string opened

    def comment(self, i: int, stop: int) -> int:
        if self.text.startswith("/*", i):
            close = self.text.find("*/", i + 2, stop)
            return stop if close == -1 else close + 2
        close = self.text.find("\n", i, stop)
        return stop if close == -1 else close

    def comma(self, i: int, stop: int) -> int:
        """A comma, unless only blanks and comments stand between it and a closing bracket."""
        j = i + 1
        while j < stop:
            if self.text[j].isspace():
                j += 1
            elif self.text[j] == "#" or self.text.startswith(("//", "/*"), j):
                j = self.comment(j, stop)
            else:
                break
        if j >= stop or self.text[j] not in "}]":
            self.emit(",", i)
        return i + 1

    def word(self, i: int, stop: int) -> int:
        match = _WORD.match(self.text, i, stop)
        assert match is not None  # called on a letter or underscore
        word, j = match.group(), match.end()
        rest = self.text[j:stop].lstrip(" \t")
        if rest.startswith(":") and word not in ("true", "false", "null"):
            self.emit(json.dumps(word), i)  # a bare key
        else:
            self.emit(_PYTHON_WORDS.get(word, word), i)
        return j


_EXPECTED = {
    "Expecting ',' delimiter": "expected ',' or a closing bracket",
    "Expecting ':' delimiter": "expected ':' after a key",
    "Expecting value": "expected a value",
    "Expecting property name enclosed in double quotes": "expected a key in quotes",
    "Unterminated string starting at": "a string opens here and never closes",
    "Invalid control character at": "a line break or control character inside a string",
    "Invalid \\escape": "an invalid escape",
}


@dataclass
class _Object:
    value: JSONValue
    start: int
    end: int


@dataclass
class _Failure:
    start: int
    offset: int
    reason: str
    plan_like: bool


def _json_value(value: object) -> JSONValue:
    """A Python literal as JSON data (tuples become lists); ValueError for anything else."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v) for k, v in value.items()}
    raise ValueError(f"a Python {type(value).__name__} has no JSON form")


def _load(text: str, start: int, stop: int) -> _Object | _Failure:
    """The object opening at ``start``: strict JSON, else lenient JSON, else a Python literal;
    on failure, where the lenient reading stopped and what it expected there."""
    lexer = _Lexer(text, start, stop).run()
    raw = text[start : lexer.end]
    plan_like = "candidates" in raw.lower() or "hypothesis" in raw.lower()
    if lexer.problem:
        return _Failure(start, lexer.end, lexer.problem, plan_like)
    try:
        return _Object(json.loads(raw), start, lexer.end)
    except (ValueError, RecursionError):
        pass
    strict = "".join(lexer.out)
    try:
        return _Object(json.loads(strict), start, lexer.end)
    except json.JSONDecodeError as exc:
        failure = _decode_failure(exc, lexer, stop < len(text), plan_like)
    except (ValueError, RecursionError) as exc:
        failure = _Failure(start, start, str(exc)[:200], plan_like)
    python = _python_literal(raw)
    return failure if python is None else _Object(python, start, lexer.end)


def _decode_failure(
    exc: json.JSONDecodeError, lexer: _Lexer, in_fence: bool, plan_like: bool
) -> _Failure:
    """Where the strict reading of the lexer's output stopped, in the model's characters."""
    offset = lexer.origin[exc.pos] if exc.pos < len(lexer.origin) else lexer.end
    reason = _EXPECTED.get(exc.msg, exc.msg[:1].lower() + exc.msg[1:])
    if exc.pos >= len(lexer.origin):
        reason += ", found the end of the " + ("fence" if in_fence else "reply")
    else:
        reason += f", found {lexer.text[offset]!r}"
    return _Failure(lexer.start, offset, reason, plan_like)


def _python_literal(raw: str) -> JSONValue | None:
    """A Python literal (tuples, triple quotes, escapes JSON lacks) read by
    ``ast.literal_eval``; None when it is not one, or when two strings stand side by side
    (Python would join them: a missing comma is an error here, not a merged id)."""
    try:
        tokens = [
            t.type
            for t in tokenize.generate_tokens(io.StringIO(raw).readline)
            if t.type not in _LAYOUT_TOKENS
        ]
        if any(a == b == tokenize.STRING for a, b in zip(tokens, tokens[1:], strict=False)):
            return None
        return _json_value(ast.literal_eval(raw))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        return None


_LAYOUT_TOKENS = {
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.COMMENT,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def _scan(text: str, begin: int) -> tuple[list[tuple[_Object, bool]], list[_Failure]]:
    """Top-level objects from ``begin`` on, in order, each with whether it sits in a code fence
    (a nested object is not listed again), and the objects that did not parse."""
    fences = [(m.start(2), m.end(2)) for m in _FENCE.finditer(text, begin)]
    found: list[tuple[_Object, bool]] = []
    failures: list[_Failure] = []
    index = text.find("{", begin)
    for _ in range(MAX_SPANS):
        if index == -1:
            break
        fence = next(((a, b) for a, b in fences if a <= index < b), None)
        stop = fence[1] if fence else next((a for a, _ in fences if a > index), len(text))
        result = _load(text, index, stop)
        if isinstance(result, _Object):
            found.append((result, fence is not None))
            index = text.find("{", result.end)
        else:
            failures.append(result)
            index = text.find("{", index + 1)
    return found, failures


def _as_plan(value: JSONValue) -> dict[str, JSONValue] | None:
    if isinstance(value, dict) and set(value) == {"plan"} and isinstance(value["plan"], dict):
        value = value["plan"]
    return value if isinstance(value, dict) and "candidates" in value else None


# ---------------------------------------------------------------------------------------------
# a numbered-menu answer
# ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.:/-])\d+(?![\w:/-]|\.\w)")
_BETWEEN = re.compile(
    r"[\s,;/&+]*(?:(?:and|or|plus)\b[\s,]*)?(?:(?:#|no\.?|numbers?|options?|candidates?)\s*)?",
    re.IGNORECASE,
)
_MARKUP = str.maketrans({"*": " ", "`": " ", "_": " "})
_LIST_MARKER = re.compile(r"^\s*(?:[-\u2022]|\d{1,2}[.)])\s+(?=\S)")


@dataclass
class _MenuLine:
    numbers: list[tuple[int, int]]  # (number, reply offset)


def _menu_lines(text: str, begin: int) -> list[_MenuLine]:
    """Lines whose digits are all standalone numbers joined by separators ('1, 3', 'Answer:
    2 and 4', '[1,3]', 'I pick option 2.'): the text before and after them has no digit. A
    list marker opening a line ('1. ', '- ') is the model's own list, not a menu number, and
    consecutive lines of one number alone ('1' then '3') are one answer."""
    lines: list[_MenuLine] = []
    offset, run = begin, False
    for line in text[begin:].split("\n"):
        plain = _LIST_MARKER.sub(lambda m: " " * len(m.group()), line.translate(_MARKUP))
        numbers = _numbers_of(plain, offset)
        single = len(numbers) == 1 and not any(ch.isalpha() for ch in plain)
        if single and run:
            lines[-1].numbers += numbers
        elif numbers:
            lines.append(_MenuLine(numbers))
        run = single or (run and not plain.strip())
        offset += len(line) + 1
    return lines


def _numbers_of(plain: str, offset: int) -> list[tuple[int, int]]:
    """The numbers of a menu line with their offsets; none unless every digit is in one."""
    matches = list(_NUMBER.finditer(plain))
    if sum(ch.isdigit() for ch in plain) != sum(len(m.group()) for m in matches):
        return []
    pairs = zip(matches, matches[1:], strict=False)
    if not all(_BETWEEN.fullmatch(plain[a.end() : b.start()]) for a, b in pairs):
        return []
    return [(int(m.group()), offset + m.start()) for m in matches]


def _named(text: str, begin: int, menu: Menu) -> list[tuple[int, int]]:
    """(menu number, offset) of each menu id the answer names exactly, in order of appearance
    (a longer id that merely starts with one is not it)."""
    found = []
    for number, item in enumerate(menu.items, 1):
        pattern = r"(?<![\w.:-])" + re.escape(item.id) + r"(?![\w.-]|:\w)"
        if match := re.compile(pattern).search(text, begin):
            found.append((match.start(), number))
    return [(number, at) for at, number in sorted(found)]


def menu_answer(text: str, menu: Menu, begin: int = 0) -> Extraction:
    """The plan a menu answer names, read from ``text[begin:]``: the menu ids it names
    verbatim, else the numbers of its first line that is a list of them (a small model
    answers first and rambles after); positions count in ``text``."""
    size = len(menu.items)
    chosen = _named(text, begin, menu)
    what = "candidates of the menu named"
    if not chosen:
        lines = _menu_lines(text, begin)
        chosen, what = (lines[0].numbers if lines else []), "numbers"
    if not chosen:
        return Extraction(
            problems=[
                f"expected the numbers (or ids) of 1 to {menu.limit} candidates from the menu "
                f"(1 to {size}); the answer has none"
            ]
        )
    numbers: list[int] = []
    for number, at in chosen:
        if not 1 <= number <= size:
            return Extraction(
                problems=[f"{_where(text, at)}: {number} is not on the menu (1 to {size})"],
                position=position_of(text, at),
            )
        if number not in numbers:
            numbers.append(number)
    if len(numbers) > menu.limit:
        at = chosen[0][1]
        return Extraction(
            problems=[f"{_where(text, at)}: {len(numbers)} {what}, at most {menu.limit}"],
            position=position_of(text, at),
        )
    plan = menu_plan(menu, numbers, text[begin:])
    return Extraction(plan=plan, source="menu", numbers=numbers)


# ---------------------------------------------------------------------------------------------
# the plan in a reply
# ---------------------------------------------------------------------------------------------


def _failure_problem(failures: list[_Failure], text: str) -> tuple[str, Position] | None:
    """The failure to report: the last one that looks like a plan, else the last one."""
    if not failures:
        return None
    chosen = next((f for f in reversed(failures) if f.plan_like), failures[-1])
    opened = position_of(text, chosen.start)
    message = (
        f"{_where(text, chosen.offset)}: {chosen.reason} (near {_near(text, chosen.offset)}; "
        f"in the object opened at line {opened.line}, column {opened.column})"
    )
    return message, position_of(text, chosen.offset)


def _invalid(text: str, obj: _Object, exc: PlanRefused) -> tuple[list[str], Position]:
    where = f"the object at {_where(text, obj.start)} looks like a plan but is not valid"
    return [f"{where}: {p}" for p in (exc.problems or [str(exc)])][:5], position_of(text, obj.start)


def extract_plan(reply: str, menu: Menu | None = None) -> Extraction:
    """The last schema-valid plan in a reply, preferring fenced code blocks; with a menu, an
    answer of its numbers when the reply holds no valid JSON plan. Never guesses: otherwise
    the problems say where and why. Positions count in the reply as given when the thinking
    stripped from it came first (the usual case), else in the answer part."""
    if not reply or not reply.strip():
        return Extraction(problems=["the reply is empty"])
    reply = reply[:MAX_REPLY]
    answer = strip_thinking(reply)
    text = reply if reply.endswith(answer) else answer
    begin = len(text) - len(answer)
    found, failures = _scan(text, begin)
    invalid: tuple[list[str], Position] | None = None
    for fenced in (True, False):
        for obj, in_fence in reversed(found):
            candidate = _as_plan(obj.value) if in_fence == fenced else None
            if candidate is None:
                continue
            try:
                parse_plan(candidate)
            except PlanRefused as exc:
                invalid = invalid or _invalid(text, obj, exc)
                continue
            source: Literal["fenced", "inline"] = "fenced" if fenced else "inline"
            return Extraction(plan=candidate, source=source, found_objects=len(found))
    if menu is not None and invalid is None:
        numbered = menu_answer(text, menu, begin)
        if numbered.plan is not None or not any(f.plan_like for f in failures):
            return numbered.model_copy(update={"found_objects": len(found)})
    failed = invalid or _failure_problem(failures, text)
    if failed is not None:
        problems = failed[0] if isinstance(failed[0], list) else [failed[0]]
        return Extraction(found_objects=len(found), problems=problems, position=failed[1])
    return Extraction(
        found_objects=len(found),
        problems=[
            'expected a JSON object with "hypothesis" and "candidates"; the answer has '
            + (f"{len(found)} other object(s)" if found else "no '{'")
        ],
    )
