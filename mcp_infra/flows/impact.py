"""The cycle's effect on the stable endpoint: which memory mode it runs in, what downtime that
implies, and what the front counted while it ran (``cycles/<id>/service_impact.json``).

Admission itself is the pure ``core.admission.admit``; this module gathers its inputs (the
manifest's figures, recipe memory's measured peaks, the live backend's measured footprint).
"""

from __future__ import annotations

import contextlib

import psutil

from mcp_infra.contracts import Manifest, Part, Policy, ProcessRecord, ServiceImpact, Variant
from mcp_infra.core.admission import (
    Admission,
    Mode,
    admit,
    combine,
    expected_downtime_s,
)
from mcp_infra.core.distributed import local_ranks
from mcp_infra.procs.front import fresh_status, front_status, read_route, set_route
from mcp_infra.procs.runtime import is_running
from mcp_infra.state import memory
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, read_optional, write_model

IMPACT_FILE = "service_impact.json"


def footprint_gb(record: ProcessRecord | None) -> float | None:
    """Resident memory of a running backend's process tree now (measured, not declared)."""
    if record is None or not is_running(record):
        return None
    total = 0
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        root = psutil.Process(record.pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_info().rss
    return round(total / 2**30, 3)


def expected_peak_gb(
    home: Home, manifest: Manifest, variant: Variant, candidate: str
) -> tuple[float | None, str]:
    """A measured peak from recipe memory if one exists, else the manifest's own figure."""
    with contextlib.suppress(Exception):
        peaks = [o.peak_memory_gb for o in memory.outcomes(home, candidate) if o.peak_memory_gb]
        if peaks:
            return max(peaks), "measured in an earlier cycle (recipe memory)"
    declared = manifest.resources.memory_gb or manifest.max_peak_memory_gb
    if declared and variant.knobs.ranks:  # one rank's need, times the ranks on this machine
        with contextlib.suppress(Exception):
            here = local_ranks(load_config(home).distributed.hosts, variant.knobs.ranks)
            return declared * here, f"manifest resources.memory_gb x {here} rank(s) here"
    return (declared, "manifest resources.memory_gb") if declared else (None, "unknown")


def plan_admission(
    home: Home,
    policy: Policy,
    live: ProcessRecord | None,
    found: list[tuple[str, Manifest, Variant]],
) -> Admission:
    """One mode for a plan: concurrent only if every candidate fits beside the live backend."""
    total = psutil.virtual_memory().total / 2**30
    live_gb = footprint_gb(live)
    items = []
    for candidate, manifest, variant in found:
        peak, source = expected_peak_gb(home, manifest, variant, candidate)
        items.append(
            admit(
                peak,
                live_gb,
                total,
                policy.service.memory_budget_fraction,
                peak_source=f"{candidate}: {source}",
                live_source="measured RSS" if live_gb is not None else "not running",
            )
        )
    return combine(items) or admit(0.0, live_gb, total, policy.service.memory_budget_fraction)


def downtime_words(mode: Mode, expected_s: float, max_hold_s: float) -> str:
    if mode == "concurrent":
        return (
            "none expected: candidates run beside the live backend on ports of their own, "
            "and a promotion switches the front between two running backends"
        )
    return (
        f"about {expected_s:.0f} s without a serving backend (the live backend is stopped "
        f"while candidates run): the front holds requests up to {max_hold_s:.0f} s, then "
        "answers 503 with Retry-After"
    )


def begin(home: Home, cycle_id: str) -> None:
    """Count this cycle's traffic in the front from now on (its scoped counters reset)."""
    route = read_route(home)
    if route is not None:
        set_route(
            home,
            mode=route.mode,
            backend_url=route.backend_url if route.mode == "serve" else None,
            candidate_id=route.candidate_id,
            scope=cycle_id,
            reason=f"cycle {cycle_id} begins",
        )
    status = front_status(home)
    write_model(
        home.cycle_dir(cycle_id) / IMPACT_FILE,
        ServiceImpact(
            mode="concurrent",
            expected_downtime_s=0.0,
            mode_reason="not decided yet",
            note=f"front pid {status.pid}" if status else "no front running at the cycle's start",
        ),
    )


def decided(home: Home, cycle_id: str, admission: Admission, expected_s: float) -> None:
    path = home.cycle_dir(cycle_id) / IMPACT_FILE
    impact = read_optional(path, ServiceImpact) or ServiceImpact(
        mode="concurrent", expected_downtime_s=0.0
    )
    write_model(
        path,
        impact.model_copy(
            update={
                "mode": admission.mode,
                "mode_reason": admission.reason[:500],
                "expected_downtime_s": expected_s,
            }
        ),
    )


def promotion(home: Home, cycle_id: str, admission: Admission) -> None:
    """Record how the winner is swapped in (an approval cycle starts counting here)."""
    path = home.cycle_dir(cycle_id) / IMPACT_FILE
    if not path.exists():
        begin(home, cycle_id)
        decided(home, cycle_id, admission.model_copy(update={"mode": "concurrent"}), 0.0)
    impact = read_optional(path, ServiceImpact)
    if impact is not None:
        write_model(path, impact.model_copy(update={"promotion_mode": admission.mode}))


def finish(home: Home, cycle_id: str) -> ServiceImpact:
    """Fill in what the front counted for this cycle's scope."""
    path = home.cycle_dir(cycle_id) / IMPACT_FILE
    impact = read_optional(path, ServiceImpact) or ServiceImpact(
        mode="concurrent",
        expected_downtime_s=0.0,
        mode_reason="the cycle ended before the memory mode was decided",
    )
    status = fresh_status(home, timeout=2.5)
    if status is None or status.scope != cycle_id:
        impact = impact.model_copy(
            update={
                "note": (impact.note + "; the front's counters for this cycle are not available")[
                    :500
                ]
            }
        )
    else:
        c = status.scoped
        restarted = bool(
            impact.note.startswith("front pid ") and impact.note.split()[2] != str(status.pid)
        )
        impact = impact.model_copy(
            update={
                "unserved_s": c.unserved_s,
                "requests_held": c.held,
                "longest_hold_s": c.longest_hold_s,
                "rejected_503": c.rejected_503,
                "upstream_errors": c.upstream_errors,
                "live_requests": c.live_requests,
                "front_restarted": restarted,
            }
        )
    write_model(path, impact)
    return impact


class Preview(Part):
    """What a plan would do to the stable endpoint, said before it is queued."""

    memory_mode: Mode
    memory_mode_reason: str
    expected_downtime_s: float
    downtime_note: str


def preview(
    home: Home,
    policy: Policy,
    candidates: list[str],
    manifests: dict[str, Manifest] | None = None,
) -> Preview | None:
    """The memory mode a plan would run in now, and the downtime it implies (a lower bound in
    exclusive mode: each candidate's measurement time adds to it, known only once it runs).
    ``manifests``: the home's, when the caller has them loaded (``HomeContext.manifests``)."""
    from mcp_infra.core.preflight import find_candidate
    from mcp_infra.state.context import HomeContext, service_record

    manifests = manifests if manifests is not None else HomeContext(home).manifests
    found = [(c, *hit) for c in candidates if (hit := find_candidate(manifests, c))]
    if not found:
        return None
    live = service_record(home) if home.config.exists() else None
    admission = plan_admission(home, policy, live, found)
    load_s = live.ready_s if live and live.ready_s else None
    if admission.mode == "concurrent":
        return Preview(
            memory_mode="concurrent",
            memory_mode_reason=admission.reason,
            expected_downtime_s=0.0,
            downtime_note=downtime_words("concurrent", 0.0, policy.service.max_hold_s),
        )
    bound = load_s if load_s is not None else policy.protocol.ready_timeout_s
    expected = expected_downtime_s(
        "exclusive", candidates=len(found), per_candidate_s=0.0, load_s=bound
    )
    how = (
        f"the live backend loaded in {load_s:.1f} s when it last started"
        if load_s is not None
        else f"load time unknown: the policy's ready timeout ({bound:.0f} s) is used"
    )
    return Preview(
        memory_mode="exclusive",
        memory_mode_reason=admission.reason,
        expected_downtime_s=expected,
        downtime_note=f"at least {expected:.0f} s without a serving backend ({how}; "
        "plus each candidate's measurement time); the front holds requests up to "
        f"{policy.service.max_hold_s:.0f} s, then answers 503 with Retry-After",
    )
