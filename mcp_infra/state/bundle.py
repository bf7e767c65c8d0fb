"""A sealed bundle as ``evidence verify`` reads it: its files, loaded lazily (a broken file fails
only the checks that need it), its selection runs, the verdict this code reaches on them, and
what a check raises (``Failed``, ``Skipped``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mcp_infra.contracts import (
    CandidateRun,
    CycleSummary,
    DsseEnvelope,
    Event,
    EvidencePredicate,
    FrozenPlan,
    InTotoStatement,
    Policy,
    Verdict,
)
from mcp_infra.state import signing
from mcp_infra.state.filecache import load_yaml
from mcp_infra.state.store import CycleFiles, read_journal_file, read_model, read_optional


def load_runs(bundle: Path) -> tuple[CandidateRun | None, list[CandidateRun]]:
    runs_dir = CycleFiles(bundle).runs
    baseline = None
    others: dict[str, CandidateRun] = {}
    for path in sorted(runs_dir.glob("*.json")) if runs_dir.is_dir() else []:
        run = read_model(path, CandidateRun)
        if run.purpose != "selection":  # held-out and live runs never feed the selector
            continue
        if run.candidate == "baseline":
            baseline = run
        else:
            others[run.candidate] = run
    return baseline, list(others.values())


def recompute(bundle: Path) -> Verdict | None:
    """The verdict the selector reaches from the bundle's raw samples and frozen plan (a
    screened plan's with its screening recomputed, busy starts read against the bundled
    policy's line)."""
    from mcp_infra.core.screening import decide, screens

    plan = read_model(CycleFiles(bundle).plan, FrozenPlan)
    baseline, runs = load_runs(bundle)
    if baseline is None:
        return None
    order = {c: i for i, c in enumerate(plan.candidates)}
    runs.sort(key=lambda r: order.get(r.candidate, len(order)))
    return decide(baseline, runs, plan, screened=screens(plan), busy_line=busy_line(bundle))


def busy_line(bundle: Path) -> float:
    """The share of the CPUs taken above which the cycle counted a start as busy: the bundled
    policy's (``core.machine.busy_fraction``), else the code's default."""
    from mcp_infra.core.machine import BUSY_CPU_FRACTION, busy_fraction

    path = bundle / "inputs" / "policy.yaml"
    if not path.is_file():
        return BUSY_CPU_FRACTION
    return busy_fraction(Policy.model_validate(load_yaml(path)).service)


class Failed(Exception):
    """A check failed, with the reason."""


class Skipped(Exception):
    """A check could not apply to this bundle, with the reason."""


class Bundle:
    """A bundle's files, read lazily; a broken file fails the checks that need it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: dict[str, object] = {}

    def _get(self, name: str, load: Callable[[], object]) -> object:
        if name not in self._cache:
            self._cache[name] = load()
        return self._cache[name]

    def plan(self) -> FrozenPlan:
        return self._get("plan", lambda: read_model(self.path / "plan.json", FrozenPlan))  # type: ignore[return-value]

    def verdict(self) -> Verdict | None:
        return self._get("verdict", lambda: read_optional(self.path / "verdict.json", Verdict))  # type: ignore[return-value]

    def summary(self) -> CycleSummary:
        return self._get("summary", lambda: read_model(self.path / "summary.json", CycleSummary))  # type: ignore[return-value]

    def events(self) -> list[Event]:
        return self._get("events", lambda: read_journal_file(self.path / "journal.ndjson")[0])  # type: ignore[return-value]

    def runs(self) -> list[CandidateRun]:
        def load() -> list[CandidateRun]:
            folder = self.path / "runs"
            return (
                [read_model(p, CandidateRun) for p in sorted(folder.glob("*.json"))]
                if folder.is_dir()
                else []
            )

        return self._get("runs", load)  # type: ignore[return-value]

    def envelope(self) -> DsseEnvelope:
        SIGNATURE = CycleFiles.SIGNATURE

        return self._get("envelope", lambda: read_model(self.path / SIGNATURE, DsseEnvelope))  # type: ignore[return-value]

    def statement(self) -> InTotoStatement:
        def load() -> InTotoStatement:
            return InTotoStatement.model_validate_json(signing.payload_of(self.envelope()))

        return self._get("statement", load)  # type: ignore[return-value]

    def predicate(self) -> EvidencePredicate:
        try:
            return self.statement().predicate
        except FileNotFoundError as exc:
            raise Failed("the bundle is not signed (no SIGNATURE.dsse.json)") from exc


def fail_on(problems: list[str]) -> None:
    """A check fails with every problem it found, in one detail."""
    if problems:
        raise Failed("; ".join(problems))
