"""The report's data binding: what it reads from a bundle, and how a figure is bound to its source.

Every figure on the page is one the bundle states: the verdict's own estimates and intervals (no
second statistics path), the run files' per-cell figures, the held-out check as the cycle's own
code reaches it from ``runs/heldout--*.json`` (and only where that matches the journal), cost,
service impact and the verification. ``Sources`` binds each figure to where it comes from: an
element with ``data-src`` (``<file>#<JSON pointer>``) and ``data-fmt`` (a key of ``FORMATS``),
so a test, or a reader, can check every number against its source.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_infra.contracts import (
    CandidateRun,
    CycleCost,
    CycleSummary,
    EnvironmentFingerprint,
    FrozenPlan,
    ServiceImpact,
    Verdict,
)
from mcp_infra.state.store import CycleFiles, read_model, read_optional

NONE = "–"  # a figure the source holds as null

FORMATS: dict[str, Callable[[Any], str]] = {
    "x3": lambda v: f"{v:.3f}×",
    "pct2": lambda v: f"{v:+.2f}%",  # a percent change already in percent (summary.json)
    "pct1": lambda v: f"{v:.1f}%",
    "level": lambda v: f"{v * 100:.1f}%",  # a confidence, 0.955 → 95.5%
    "required": lambda v: f"{1 + v / 100:.3f}×",  # a minimum speedup in percent, as a ratio
    "tolerance": lambda v: f"{1 - v / 100:.3f}×",  # a largest slowdown in percent, as a ratio
    "tps": lambda v: f"{v:.1f}",
    "s3": lambda v: f"{v:.3f} s",
    "s2": lambda v: f"{v:.2f} s",
    "s1": lambda v: f"{v:.1f} s",
    "gb": lambda v: f"{v:.2f} GB",
    "j1": lambda v: f"{v:.1f} J",
    "int": lambda v: f"{int(v)}",
    "utc": lambda v: f"{v[:10]} {v[11:19]} UTC",  # an ISO 8601 time, to the second
}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def pointer(doc: str, *path: object) -> str:
    """``doc#/a/0/b`` (RFC 6901: ``~`` and ``/`` inside a key escaped as ``~0`` and ``~1``)."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return doc + "#/" + "/".join(parts)


def resolve(docs: dict[str, Any], ref: str) -> Any:
    doc, _, path = ref.partition("#")
    value = docs[doc]
    for token in path.split("/")[1:] if path else []:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    return value


@dataclass
class Sources:
    """The documents a page's figures come from, by name (a bundle file, or ``verification``,
    ``heldout`` and ``bundle`` for what the page was given or recomputed), and the markup that
    binds a figure to its source."""

    docs: dict[str, Any] = field(default_factory=dict)

    def get(self, ref: str) -> Any:
        return resolve(self.docs, ref)

    def num(self, ref: str, fmt: str, cls: str = "") -> str:
        value = self.get(ref)
        shown = NONE if value is None else FORMATS[fmt](value)
        klass = f" class='{cls}'" if cls else ""
        return f"<span{klass} data-src='{esc(ref)}' data-fmt='{fmt}'>{esc(shown)}</span>"

    def text(self, ref: str, limit: int | None = None, code: bool = False) -> str:
        value = self.get(ref)
        shown = NONE if value is None else str(value)
        trunc = ""
        if limit is not None and len(shown) > limit:
            shown, trunc = shown[:limit] + "…", f" data-trunc='{limit}'"
        tag = "code" if code else "span"
        return f"<{tag} data-src='{esc(ref)}'{trunc}>{esc(shown)}</{tag}>"

    def key(self, ref: str, code: bool = False) -> str:
        """The last key of ``ref`` itself (a dict's key, e.g. a model path), bound to it."""
        self.get(ref)
        shown = ref.rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
        tag = "code" if code else "span"
        return f"<{tag} data-src='{esc(ref)}' data-part='key'>{esc(shown)}</{tag}>"

    def has(self, ref: str) -> bool:
        try:
            return self.get(ref) is not None
        except (KeyError, IndexError, ValueError, TypeError):
            return False


# ---------------------------------------------------------------------------------------------
# What the page reads
# ---------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    bundle: Path
    summary: CycleSummary
    verdict: Verdict | None
    plan: FrozenPlan | None
    cost: CycleCost | None
    impact: ServiceImpact | None
    env: EnvironmentFingerprint | None
    runs: dict[str, tuple[str, CandidateRun]]  # selection runs by candidate: (doc name, run)
    heldout: dict[str, tuple[str, CandidateRun]]
    journal: list[dict[str, Any]]
    src: Sources


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", by_alias=True)


def load(bundle: Path, verification: Any | None) -> Loaded:
    files = CycleFiles(bundle)
    summary = read_optional(files.summary, CycleSummary)
    if summary is None:
        raise FileNotFoundError(f"{bundle} has no summary.json")
    verdict = read_optional(files.verdict, Verdict)
    plan = read_optional(files.plan, FrozenPlan)
    cost = read_optional(bundle / "cost.json", CycleCost)
    impact = read_optional(bundle / "service_impact.json", ServiceImpact)
    env = read_optional(files.environment, EnvironmentFingerprint)
    docs: dict[str, Any] = {
        "summary.json": _dump(summary),
        "verdict.json": _dump(verdict),
        "plan.json": _dump(plan),
        "cost.json": _dump(cost),
        "service_impact.json": _dump(impact),
        "environment.json": _dump(env),
        "verification": _dump(verification),
        "bundle": {"path": str(bundle)},
    }
    runs: dict[str, tuple[str, CandidateRun]] = {}
    heldout: dict[str, tuple[str, CandidateRun]] = {}
    for path in sorted(files.runs.glob("*.json")) if files.runs.is_dir() else []:
        run = read_model(path, CandidateRun)
        name = f"runs/{path.name}"
        docs[name] = _dump(run)
        if run.purpose == "selection":
            runs[run.candidate] = (name, run)
        elif run.purpose == "heldout":
            heldout[run.candidate] = (name, run)
    journal: list[dict[str, Any]] = []
    if files.journal.is_file():
        for line in files.journal.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    journal.append(json.loads(line))
                except ValueError:
                    journal.append({})
    docs["journal.ndjson"] = journal
    return Loaded(
        bundle, summary, verdict, plan, cost, impact, env, runs, heldout, journal, Sources(docs)
    )


@dataclass
class HeldOut:
    """The held-out check: the journal's record of it and, where the cycle's own code run again
    on the held-out run files reaches the same words, its figures (doc ``heldout``)."""

    candidate: str
    candidate_ref: str
    passed: bool
    journal_ref: str
    figures: bool  # the recomputed verdict is in the sources and matches the journal
    why_not: str = ""


def heldout_check(data: Loaded) -> HeldOut | None:
    """Find the journal's held-out record and re-derive its figures with the cycle's code."""
    index = next(
        (
            i
            for i, e in reversed(list(enumerate(data.journal)))
            if e.get("state") == "SELECT"
            and (e.get("fields") or {}).get("step") in ("heldout-passed", "heldout-failed")
        ),
        None,
    )
    if index is None:
        return None
    event = data.journal[index]
    candidate = str(event["fields"].get("candidate"))
    held = HeldOut(
        candidate=candidate,
        candidate_ref=pointer("journal.ndjson", index, "fields", "candidate"),
        passed=event["fields"]["step"] == "heldout-passed",
        journal_ref=pointer("journal.ndjson", index, "message"),
        figures=False,
    )
    if data.plan is None or data.verdict is None:
        held.why_not = "the bundle has no plan or verdict to re-derive it from"
        return held
    from mcp_infra.core.selector import DECISION_METHOD, select
    from mcp_infra.flows.confirm import as_measured, heldout_protocol

    if data.verdict.method != DECISION_METHOD:
        held.why_not = "the verdict was reached by another decision method than this mcp-infra's"
        return held
    base, win = data.heldout.get("baseline"), data.heldout.get(candidate)
    if base is None or win is None:
        held.why_not = "the held-out run files are not in the bundle"
        return held
    again = select(
        as_measured(base[1]),
        [as_measured(win[1])],
        data.plan.thresholds,
        heldout_protocol(data.plan.protocol),
        data.plan.auto_promote,
        confirmation=True,
    )
    (judged,) = again.candidates
    words = " ".join(judged.reasons)
    if event.get("message") not in (
        ("held-out prompts: " + words)[:1000],
        ("gain not seen on held-out prompts: " + words)[:1000],
    ):
        held.why_not = (
            "re-deriving it from the held-out run files does not give the journal's words"
        )
        return held
    data.src.docs["heldout"] = _dump(again)
    held.figures = True
    return held


# ---------------------------------------------------------------------------------------------
# How a candidate is drawn, and the workload cells
# ---------------------------------------------------------------------------------------------


def status_of(data: Loaded, i: int) -> str:
    """selected | qualified | inconclusive | rejected: how a candidate is drawn."""
    assert data.verdict is not None
    item = data.verdict.candidates[i]
    if item.candidate == data.verdict.selected:
        return "selected"
    return item.decision.value


def failed_gates(data: Loaded, i: int) -> list[int]:
    assert data.verdict is not None
    return [j for j, g in enumerate(data.verdict.candidates[i].gates) if not g.passed]


def short_of(data: Loaded, i: int) -> str | None:
    """Which bar an inconclusive interval's lower end does not clear: "floor" (the A/A noise
    floor) or "threshold" (the required speedup), or None when it is another reason."""
    assert data.verdict is not None
    item = data.verdict.candidates[i]
    if item.ci_low is None:
        return None
    if item.noise_floor is not None and item.ci_low <= item.noise_floor:
        return "floor"
    if data.plan is not None and item.ci_low < 1 + data.plan.thresholds.min_speedup_pct / 100:
        return "threshold"
    return None


METRICS = (
    # label, key in a verdict cell (after candidate_/baseline_), key in a run file's cell, format
    ("aggregate output tok/s", "output_tps", "aggregate_tps", "tps"),
    ("TTFT p50", "ttft_p50_s", "ttft_p50_s", "s3"),
    ("TTFT p99", "ttft_p99_s", "ttft_p99_s", "s3"),
    ("decode tok/s", "decode_tps", "decode_tps", "tps"),
)


@dataclass
class CellRow:
    config: str
    status: str  # baseline | selected | qualified | inconclusive | rejected
    name_ref: str
    refs: dict[str, str]  # metric key → pointer (missing: not measured)
    concurrency_ref: str = ""
    ratio_ref: str | None = None  # aggregate ratio to the baseline
    ratio_low: str | None = None
    ratio_high: str | None = None
    decode_ratio_ref: str | None = None
    requests_ref: str | None = None
    source: str = ""


@dataclass
class Cell:
    request_class: str
    concurrency: int
    role: str
    headline: bool
    concurrency_ref: str
    rows: list[CellRow]


def _cell_keys(data: Loaded) -> list[tuple[str, int, str]]:
    keys: list[tuple[str, int, str]] = []
    for item in data.verdict.candidates if data.verdict else []:
        for c in item.cells:
            keys.append((c.request_class, c.concurrency, c.role))
    for _, run in [*data.runs.values()]:
        for f in run.cells:
            keys.append((f.request_class, f.concurrency, f.role))
    order: dict[tuple[str, int], int] = {
        (c.request_class, c.concurrency): i
        for i, c in enumerate(data.plan.protocol.workload if data.plan else [])
    }
    unique = list(dict.fromkeys(keys))
    return sorted(unique, key=lambda k: order.get((k[0], k[1]), len(order)))


def workload_cells(data: Loaded) -> list[Cell]:
    """Each workload cell's rows: the verdict's figures where the verdict judged the cell (the
    decisive ones), else the run files' (cells measured and reported, not decided on)."""
    cells = []
    for request_class, concurrency, role in _cell_keys(data):
        key = (request_class, concurrency)
        judged = _judged(data, key)
        rows = [*_baseline_row(data, key, judged)]
        for i in range(len(data.verdict.candidates) if data.verdict else 0):
            row = _verdict_row(data, i, judged[i]) if i in judged else _run_row(data, i, key)
            if row is not None:
                rows.append(row)
        concurrency_ref = next((r.concurrency_ref for r in rows if r.concurrency_ref), "")
        headline = bool(judged) and bool(data.src.get(_at_cell(*next(iter(judged.items())))))
        if rows and concurrency_ref:
            cells.append(Cell(request_class, concurrency, role, headline, concurrency_ref, rows))
    return cells


def _at_cell(i: int, j: int) -> str:
    return pointer("verdict.json", "candidates", i, "cells", j, "headline")


def _judged(data: Loaded, key: tuple[str, int]) -> dict[int, int]:
    """Candidate index → index of its verdict cell for ``key`` (request class, concurrency)."""
    return {
        i: j
        for i, item in enumerate(data.verdict.candidates if data.verdict else [])
        for j, c in enumerate(item.cells)
        if (c.request_class, c.concurrency) == key
    }


def _run_cell(run: CandidateRun, key: tuple[str, int]) -> int | None:
    return next(
        (j for j, f in enumerate(run.cells) if (f.request_class, f.concurrency) == key), None
    )


def _baseline_row(data: Loaded, key: tuple[str, int], judged: dict[int, int]) -> list[CellRow]:
    """The live recipe's row: from the verdict's cell where it judged this cell, else from the
    baseline's run file."""
    if judged:
        i = next(iter(judged))
        at = pointer("verdict.json", "candidates", i, "cells", judged[i])
        refs = {v: f"{at}/baseline_{v}" for _, v, _, _ in METRICS}
        return [
            CellRow(
                "baseline",
                "baseline",
                "",
                refs,
                f"{at}/concurrency",
                requests_ref=f"{at}/baseline_requests",
                source="verdict.json",
            )
        ]
    if "baseline" not in data.runs:
        return []
    doc, run = data.runs["baseline"]
    j = _run_cell(run, key)
    if j is None:
        return []
    at = pointer(doc, "cells", j)
    refs = {v: f"{at}/{r}" for _, v, r, _ in METRICS}
    return [
        CellRow(
            "baseline",
            "baseline",
            "",
            refs,
            f"{at}/concurrency",
            requests_ref=f"{at}/requests",
            source=doc,
        )
    ]


def _verdict_row(data: Loaded, i: int, j: int) -> CellRow:
    """A candidate's row of a cell the verdict judged: the verdict's own figures."""
    assert data.verdict is not None
    at = pointer("verdict.json", "candidates", i, "cells", j)
    return CellRow(
        data.verdict.candidates[i].candidate,
        status_of(data, i),
        pointer("verdict.json", "candidates", i, "candidate"),
        {v: f"{at}/candidate_{v}" for _, v, _, _ in METRICS},
        f"{at}/concurrency",
        ratio_ref=f"{at}/output_ratio",
        ratio_low=f"{at}/output_ci_low",
        ratio_high=f"{at}/output_ci_high",
        decode_ratio_ref=f"{at}/decode_speedup",
        requests_ref=f"{at}/candidate_requests",
        source="verdict.json",
    )


def _run_row(data: Loaded, i: int, key: tuple[str, int]) -> CellRow | None:
    """A candidate's row of a cell the verdict did not judge: its run file's own figures."""
    assert data.verdict is not None
    candidate = data.verdict.candidates[i].candidate
    if candidate not in data.runs:
        return None
    doc, run = data.runs[candidate]
    j = _run_cell(run, key)
    if j is None:
        return None
    at = pointer(doc, "cells", j)
    return CellRow(
        candidate,
        status_of(data, i),
        pointer("verdict.json", "candidates", i, "candidate"),
        {v: f"{at}/{r}" for _, v, r, _ in METRICS},
        f"{at}/concurrency",
        ratio_ref=f"{at}/aggregate_vs_baseline",
        decode_ratio_ref=f"{at}/decode_vs_baseline",
        requests_ref=f"{at}/requests",
        source=doc,
    )
