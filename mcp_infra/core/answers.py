"""Answer checkers: read the answer out of a reply, and fail a reply that states another.

A small instruct model answers in sentences ("17 multiplied by 23 is 391."), so a checker reads
the answer out of the sentence instead of demanding the bare value; it never searches for a
substring, and whatever it loosens, a reply that states a contradicting result anywhere fails
("the answer is definitely not 391, it is 390" states 390, and negates 391). Per kind:

- **number**: every number the reply states (ASCII digits, thousands commas, decimals, and the
  number words two to ninety-nine) must be the answer or a number of the question; the answer
  must be stated, not negated ("not 391", "391 is wrong"), and not written with a leading zero.
- **json**: every JSON object in the reply (inside prose or a code fence) is parsed; at least one
  must be there and each must have exactly the expected keys and values (strings compared
  case-insensitively); a repeated key fails (only one value may count).
- **code**: the function is taken from the reply's code (a fenced block, or bare ``def`` lines);
  two definitions of it, or a second binding of its name, fail. Checking never runs the code:
  ``procs.sandbox`` runs it against the task's tests in a separate, limited process at
  measurement time and records a ``CodeRun`` whose digest ties it to exactly this code.
- **word**: one of the accepted words must be stated as a word (not inside another word, not
  negated) and none of the task's listed alternatives may appear anywhere.

Pure: text in, verdict out.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import CodeRun, JSONValue

# --------------------------------------------------------------------------------------------
# What a task expects
# --------------------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NumberAnswer(_Frozen):
    kind: Literal["number"] = "number"
    value: int | float


class JsonAnswer(_Frozen):
    kind: Literal["json"] = "json"
    object: dict[str, str | int | float | bool]


class CodeTest(_Frozen):
    """One call of the function: ``function(*args)`` must return ``expect`` (JSON values)."""

    args: list[JSONValue]
    expect: JSONValue


class CodeAnswer(_Frozen):
    kind: Literal["code"] = "code"
    function: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tests: list[CodeTest] = Field(min_length=1)


class WordAnswer(_Frozen):
    kind: Literal["word"] = "word"
    accept: list[str] = Field(min_length=1, description="the answer's accepted spellings")
    contradict: list[str] = Field(default_factory=list, description="other answers: any fails")


Answer = Annotated[NumberAnswer | JsonAnswer | CodeAnswer | WordAnswer, Field(discriminator="kind")]


def describe(answer: Answer) -> str:
    """What the checker requires, in words."""
    if isinstance(answer, NumberAnswer):
        return (
            f"states {answer.value} (in a sentence or alone), not negated; no other number "
            "but the question's own"
        )
    if isinstance(answer, JsonAnswer):
        return (
            f"every JSON object in the reply is exactly {json.dumps(answer.object)} (strings "
            "case-insensitive), and there is at least one"
        )
    if isinstance(answer, CodeAnswer):
        return (
            f"one definition of {answer.function} in the reply's code, run in a separate limited "
            f"process: {len(answer.tests)} call(s) return the expected values"
        )
    also = f"; none of {', '.join(answer.contradict)}" if answer.contradict else ""
    return f"states {' or '.join(answer.accept)} as a word, not negated{also}"


# --------------------------------------------------------------------------------------------
# Numbers and words stated in a text
# --------------------------------------------------------------------------------------------

_DIGITS = re.compile(r"(?<!\w)([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!\w)", re.ASCII)
_UNITS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "zero": 0,
}  # fmt: skip
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}  # fmt: skip
_ONES = {"one": 1, **{k: v for k, v in _UNITS.items() if v < 10 and v > 0}}
_WORDS = re.compile(
    rf"(?<![A-Za-z])(?:({'|'.join(_TENS)})(?:[- ]({'|'.join(_ONES)}))?|({'|'.join(_UNITS)}))"
    r"(?![A-Za-z])",
    re.IGNORECASE,
)
# "one" alone is left out: "the one", "one of" are not numbers ("twenty-one" is).

_NEGATORS = r"(?:not|never|no|isn't|isnt|wasn't|aren't|nor|neither|isn’t|wasn’t)"
_NEGATED_BEFORE = re.compile(rf"\b{_NEGATORS}\s+(?:[A-Za-z']+\s+){{0,2}}$", re.IGNORECASE)
_NEGATED_AFTER = re.compile(
    r"^\s*(?:(?:is|was|are)\s+(?:not|never|wrong|incorrect|false)\b|(?:isn't|wasn't|aren't)\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Mention:
    """One value stated in a text: its value, where, and as written."""

    value: Decimal
    start: int
    end: int
    literal: str

    @property
    def leading_zero(self) -> bool:
        digits = self.literal.lstrip("+-")
        return len(digits) > 1 and digits[0] == "0" and digits[1] != "."


def numbers(text: str) -> list[Mention]:
    """Every number stated in ``text``, in order: ASCII digits (thousands commas, decimals,
    a sign) and the number words zero to ninety-nine but a lone "one"."""
    found = []
    for m in _DIGITS.finditer(text):
        literal = m.group(0)
        try:
            value = Decimal(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or ""))
        except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
            continue
        found.append(Mention(value, m.start(), m.end(), literal))
    for m in _WORDS.finditer(text):
        tens, ones, unit = m.group(1), m.group(2), m.group(3)
        if unit:
            said = _UNITS[unit.lower()]
        else:
            said = _TENS[tens.lower()] + (_ONES[ones.lower()] if ones else 0)
        found.append(Mention(Decimal(said), m.start(), m.end(), m.group(0)))
    return sorted(found, key=lambda x: x.start)


def words(text: str, word: str) -> list[Mention]:
    """Every mention of ``word`` in ``text`` as a word of its own (case-insensitive)."""
    pattern = r"\s+".join(re.escape(part) for part in word.split())
    return [
        Mention(Decimal(0), m.start(), m.end(), m.group(0))
        for m in re.finditer(rf"(?<![A-Za-z0-9]){pattern}(?![A-Za-z0-9])", text, re.IGNORECASE)
    ]


def negated(text: str, mention: Mention) -> bool:
    """Whether ``mention`` is negated: "not 391", "isn't quite 391", "391 is wrong"."""
    before = re.split(r"[.,;:!?\n]", text[max(0, mention.start - 60) : mention.start])[-1]
    return bool(
        _NEGATED_BEFORE.search(before) or _NEGATED_AFTER.match(text[mention.end : mention.end + 40])
    )


def _clip(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (a reply is untrusted and may be of any length)."""
    return text if len(text) <= limit else text[:limit] + "…"


def _short(text: str, limit: int = 60) -> str:
    return repr(_clip(text.strip(), limit))


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f") if value == value.to_integral() else str(value)


# --------------------------------------------------------------------------------------------
# The checkers
# --------------------------------------------------------------------------------------------


def check_number(answer: NumberAnswer, prompt: str, reply: str) -> tuple[bool, str]:
    want = Decimal(str(answer.value))
    given = {m.value for m in numbers(prompt)}
    stated = numbers(reply)
    malformed = [m for m in stated if m.leading_zero]
    if malformed:
        return False, f"{_short(malformed[0].literal)} is not how a number is written"
    hits = [m for m in stated if m.value == want]
    others = [m for m in stated if m.value != want and m.value not in given]
    if not hits:
        if others:
            return False, f"expected {_plain(want)}, got {_clip(others[0].literal)}"
        return False, f"no number stated: {_short(reply)}"
    if others:
        return False, f"states {_plain(want)} but also {_clip(others[0].literal)}"
    denied = [m for m in hits if negated(reply, m)]
    if denied:
        return False, f"negates {_plain(want)}: {_short(reply)}"
    return True, _plain(want)


def check_word(answer: WordAnswer, reply: str) -> tuple[bool, str]:
    hits = [m for word in answer.accept for m in words(reply, word)]
    wrong = sorted(
        (m for word in answer.contradict for m in words(reply, word)), key=lambda m: m.start
    )
    if wrong:
        what = f"states {wrong[0].literal!r}"
        return False, (f"{what} as well as {hits[0].literal!r}" if hits else what) + (
            f" (expected {answer.accept[0]})"
        )
    if not hits:
        return False, f"expected {answer.accept[0]}, not stated in {_short(reply)}"
    if any(negated(reply, m) for m in hits):
        return False, f"negates {answer.accept[0]}: {_short(reply)}"
    return True, answer.accept[0]


class _DuplicateKey(Exception):
    """A JSON object names one key twice (json.loads would silently keep the last value)."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def json_objects(text: str) -> list[dict[str, object]]:
    """Every JSON object in ``text`` outside another (in prose, a fence or alone), in order.

    Raises ``ValueError`` naming a key that an object repeats."""
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)
    found: list[dict[str, object]] = []
    at = text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except _DuplicateKey as exc:
            key = str(exc)
            raise ValueError(f"repeats the JSON key {key!r}; only one value may count") from exc
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        at = text.find("{", end)
    return found


def _same(value: object, want: object) -> bool:
    if isinstance(want, bool) or isinstance(value, bool):
        return value is want
    if isinstance(want, str):
        return isinstance(value, str) and value.strip().casefold() == want.casefold()
    return isinstance(value, int | float) and value == want


def check_json(answer: JsonAnswer, reply: str) -> tuple[bool, str]:
    try:
        objects = json_objects(reply)
    except ValueError as exc:
        return False, f"reply {exc}"
    if not objects:
        return False, f"no JSON object in the reply: {_short(reply)}"
    want = answer.object
    for index, data in enumerate(objects):
        which = "the JSON object" if len(objects) == 1 else f"JSON object {index + 1}"
        if set(data) != set(want):
            keys = _clip(str(sorted(data)))
            return False, f"{which} has the keys {keys}, expected {sorted(want)}"
        for key, expected in want.items():
            if not _same(data[key], expected):
                got = _clip(repr(data[key]))
                return False, f"{which}: {key} is {got}, expected {expected!r}"
    return True, json.dumps(want)


# --------------------------------------------------------------------------------------------
# Code: the function taken from the reply, and the run that judged it
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_LANGS = {"", "python", "py", "python3", "py3"}


class CodeJob(_Frozen):
    """A code answer as it is run: the function's name, the module source taken from the reply
    (top-level calls and prints left out), and the task's tests."""

    function: str
    source: str
    tests: list[CodeTest]

    @property
    def digest(self) -> str:
        body = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()


def _bare_block(text: str, function: str) -> Iterable[str]:
    """Unfenced code: each top-level ``def function(`` with the import lines right above it and
    the indented (or blank) lines below it."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if not re.match(rf"(?:async\s+)?def\s+{function}\s*\(", line):
            continue
        start = index
        while start > 0 and re.match(r"(?:import|from)\s", lines[start - 1]):
            start -= 1
        end = index + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
            end += 1
        yield "\n".join(lines[start:end])


def code_blocks(text: str, function: str) -> list[str]:
    """The reply's code that defines ``function``: fenced Python (or untagged) blocks that name
    it, and bare ``def`` lines outside the fences. A last fence left open (cut off) counts."""
    named = re.compile(rf"\bdef\s+{function}\s*\(")
    fences = list(_FENCE.finditer(text))
    fenced = [
        m.group(2) for m in fences if m.group(1).lower() in _CODE_LANGS and named.search(m.group(2))
    ]
    outside = text
    for m in reversed(fences):
        outside = outside[: m.start()] + "\n" + outside[m.end() :]
    return fenced + list(_bare_block(outside, function))


def code_job(answer: CodeAnswer, reply: str) -> tuple[CodeJob | None, str]:
    """The code to run for ``reply``, or None with the reason it cannot be run."""
    name = answer.function
    blocks = code_blocks(reply, name)
    if not blocks:
        return None, f"no code defining {name} in the reply: {_short(reply)}"
    if len(blocks) > 1:
        return None, f"the reply defines {name} in {len(blocks)} separate blocks; one may count"
    try:
        module = ast.parse(blocks[0])
    except SyntaxError as exc:
        return None, f"code does not parse: {exc.msg} (line {exc.lineno})"
    rebound = _rebinds(module, name)
    if rebound is not None:
        return None, f"the code binds {name} more than once ({rebound}); one may count"
    top = [node for node in module.body if not isinstance(node, ast.Expr)]
    defs = [n for n in top if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if not any(n.name == name for n in defs):
        return None, f"the code does not define {name} at the top level"
    source = ast.unparse(ast.Module(body=top, type_ignores=[]))
    return CodeJob(function=name, source=source, tests=list(answer.tests)), ""


def _rebinds(module: ast.Module, name: str) -> str | None:
    """How ``name`` is bound a second time anywhere in the module, or None if it is bound once.

    Any binding counts, at any depth: def, class, import (``as`` included), star import,
    assignment, augmented or annotated assignment, walrus, for/with/except targets, global.
    """
    bindings: list[str] = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                bindings.append(f"{type(node).__name__} on line {node.lineno}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if bound == name or alias.name == "*":
                    bindings.append(f"import on line {node.lineno}")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            if node.id == name:
                bindings.append(f"assignment on line {node.lineno}")
        elif isinstance(node, ast.Global | ast.Nonlocal) and name in node.names:
            bindings.append(f"global on line {node.lineno}")
        elif isinstance(node, ast.ExceptHandler) and node.name == name:
            bindings.append(f"except on line {node.lineno}")
    return ", ".join(bindings) if len(bindings) > 1 else None


def check_code(answer: CodeAnswer, reply: str, run: CodeRun | None) -> tuple[bool, str]:
    job, why = code_job(answer, reply)
    if job is None:
        return False, why
    if run is None:
        return False, f"the code defining {answer.function} was not run against its tests"
    if run.digest != job.digest:
        return False, "the recorded run is of other code than this reply's"
    return run.ok, run.detail


def check_answer(
    answer: Answer, prompt: str, reply: str, run: CodeRun | None = None
) -> tuple[bool, str]:
    """(passed, what the checker found) for one reply to a task with this answer and prompt."""
    if isinstance(answer, NumberAnswer):
        return check_number(answer, prompt, reply)
    if isinstance(answer, JsonAnswer):
        return check_json(answer, reply)
    if isinstance(answer, CodeAnswer):
        return check_code(answer, reply, run)
    return check_word(answer, reply)


def prompt_mentions(prompt: str, values: Sequence[str]) -> list[str]:
    """Those of ``values`` the prompt itself names as words (a task may not list them as
    contradictions: restating the question would fail)."""
    return [v for v in values if words(prompt, v)]
