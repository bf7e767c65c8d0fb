"""The numbered menu a small served model plans from, which prompt form a model gets, and the
deterministic plan proposed when the model gives no usable answer. Pure: data in, data out.

A model of a billion parameters or more with a context of at least 8,192 tokens gets the full
JSON prompt (about 1,800 tokens plus up to 2,048 of answer); a smaller one, or one whose size
is unknown, gets the menu: one line per candidate id, answered with numbers
(SmolLM2-135M-Instruct, given the JSON prompt, wrote prose about JSON schemas and no plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field

from mcp_infra.contracts import JSONValue, Plan, text_problem
from mcp_infra.core.modelfacts import shape_of, text_config

PromptForm = Literal["menu", "json"]

MENU_BELOW_PARAMETERS = 1_000_000_000
MENU_BELOW_CONTEXT = 8192
MENU_ITEMS = 24  # a longer catalog shows its untried candidates first, then the rest
ANSWER_EXCERPT = 500  # characters of each model answer kept in a fallback plan's notes
MENU_CHOICES = 3
"""The most candidates a menu answer (and the fallback plan) names: a small model picks a few
and the fallback proposes the first few untried ones; a plan long enough to be screened is a
planner's choice over the whole registry, never a fallback's."""


def plan_candidate_limit() -> int:
    """How many candidates a menu answer may name: ``MENU_CHOICES``, never more than the
    ``Plan`` contract's own bound."""
    for rule in Plan.model_fields["candidates"].metadata:
        if isinstance(rule, annotated_types.MaxLen):
            return min(MENU_CHOICES, int(rule.max_length))
    raise AssertionError("Plan.candidates has no maximum length")  # pragma: no cover


class MenuItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    candidate_class: str
    lossy: bool
    last_verdict: str | None = Field(None, description="e.g. 'rejected 0.82x', newest cycle")


class Menu(BaseModel):
    """Candidates in catalog order; an answer's number n names ``items[n - 1]``."""

    model_config = ConfigDict(extra="forbid")

    items: list[MenuItem]
    limit: int = Field(default_factory=plan_candidate_limit)
    hidden: int = Field(0, description="runnable candidates left off a long menu")


def make_menu(items: list[MenuItem]) -> Menu:
    """The menu of runnable candidates: all of them, or for a long catalog the first
    ``MENU_ITEMS`` with untried ones first, kept in catalog order."""
    if len(items) <= MENU_ITEMS:
        return Menu(items=items)
    ranked = sorted(range(len(items)), key=lambda i: (items[i].last_verdict is not None, i))
    keep = sorted(ranked[:MENU_ITEMS])
    return Menu(items=[items[i] for i in keep], hidden=len(items) - MENU_ITEMS)


class ModelSize(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parameters: int | None = Field(None, description="estimated from config.json")
    max_context: int | None = None


def _int(config: Mapping[str, JSONValue], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_size(config: Mapping[str, JSONValue]) -> ModelSize:
    """A decoder's parameter count from its Hugging Face ``config.json`` (attention, MLP with
    its experts, embeddings; norms and biases left out: they are under 0.1%) and its context.
    The shape is ``modelfacts.shape_of``'s (a multimodal config's ``text_config`` is the
    language model); the MLP's width, experts, tied embeddings and context are read here."""
    shape = shape_of(config)
    text = {**config, **text_config(config)}
    context = _int(text, "max_position_embeddings", "max_sequence_length", "n_positions")
    hidden, layers, vocab = shape.hidden_size, shape.num_layers, shape.vocab_size
    if not hidden or not layers or not vocab:
        return ModelSize(max_context=context)
    heads = shape.num_attention_heads or 1
    kv_heads = shape.num_kv_heads or heads
    head_dim = shape.head_dim or hidden // heads
    mlp = _int(text, "intermediate_size", "n_inner") or 4 * hidden
    experts = _int(text, "num_local_experts", "num_experts", "n_routed_experts") or 1
    expert_mlp = _int(text, "moe_intermediate_size") or mlp
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    feed_forward = 3 * hidden * (expert_mlp * experts if experts > 1 else mlp)
    tied = text.get("tie_word_embeddings", True) is not False
    embeddings = vocab * hidden * (1 if tied else 2)
    return ModelSize(
        parameters=layers * (attention + feed_forward) + embeddings, max_context=context
    )


def prompt_form(size: ModelSize | None) -> PromptForm:
    """The menu for a small model or one of unknown size; the JSON prompt for a large one."""
    if size is None or size.parameters is None or size.max_context is None:
        return "menu"
    small = size.parameters < MENU_BELOW_PARAMETERS or size.max_context < MENU_BELOW_CONTEXT
    return "menu" if small else "json"


def plain(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, every character a plan's notes refuse (controls,
    bidi, zero-width) shown as '?': a model's raw answer kept as evidence."""
    cut = text[:limit]
    shown = "".join("?" if text_problem(ch, multiline=True) else ch for ch in cut)
    return shown + ("…" if len(text) > limit else "")


def menu_plan(menu: Menu, numbers: list[int], answer: str) -> dict[str, JSONValue]:
    """The plan a menu answer names: its numbers' candidate ids, in the answer's order."""
    listed = ", ".join(str(n) for n in numbers)
    return {
        "hypothesis": f"the served model chose {listed} from the numbered menu",
        "candidates": [menu.items[n - 1].id for n in numbers],
        "notes": f"planner: served model (menu answer)\nmodel answer: {plain(answer, 200)}",
    }


def fallback_plan(menu: Menu, answers: list[str], why: str) -> dict[str, JSONValue] | None:
    """The deterministic plan when the model gave no usable answer: untried candidates first,
    each group in catalog order, at most the plan's limit; None for an empty menu. Its notes
    record ``planner: fallback``, why, and each of the model's answers (bounded)."""
    if not menu.items:
        return None
    order = sorted(menu.items, key=lambda item: item.last_verdict is not None)  # stable
    chosen = [item.id for item in order[: menu.limit]]
    lines = ["planner: fallback", f"why: {plain(why, 300)}"]
    lines += [
        f"model answer {i}: {plain(answer, ANSWER_EXCERPT)}" for i, answer in enumerate(answers, 1)
    ]
    return {
        "hypothesis": "fallback: the served model gave no usable plan; untried candidates "
        "first, in catalog order",
        "candidates": chosen,
        "notes": "\n".join(lines),
    }
