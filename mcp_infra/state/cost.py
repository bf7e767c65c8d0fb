"""The cost of a cycle (evidence/<id>/cost.json), from its journal and the usage readings.

Pure once the files are read: ``build`` takes the journal events, the usage readings, the
optional ``service_impact.json`` and the speedup, and says where each figure came from.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from mcp_infra.contracts import (
    CycleCost,
    CycleState,
    Event,
    JournalStep,
    JSONValue,
    ProcessUsage,
    ServerCost,
    UsageStart,
)
from mcp_infra.state.store import read_optional

MEASURING = (CycleState.BASELINE, CycleState.EXPERIMENT, CycleState.SELECT)
DOWNLOAD_NOTE = (
    "the cycle downloads nothing: artifacts come from the home's models folder or a "
    "hub snapshot prepared and inventoried beforehand (`mcp-infra prepare`)"
)


def phase_seconds(events: list[Event], ended: datetime) -> dict[str, float]:
    """Wall seconds per state: each event's time until the next event, summed by state."""
    out: dict[str, float] = {}
    for event, nxt in zip(events, [*events[1:], None], strict=True):
        until = nxt.ts if nxt is not None else ended
        span = max(0.0, (until - event.ts).total_seconds())
        out[event.state.value] = round(out.get(event.state.value, 0.0) + span, 3)
    return out


def downtime_from_journal(events: list[Event]) -> tuple[float | None, str]:
    """PROMOTE (enter) until VERIFY passed, or until the rollback restored the service."""
    start = next((e.ts for e in events if e.state == CycleState.PROMOTE), None)
    if start is None:
        return 0.0, "journal: no promotion, the stable port was not restarted"
    for event in events:
        if event.ts < start:
            continue
        step = event.step
        if (event.state == CycleState.VERIFY and step == JournalStep.PASSED) or (
            event.state == CycleState.ROLLBACK and step in (JournalStep.DONE, JournalStep.FAILED)
        ):
            span = (event.ts - start).total_seconds()
            return round(span, 3), (
                f"journal: PROMOTE → {event.state.value} {step} (an upper "
                "bound: the stable port answers before verification ends)"
            )
    return None, "journal: a promotion began but its end is not journaled"


def downtime_from_impact(impact: dict[str, JSONValue]) -> float | None:
    for key in ("downtime_s", "downtime_seconds", "downtime"):
        value = impact.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def server_costs(usages: list[ProcessUsage], cycle_start: datetime | None) -> list[ServerCost]:
    out = []
    for usage in sorted(usages, key=lambda u: (u.first_at, u.pid)):
        started_here = cycle_start is None or usage.create_time >= cycle_start.timestamp()
        cpu = usage.last_cpu_s if started_here else usage.last_cpu_s - usage.first_cpu_s
        note = (
            "whole life of the process (started in this cycle)"
            if started_here
            else "CPU since the cycle began (the process was already serving)"
        )
        out.append(
            ServerCost(
                label=usage.label,
                role=usage.role,
                pid=usage.pid,
                cpu_s=round(max(cpu, 0.0), 3),
                peak_rss_gb=usage.peak_rss_gb,
                note=note,
            )
        )
    return out


def energy_joules(
    start: dict[str, int], end: dict[str, int], ranges: dict[str, int | None]
) -> float | None:
    zones = sorted(set(start) & set(end))
    if not zones:
        return None
    total = 0
    for zone in zones:
        delta = end[zone] - start[zone]
        if delta < 0 and ranges.get(zone):
            delta += ranges[zone] or 0  # the counter wrapped once
        total += max(delta, 0)
    return round(total / 1e6, 3)


class EndReadings(NamedTuple):
    """The counters read once more as the cycle ends (``procs.usage.cycle_cost``)."""

    at: datetime
    supervisor_cpu_s: float | None
    energy_uj: dict[str, int]
    energy_ranges: dict[str, int | None]


def build(
    cycle_id: str,
    events: list[Event],
    start: UsageStart | None,
    usages: list[ProcessUsage],
    impact: dict[str, JSONValue] | None,
    speedup_pct: float | None,
    end: EndReadings,
) -> CycleCost:
    ended, supervisor_cpu_now = end.at, end.supervisor_cpu_s
    began = events[0].ts if events else (start.at if start else ended)
    phases = phase_seconds(events, ended)
    measuring = round(sum(phases.get(s.value, 0.0) for s in MEASURING), 3)
    downtime, source = (None, "")
    if impact is not None and (value := downtime_from_impact(impact)) is not None:
        downtime, source = value, "service_impact.json (measured by the front)"
    else:
        downtime, source = downtime_from_journal(events)
    energy = energy_joules(start.energy_uj, end.energy_uj, end.energy_ranges) if start else None
    energy_note = (
        "RAPL counters in /sys/class/powercap, package and DRAM zones as exposed"
        if energy is not None
        else "not available (no unprivileged energy counter on this platform)"
    )
    per_pct = None
    gain_note = "no speedup promoted: the measurement bought a decision, not a gain"
    if speedup_pct is not None and speedup_pct > 0:
        per_pct = round(measuring / speedup_pct, 2)
        gain_note = (
            f"{measuring:.0f} s of measurement for {speedup_pct:+.2f}% decode speed: "
            f"{per_pct} s per percent"
        )
    return CycleCost(
        cycle_id=cycle_id,
        wall_s=round(max(0.0, (ended - began).total_seconds()), 3),
        phases_s=phases,
        servers=server_costs(usages, start.at if start else None),
        supervisor_cpu_s=(
            round(supervisor_cpu_now - start.supervisor_cpu_s, 3)
            if start and supervisor_cpu_now is not None
            else None
        ),
        downtime_s=downtime,
        downtime_source=source,
        bytes_downloaded=0,
        bytes_note=DOWNLOAD_NOTE,
        energy_j=energy,
        energy_note=energy_note,
        measurement_s=measuring,
        speedup_pct=speedup_pct,
        measurement_s_per_speedup_pct=per_pct,
        gain_note=gain_note,
    )


def read_inputs(
    cycle_dir: Path,
) -> tuple[UsageStart | None, list[ProcessUsage], dict[str, JSONValue] | None]:
    start = read_optional(cycle_dir / "usage-start.json", UsageStart)
    usages = []
    folder = cycle_dir / "usage"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        usage = read_optional(path, ProcessUsage)
        if usage is not None:
            usages.append(usage)
    impact = None
    try:
        data = json.loads((cycle_dir / "service_impact.json").read_text())
        impact = data if isinstance(data, dict) else None
    except (OSError, ValueError):
        impact = None
    return start, usages, impact
