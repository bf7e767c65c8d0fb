"""A plan out of a model's free-form reply: thinking blocks, code fences and prose around it
are handled; the last valid plan wins, fenced ones first. Pure: text in, a plan or problems out.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import JSONValue
from mcp_infra.core.gates import strip_thinking
from mcp_infra.core.sanitize import PlanRefused, parse_plan

MAX_REPLY = 200_000


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.DOTALL)


MAX_OBJECTS = 50


class Extraction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: dict[str, JSONValue] | None = None
    source: Literal["fenced", "inline", "none"] = "none"
    found_objects: int = 0
    problems: list[str] = Field(default_factory=list)


def _objects(text: str) -> list[JSONValue]:
    """Top-level JSON objects in a text, in order (a nested object is not listed again)."""
    decoder = json.JSONDecoder()
    found: list[JSONValue] = []
    index = text.find("{")
    while index != -1 and len(found) < MAX_OBJECTS:
        try:
            value, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        found.append(value)
        index = text.find("{", end)
    return found


def _as_plan(value: JSONValue) -> dict[str, JSONValue] | None:
    if isinstance(value, dict) and set(value) == {"plan"} and isinstance(value["plan"], dict):
        value = value["plan"]
    return value if isinstance(value, dict) else None


def extract_plan(reply: str) -> Extraction:
    """The last schema-valid plan in a reply, preferring fenced code blocks; never guesses."""
    if not reply or not reply.strip():
        return Extraction(problems=["the reply is empty"])
    text = strip_thinking(reply[:MAX_REPLY])
    fenced: list[JSONValue] = []
    for match in _FENCE.finditer(text):
        fenced += _objects(match.group(2))
    inline = _objects(_FENCE.sub(" ", text))
    problems: list[str] = []
    total = len(fenced) + len(inline)
    for source, values in (("fenced", fenced), ("inline", inline)):
        for value in reversed(values):
            candidate = _as_plan(value)
            if candidate is None or "candidates" not in candidate:
                continue
            try:
                parse_plan(candidate)
            except PlanRefused as exc:
                if not problems:
                    problems = [
                        f"a JSON object looks like a plan but is not valid: {p}"
                        for p in (exc.problems or [str(exc)])
                    ][:5]
                continue
            return Extraction(plan=candidate, source=source, found_objects=total)  # type: ignore[arg-type]
    if not problems:
        problems = [
            f'no JSON object with "hypothesis" and "candidates" in the reply '
            f"({total} JSON object(s) found outside thinking blocks)"
        ]
    return Extraction(found_objects=total, problems=problems)
