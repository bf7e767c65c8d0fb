"""Pages sized for a context: any list cut into pages of at most a budget of characters, and any
text cut into pages of a fixed size.

Every list an MCP answer carries goes through here, whatever its items are (candidates of the
registry, a verdict's candidates, gate results), so a view that grows (a generated catalog, a
filter) pages without a change here. A page that does not exist is an error that names the
range; nothing is clamped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mcp_infra.errors import McpInfraError

T = TypeVar("T")


class NoSuchPage(McpInfraError, LookupError):
    """A page number outside 1..pages; the message names the range."""

    def __init__(self, page: int | None, pages: int) -> None:
        said = f"no page {page}" if page is not None else "a page is a whole number"
        super().__init__(f"{said}: pages are 1 to {pages}")
        self.pages = pages


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    page: int
    pages: int


def json_size(item: Any) -> int:
    """Characters of an item as compact JSON (what a page's budget counts)."""
    data = item.model_dump(mode="json") if hasattr(item, "model_dump") else item
    return len(json.dumps(data, default=str, separators=(",", ":"), ensure_ascii=False))


def check_page(page: int, pages: int) -> None:
    if not 1 <= page <= pages:
        raise NoSuchPage(page, pages)


def split(items: Sequence[T], budget: int, size: Callable[[T], int] = json_size) -> list[list[T]]:
    """Consecutive items, greedily, so that each page's sizes add up to at most ``budget`` (an
    item larger than the budget has a page of its own). An empty list is one empty page."""
    pages: list[list[T]] = [[]]
    used = 0
    for item in items:
        cost = size(item)
        if pages[-1] and used + cost > budget:
            pages.append([])
            used = 0
        pages[-1].append(item)
        used += cost
    return pages


def page_of(
    items: Sequence[T], page: int, budget: int, size: Callable[[T], int] = json_size
) -> Page[T]:
    """Page ``page`` (1-based) of ``items``; ``NoSuchPage`` names the range."""
    pages = split(items, budget, size)
    check_page(page, len(pages))
    return Page(pages[page - 1], page, len(pages))


def text_pages(text: str, size: int) -> int:
    return max(1, -(-len(text) // size))


def text_page(text: str, page: str | int, size: int) -> str:
    """Page ``page`` (1-based) of ``text`` in pages of ``size`` characters; concatenated, the
    pages are the text."""
    count = text_pages(text, size)
    if not str(page).isdigit():
        raise NoSuchPage(None, count)
    check_page(int(page), count)
    start = (int(page) - 1) * size
    return text[start : start + size]
