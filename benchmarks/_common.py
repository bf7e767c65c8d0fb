"""What every benchmark shares: its command line and how it prints its results.

Each script prints one table for a person; with ``--json`` its last line of standard output is
one JSON object with the same figures. ``--smoke`` is the smallest real run of the same code
(tests/project/test_benchmarks.py runs it), too small to judge any target by.

A script imports this module first: it keeps the run offline before anything reaches the
Hugging Face hub client.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOKE_HELP = (
    "the smallest real run of the same code (what the test suite runs): too small to judge a "
    "speed or decision target by"
)
# What a smoke run's cycles measure on top of the lean `test` policy (mcp_infra.demo.homes): the
# fewest starts, requests and tokens a cycle accepts, so that it goes through every state
# quickly (one start per configuration and one timed request per held-out prompt: a smoke proves
# the script runs, not what it measures).
SMOKE_PROTOCOL: dict[str, object] = {
    "repeats": 1,
    "heldout_repeats": 1,
    "warmup": 0,
    "max_tokens": 8,
    "bootstrap_resamples": 100,
    "min_starts": 1,
    "max_starts": 1,
}


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's parser: its docstring as the help text, with --json and --smoke."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return ap


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """``rows`` as an aligned text table; ``columns`` are (key, heading) pairs."""
    cells = [[heading for _, heading in columns]]
    cells += [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def emit(result: dict[str, Any], as_json: bool) -> None:
    """The JSON line, when asked for (after the table, so it is the last line)."""
    if as_json:
        print(json.dumps(result, default=str), flush=True)
