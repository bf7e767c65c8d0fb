"""Mixed client traffic for the front's stable port: short and long answers, streamed and not,
streams the client leaves after its first events, and model listings, sent back to back by a
few clients until stopped; paused (every client idle, its connection closed) for a reading of
the front. For `benchmarks/soak.py` and `benchmarks/faults.py`; loopback only, each request
bounded by a 120 s timeout.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx

from mcp_infra.demo.frontkit import CHAT, chat_body

KINDS = ("short_stream", "long_plain", "leave", "short_plain", "long_stream", "models")
TOKENS = {"short": 8, "long": 96, "leave": 256}
LEAVE_AFTER_EVENTS = 3  # a leaving client closes its connection after this many events
PROMPTS = (
    "Tell me about harbours.",
    "Write a short poem about rain.",
    "List three prime numbers and explain why.",
    "What is a lighthouse for?",
)
CLIENT_TIMEOUT_S = 120.0
PAUSE_TIMEOUT_S = CLIENT_TIMEOUT_S + 30


@dataclass
class Failure:
    at_s: float
    kind: str
    why: str


@dataclass
class Traffic:
    """``workers`` clients sending requests back to back to ``base`` until stopped; paused
    (every client idle, its connection closed) for a checkpoint."""

    base: str
    workers: int
    started: float = field(default_factory=time.monotonic)
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    left: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    running: bool = True
    stopped: bool = False
    busy: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(self.workers):
            thread = threading.Thread(target=self._worker, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _turn(self) -> bool:
        """Wait while paused; False once stopped."""
        with self.cond:
            while not self.running and not self.stopped:
                self.cond.wait()
            if self.stopped:
                return False
            self.busy += 1
            return True

    def _idle(self) -> None:
        with self.cond:
            self.busy -= 1
            self.cond.notify_all()

    def _worker(self, index: int) -> None:
        keep_alive = index % 2 == 0
        kinds = itertools.islice(itertools.cycle(KINDS), index, None)
        prompts = itertools.islice(itertools.cycle(PROMPTS), index, None)
        client: httpx.Client | None = None
        while self._turn():
            try:
                if client is None:
                    limits = httpx.Limits(max_keepalive_connections=1 if keep_alive else 0)
                    client = httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=limits, trust_env=False)
                kind = next(kinds)
                why = self._one(client, kind, next(prompts))
                with self.cond:
                    self.counts[kind] = self.counts.get(kind, 0) + 1
                    if why == "left":
                        self.left += 1
                    elif why:
                        at = round(time.monotonic() - self.started, 1)
                        self.failures.append(Failure(at, kind, why[:200]))
                if not self.running:  # a checkpoint: no connection stays open through it
                    client.close()
                    client = None
            finally:
                self._idle()
        if client is not None:
            client.close()

    def _one(self, client: httpx.Client, kind: str, prompt: str) -> str:
        """One request; what went wrong ("" when nothing did, "left" for a client that left
        on purpose after its first events)."""
        if kind == "models":
            try:
                answer = client.get(self.base + "/v1/models")
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"
            return "" if answer.status_code == 200 else f"HTTP {answer.status_code}"
        size = "leave" if kind == "leave" else kind.split("_")[0]
        streamed = kind.endswith("stream") or kind == "leave"
        body = chat_body(TOKENS[size], streamed, prompt)
        try:
            if not streamed:
                answer = client.post(self.base + CHAT, json=body)
                if answer.status_code != 200:
                    return f"HTTP {answer.status_code}"
                choices = answer.json().get("choices")
                return "" if choices and "message" in choices[0] else "not a chat completion"
            return self._stream(client, body, leave=kind == "leave")
        except (httpx.HTTPError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _stream(self, client: httpx.Client, body: dict[str, Any], *, leave: bool) -> str:
        events = 0
        with client.stream("POST", self.base + CHAT, json=body) as answer:
            if answer.status_code != 200:
                return f"HTTP {answer.status_code}"
            for line in answer.iter_lines():
                if line.startswith("data: {") and '"error"' in line[:20]:
                    return "error event: " + line[6:200]
                if line.strip() == "data: [DONE]":
                    return ""
                if line.startswith("data: "):
                    events += 1
                    if leave and events >= LEAVE_AFTER_EVENTS:
                        return "left"  # closing the stream here closes the connection
        return "stream ended without [DONE]"

    def pause(self) -> bool:
        """Let every client finish its request; True once all are idle."""
        with self.cond:
            self.running = False
            return self.cond.wait_for(lambda: self.busy == 0, PAUSE_TIMEOUT_S)

    def resume(self) -> None:
        with self.cond:
            self.running = True
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(PAUSE_TIMEOUT_S)

    def total(self) -> int:
        with self.cond:
            return sum(self.counts.values())
