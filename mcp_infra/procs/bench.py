"""OpenAI-compatible measurement: the same code measures the baseline and every candidate.

Timing requests are streamed at temperature 0 and timed on the client (mlx_lm.server reports no
timings). Greedy outputs for the equality gate come from a non-streaming request with
``logprobs`` so the token ids are compared, not just the text.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx2 as httpx

from mcp_infra.contracts import Sample
from mcp_infra.core.fidelity import top_token


def _chat_body(
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
    stream: bool,
    model: str | None = None,
    top_logprobs: int = 0,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body["logprobs"] = True
        if top_logprobs:
            body["top_logprobs"] = top_logprobs
    return body


def _token_choices(
    entries: list[dict[str, Any]],
) -> tuple[list[int] | None, list[list[tuple[int, float]]] | None]:
    """(output token ids, each step's top log-probabilities) from a response's logprobs.

    With ``top_logprobs`` asked, mlx_lm.server 0.32.2 sends each step's top-k list in place of
    the chosen token (an entry's own ``id`` is then one of the list, not necessarily the one
    chosen): the greedy choice is the list's most likely token (``fidelity.top_token``). A
    runtime that lists no token ids (mlx_vlm.server names tokens by text) gives no lists."""
    tops = [e.get("top_logprobs") for e in entries]
    if entries and all(t and all("id" in x for x in t) for t in tops):
        lists = [
            sorted(((int(x["id"]), float(x["logprob"])) for x in t), key=lambda e: (-e[1], e[0]))
            for t in tops
            if t
        ]
        return [int(top_token(t)) for t in lists], lists  # type: ignore[arg-type]
    ids = [int(item["id"]) for item in entries] if all("id" in i for i in entries) else []
    return ids or None, None


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def served_model(base_url: str, timeout: float = 5.0) -> str | None:
    """The model a server says it has loaded, for servers that require it in every request.

    mlx_vlm.server answers ``/health`` with ``loaded_model`` and refuses a chat request without a
    matching ``model`` (HTTP 422; another name makes it load that model). mlx_lm.server's
    ``/health`` names none, and there a ``model`` field would make it load another model, so
    None means: send no ``model``. Asked before every request, because the scratch port serves a
    different candidate each time.
    """
    try:
        response = httpx.get(f"{base_url}/health", timeout=timeout)
        data = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    model = data.get("loaded_model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


class Labels(NamedTuple):
    """What a timed ``Sample`` is stamped with: whose it is, which prompt, repeat and order."""

    candidate: str
    prompt_id: str
    repeat: int = 0
    order: int = 0
    phase: str = "measure"


@dataclass
class _Streamed:
    """What an event stream said, as it came: the text, when its first and last pieces
    arrived, the usage and the finish reason."""

    parts: list[str] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish: str | None = None

    def read(self, lines: Iterator[str]) -> None:
        for line in lines:
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            chunk = json.loads(payload)
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                piece = (delta.get("content") or "") + (delta.get("reasoning") or "")
                if piece:
                    now = time.perf_counter()
                    self.first = self.first if self.first is not None else now
                    self.last = now
                    self.parts.append(piece)
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]


def stream_chat(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    max_tokens: int,
    timeout: float,
    labels: Labels,
    model: str | None = None,
) -> Sample:
    """Send one streamed chat request and time it: TTFT, decode tok/s, end-to-end tok/s.

    ``model`` defaults to what the server reports loaded (``served_model``), if anything."""
    body = _chat_body(messages, max_tokens, True, model or served_model(base_url))
    fields: dict[str, Any] = labels._asdict()
    seen = _Streamed()
    start = time.perf_counter()
    try:
        with httpx.stream(
            "POST",
            f"{base_url}/v1/chat/completions",
            json=body,
            timeout=httpx.Timeout(timeout, connect=5.0),
        ) as response:
            if response.status_code != 200:
                response.read()
                return Sample(**fields, error=f"HTTP {response.status_code}: {response.text[:200]}")
            seen.read(response.iter_lines())
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        return Sample(**fields, text="".join(seen.parts), error=_short_error(exc))
    end = time.perf_counter()
    completion = seen.usage.get("completion_tokens")
    cached = (seen.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    first = seen.first
    if first is None or not completion:
        return Sample(**fields, error="no tokens streamed", finish_reason=seen.finish)
    decode_s = (seen.last or first) - first
    decode_tps = (completion - 1) / decode_s if completion > 1 and decode_s > 0 else None
    return Sample(
        **fields,
        prompt_tokens=seen.usage.get("prompt_tokens"),
        completion_tokens=completion,
        cached_tokens=cached,
        ttft_s=first - start,
        decode_s=decode_s,
        decode_tps=decode_tps,
        e2e_s=end - start,
        e2e_tps=completion / (end - start) if end > start else None,
        finish_reason=seen.finish,
        text="".join(seen.parts),
    )


# stream_chat's request parameters, for the one untimed greedy answer the gates compare.
def greedy_chat(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    max_tokens: int,
    timeout: float,
    candidate: str,
    prompt_id: str,
    phase: str = "measure",
    top_logprobs: int = 0,
) -> Sample:
    """One non-streamed greedy request returning the output token ids (for the equality gate)
    and, with ``top_logprobs``, each step's most likely tokens (for the lossy budget's measure;
    an empty list where the runtime gave none).

    Servers whose logprobs carry no token ids (mlx_vlm.server) give ``token_ids=None``, and the
    gate then compares texts."""
    body = _chat_body(messages, max_tokens, False, served_model(base_url), top_logprobs)
    fields: dict[str, Any] = {
        "candidate": candidate,
        "prompt_id": prompt_id,
        "repeat": 0,
        "phase": phase,
    }
    start = time.perf_counter()
    try:
        response = httpx.post(
            f"{base_url}/v1/chat/completions",
            json=body,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )
    except httpx.HTTPError as exc:
        return Sample(**fields, error=_short_error(exc))
    end = time.perf_counter()
    if response.status_code != 200:
        return Sample(**fields, error=f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        body = response.json()
        choice = body["choices"][0]
        text = (choice.get("message") or {}).get("content") or ""
        entries = (choice.get("logprobs") or {}).get("content") or []
        ids, tops = _token_choices(entries)
        usage = body.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Sample(**fields, error=f"unexpected response: {_short_error(exc)}")
    return Sample(
        **fields,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        e2e_s=end - start,
        finish_reason=choice.get("finish_reason"),
        text=text,
        token_ids=ids,
        top_logprobs=(tops or []) if top_logprobs else None,
    )


def measurement_order(prompt_ids: Sequence[str], repeats: int, seed: int) -> list[tuple[int, str]]:
    """(repeat, prompt id) pairs: each repeat visits every prompt, in a seeded shuffled order."""
    rng = random.Random(seed)
    order: list[tuple[int, str]] = []
    for repeat in range(repeats):
        ids = list(prompt_ids)
        rng.shuffle(ids)
        order.extend((repeat, pid) for pid in ids)
    return order


def with_nonce(messages: Sequence[dict[str, Any]], nonce: str) -> list[dict[str, Any]]:
    """The same conversation, opened by a unique tag, so no timed request reuses a cached prompt
    prefix beyond the chat template's first tokens (the server's prompt cache then cannot make a
    repeat look faster than a fresh request)."""
    tag = f"[request {nonce}]"
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{tag} {out[0].get('content', '')}"
        return out
    return [{"role": "system", "content": tag}, *out]
