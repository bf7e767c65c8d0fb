"""The menu a small served model plans from, which prompt form a model gets, and the fallback
plan (pure)."""

from __future__ import annotations

from mcp_infra.contracts import Plan
from mcp_infra.core.menu import (
    ANSWER_EXCERPT,
    MENU_CHOICES,
    MENU_ITEMS,
    Menu,
    MenuItem,
    ModelSize,
    fallback_plan,
    make_menu,
    model_size,
    plan_candidate_limit,
    prompt_form,
)
from mcp_infra.core.sanitize import parse_plan

# SmolLM2-135M-Instruct's hyper-parameters, as its GGUF metadata (llama.*) gives them.
SMOLLM2 = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def item(n: int, verdict: str | None = None) -> MenuItem:
    return MenuItem(
        id=f"m:c{n}", title=f"c{n}", candidate_class="server_tuning", lossy=False,
        last_verdict=verdict,
    )  # fmt: skip


def test_model_size_from_config() -> None:
    small = model_size(SMOLLM2)
    # embeddings 49152*576 + 30 layers of attention (q,o 576x576; k,v 576x192) and MLP 3x576x1536
    assert small.parameters == 49152 * 576 + 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert 130e6 < small.parameters < 140e6 and small.max_context == 8192
    untied = model_size({**SMOLLM2, "tie_word_embeddings": False})
    assert untied.parameters == small.parameters + 49152 * 576
    vlm = model_size({"model_type": "x", "text_config": SMOLLM2})
    assert vlm == small
    experts = model_size({**SMOLLM2, "num_local_experts": 8})
    assert experts.parameters is not None and experts.parameters > 7 * small.parameters // 2
    assert model_size({"max_position_embeddings": 4096}) == ModelSize(max_context=4096)


def test_prompt_form_by_size() -> None:
    assert prompt_form(model_size(SMOLLM2)) == "menu"
    assert prompt_form(None) == "menu" and prompt_form(ModelSize()) == "menu"
    assert prompt_form(ModelSize(parameters=8_000_000_000, max_context=131072)) == "json"
    assert prompt_form(ModelSize(parameters=8_000_000_000, max_context=4096)) == "menu"
    assert prompt_form(ModelSize(parameters=500_000_000, max_context=32768)) == "menu"


def test_the_limit_is_the_plan_contract_s() -> None:
    bound = Plan.model_fields["candidates"].metadata[1].max_length
    assert plan_candidate_limit() == min(MENU_CHOICES, bound) == Menu(items=[]).limit


def test_fallback_takes_untried_first_in_catalog_order() -> None:
    menu = Menu(items=[item(1, "rejected -4.0%"), item(2), item(3, "qualified +9.0%"), item(4)])
    plan = fallback_plan(menu, ["gibberish", "x" * 5000], "no numbers")
    assert plan is not None
    assert plan["candidates"] == ["m:c2", "m:c4", "m:c1"]
    notes = str(plan["notes"])
    assert notes.startswith("planner: fallback\nwhy: no numbers\nmodel answer 1: gibberish\n")
    assert "model answer 2: " + "x" * ANSWER_EXCERPT + "…" in notes
    assert len(notes) < 2 * ANSWER_EXCERPT + 200
    assert parse_plan(plan).candidates == ["m:c2", "m:c4", "m:c1"]  # a valid plan as it is
    assert fallback_plan(Menu(items=[]), ["x"], "why") is None


def test_fallback_notes_keep_no_control_characters() -> None:
    menu = Menu(items=[item(1)])
    plan = fallback_plan(menu, ["a\x00b\u202ec\x1b[31m"], "w")
    assert plan is not None and "a?b?c?[31m" in str(plan["notes"])
    parse_plan(plan)  # notes with a control character would be refused


def test_a_long_catalog_shows_untried_first_in_catalog_order() -> None:
    items = [item(n, "rejected" if n % 2 else None) for n in range(1, 41)]
    menu = make_menu(items)
    assert len(menu.items) == MENU_ITEMS and menu.hidden == 40 - MENU_ITEMS
    shown = [int(i.id.removeprefix("m:c")) for i in menu.items]
    assert shown == sorted(shown)
    assert set(range(2, 41, 2)) <= set(shown)  # all 20 untried are kept
    assert [n for n in shown if n % 2] == [1, 3, 5, 7]  # then the first tried ones
    assert make_menu(items[:5]).items == items[:5]
