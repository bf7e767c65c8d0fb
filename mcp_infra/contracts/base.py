"""Shared ground of every contract: the base models, id patterns, plain-text rule."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION: Literal[1] = 1

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
CANDIDATE_ID_PATTERN = r"^(baseline|[a-z0-9][a-z0-9._-]{0,63}:[a-z0-9][a-z0-9._-]{0,63})$"
REVISION_PATTERN = r"^[0-9a-f]{40}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$"
BASELINE_ID = "baseline"

JSONValue = Any
"""JSON from outside the process (an MCP client, a model's reply, a journal line, a bundle or
YAML file): any shape until a contract validates it. The one reason the package uses ``Any``
for data; other ``Any`` says its own reason where it stands."""


def unset(value: object) -> bool:
    """A field added after files were frozen is left out of a dump while unset (None or
    False; pydantic's ``exclude_if``), so every file that does not use it dumps, and hashes,
    exactly as before it existed."""
    return value is None or value is False


class Contract(BaseModel):
    """Base of every contract: unknown fields are an error, never silently kept."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_version: Literal[1] = SCHEMA_VERSION


class Part(BaseModel):
    """Base of nested parts (no version of their own; the enclosing contract has one)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# Characters refused in free text that people and models read later: C0 controls (a multi-line
# field keeps \n and \t), DEL, C1 controls (NEL included), bidi embeddings, overrides, isolates
# and marks, the Unicode line and paragraph separators, zero-width and invisible formatting
# characters (they hide text from a reader), interlinear annotations and tag characters.
_INVISIBLE = (
    "\u061c\u180e\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\U000e0000-\U000e007f"
)
_UNSAFE_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
_UNSAFE_MULTI_LINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why free text is refused (the caller names the field), never repeating the text; None if
    it is fine."""
    if (_UNSAFE_MULTI_LINE if multiline else _UNSAFE_ONE_LINE).search(value):
        return (
            "must be plain text: control, bidi, zero-width, tag and line-separator characters "
            "are not allowed" + ("" if multiline else " (one line)")
        )
    return None


class InventoryFile(Part):
    """One file of a model folder, a hub snapshot or an environment: its relative path, size
    and sha256 (the rows of every inventory and identity digest)."""

    path: str
    size: int
    sha256: str
