"""Which gates a candidate faces, run in a fixed order: token identity for a lossless candidate
(or a runtime upgrade whose tokens all match), the lossy budget's (core.budget) for a lossy one,
then smoke and memory for all. The gates themselves are ``core.gates``; the selector judges on
what these return.
"""

from __future__ import annotations

from mcp_infra.contracts import (
    CandidateClass,
    CandidateRun,
    EffectiveThresholds,
    GateResult,
    MeasureProtocol,
    Sample,
    Semantics,
)
from mcp_infra.core.budget import QualityOutputs, Resampling, lossy_gates, resampling_for
from mcp_infra.core.gates import compare_greedy, smoke_gate


def run_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    quality: dict[str, list[Sample]] | None,
    quality_suite: str | None = None,
    *,
    draws: Resampling | None = None,
) -> list[GateResult]:
    """Every gate that applies to ``run``, in a fixed order.

    A lossy candidate gets the lossy budget's gates (core.budget; ``draws`` says how the measure's
    intervals, by default as the protocol's defaults would): agreement, and quality when a
    quality suite was run: the protocol names one, ``quality`` was given, or the run carries
    ``quality`` samples. A suite that ran but left no output for the candidate fails the gate
    rather than being skipped.
    """
    gates: list[GateResult] = []
    identity = runtime_identity(baseline, run)
    if run.semantics == Semantics.LOSSLESS:
        gates.append(compare_greedy(baseline.greedy, run.greedy))
    elif identity is not None and identity.passed:
        gates.append(identity)  # a runtime upgrade whose greedy tokens all match: lossless
    else:
        outputs = _quality_outputs(run, quality)
        ran = outputs is not None or quality_suite is not None
        both = QualityOutputs(_quality_outputs(baseline, quality) or [], outputs or [])
        note = f"not lossless: {identity.detail}" if identity is not None else ""
        draws = draws or resampling_for(MeasureProtocol(), run.candidate)
        gates += lossy_gates(baseline, run, thresholds, draws, both if ran else None, note)
    gates.append(smoke_gate(_smoke_outputs(baseline), _smoke_outputs(run)))
    gates.append(_memory_gate(run, thresholds.max_peak_memory_gb))
    return gates


def runtime_identity(baseline: CandidateRun, run: CandidateRun) -> GateResult | None:
    """A runtime upgrade declared lossy (so measured with the quality suite) is lossless after
    all when its greedy tokens all equal the baseline's: then the token-identity gate judges it
    and the quality suite is not needed; otherwise it is judged as lossy, its first divergence
    reported. None for every other candidate."""
    if run.candidate_class != CandidateClass.RUNTIME_UPGRADE or run.semantics != Semantics.LOSSY:
        return None
    return compare_greedy(baseline.greedy, run.greedy)


def failed_gates(
    baseline: CandidateRun,
    run: CandidateRun,
    thresholds: EffectiveThresholds,
    protocol: MeasureProtocol,
) -> list[GateResult]:
    """The gates ``run`` already fails. A gate (token identity, agreement, quality, smoke,
    memory) judges outputs that do not get better with more starts, so early stopping may
    reject on it after the first round, before any speed decision is due."""
    if not run.started or not run.greedy or not baseline.greedy:
        return []
    return [
        g
        for g in run_gates(
            baseline,
            run,
            thresholds,
            None,
            protocol.quality_suite,
            draws=resampling_for(protocol, run.candidate),
        )
        if not g.passed
    ]


def _quality_outputs(
    run: CandidateRun, quality: dict[str, list[Sample]] | None
) -> list[Sample] | None:
    """The run's quality-suite samples: ``quality[candidate]`` if given, else the run's own.

    Returns None when there is no sign that a quality suite ran.
    """
    if quality is not None and run.candidate in quality:
        return list(quality[run.candidate])
    own = [s for s in run.samples if s.phase == "quality"]
    if own or quality is not None:
        return own
    return None


def _smoke_outputs(run: CandidateRun) -> list[Sample]:
    """Greedy outputs when there are any, else the measured ones (same prompts, temperature 0)."""
    return list(run.greedy) or [s for s in run.samples if s.phase == "measure"]


def _memory_gate(run: CandidateRun, cap_gb: float) -> GateResult:
    if run.peak_memory_gb is None:
        return GateResult(
            gate="memory",
            passed=True,
            detail=f"peak memory unknown; the {cap_gb:g} GB cap could not be checked",
        )
    passed = run.peak_memory_gb <= cap_gb
    verb = "within" if passed else "above"
    return GateResult(
        gate="memory",
        passed=passed,
        detail=f"peak memory {run.peak_memory_gb:.2f} GB is {verb} the {cap_gb:g} GB cap",
    )
