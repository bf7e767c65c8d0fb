"""Faults made at the moment a cycle reaches a state: a thread watches the journal the
supervisor writes and acts as soon as a matching line is durable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mcp_infra.contracts import Event
from mcp_infra.state.store import Home


@contextmanager
def on_journal(
    home: Home,
    when: Callable[[Event], bool],
    action: Callable[[], None],
    *,
    every_cycle: bool = False,
) -> Iterator[list[str]]:
    """Run ``action`` as soon as a journal line matching ``when`` is durable (once, or once per
    cycle); yields the ids of the cycles it acted in."""
    acted: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for folder in sorted(home.cycles.iterdir()) if home.cycles.is_dir() else []:
                if folder.name in acted or (acted and not every_cycle):
                    continue
                if any(when(e) for e in home.read_journal(folder.name)[0]):
                    action()
                    acted.append(folder.name)
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield acted
    finally:
        done.set()
        thread.join(timeout=10)
