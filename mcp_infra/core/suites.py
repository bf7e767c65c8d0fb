"""Prompt suites are data: YAML files under ``policy/suites``, validated by a strict model.

A speed suite says what the benchmark sends; a quality suite's prompt ids are task ids of
``gates.check_task`` and its prompts must be exactly the checker's prompts, so a checker can never
be matched with a question it was not written for.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from mcp_infra.contracts import ID_PATTERN, Contract, Part
from mcp_infra.core.gates import list_tasks

PromptClass = Literal["code", "reasoning", "prose", "long_context", "multi_turn"]


class Message(Part):
    """One OpenAI chat message."""

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1, max_length=200_000)


class SuitePrompt(Part):
    id: Annotated[str, Field(pattern=ID_PATTERN)]
    prompt_class: PromptClass = Field(alias="class")
    messages: list[Message] = Field(min_length=1, max_length=64)
    max_tokens: int = Field(ge=1, le=8192)
    split: Literal["selection", "heldout"] = "selection"

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as an OpenAI chat request carries them."""
        return [m.model_dump() for m in self.messages]

    def token_budget(self, cap: int) -> int:
        """The prompt's own answer length, never above the protocol's ``max_tokens`` cap."""
        return min(self.max_tokens, cap)

    @model_validator(mode="after")
    def _ends_with_user(self) -> SuitePrompt:
        if self.messages[-1].role != "user":
            raise ValueError(f"prompt {self.id}: the last message must come from the user")
        return self


class Suite(Contract):
    id: Annotated[str, Field(pattern=ID_PATTERN)]
    kind: Literal["speed", "quality"]
    description: str = Field("", max_length=2000)
    prompts: list[SuitePrompt] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _consistent(self) -> Suite:
        ids = [p.id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("prompt ids must be unique within a suite")
        if self.kind == "quality":
            tasks = {t.id: t.prompt for t in list_tasks()}
            for prompt in self.prompts:
                if prompt.id not in tasks:
                    raise ValueError(f"quality prompt {prompt.id} is not a known task")
                if prompt.messages[-1].content != tasks[prompt.id]:
                    raise ValueError(f"quality prompt {prompt.id} differs from its task's prompt")
        return self

    def prompt(self, prompt_id: str) -> SuitePrompt | None:
        return next((p for p in self.prompts if p.id == prompt_id), None)
