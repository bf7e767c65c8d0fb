"""CPU, memory and energy counters of a cycle, read with psutil and sysfs (no privileges).

``cycle_start`` reads the supervisor's CPU time and any readable energy counter when a cycle
begins; ``snapshot`` records a server's CPU time and peak memory (first and latest reading) in
``<cycle>/usage/``, called before each server is stopped and when the cycle is sealed.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil

from mcp_infra.contracts import CycleCost, ProcessRecord, ProcessUsage, UsageStart
from mcp_infra.procs.runtime import vm_hwm
from mcp_infra.state.store import Home, read_optional, utcnow, write_model

POWERCAP = Path("/sys/class/powercap")


def energy_counters(root: Path = POWERCAP) -> dict[str, int]:
    """Readable RAPL-style counters (µJ) by zone name; empty where none can be read unprivileged."""
    found: dict[str, int] = {}
    if not root.is_dir():
        return found
    for zone in sorted(root.glob("*/energy_uj")):
        with contextlib.suppress(OSError, ValueError):
            found[zone.parent.name] = int(zone.read_text().strip())
    return found


def energy_range(zone: str, root: Path = POWERCAP) -> int | None:
    try:
        return int((root / zone / "max_energy_range_uj").read_text().strip())
    except (OSError, ValueError):
        return None


def own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def snapshot_service(cycle_dir: Path, home: Home, label: str | None = None) -> None:
    """Snapshot the stable server by its record; an unreadable record is skipped, not raised."""
    from mcp_infra.state.context import service_record
    from mcp_infra.state.store import CorruptFile

    try:
        record = service_record(home)
    except (CorruptFile, OSError):
        return
    snapshot(cycle_dir, record, label)


def cycle_start(cycle_dir: Path, home: Home) -> UsageStart:
    """Counters at the cycle's start; the live server's CPU time so far is its first reading."""
    snapshot_service(cycle_dir, home)
    start = UsageStart(
        at=utcnow(),
        monotonic=time.monotonic(),
        supervisor_cpu_s=own_cpu_s(),
        energy_uj=energy_counters(),
    )
    with contextlib.suppress(OSError):  # cost is best effort; it never stops a cycle
        write_model(cycle_dir / "usage-start.json", start)
    return start


def _tree_cpu_and_peak(pid: int) -> tuple[float, int] | None:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    cpu, peak = 0.0, 0
    for proc in procs:
        try:
            times = proc.cpu_times()
            cpu += times.user + times.system
            peak += max(proc.memory_info().rss, vm_hwm(proc.pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return cpu, peak


def snapshot(cycle_dir: Path, record: ProcessRecord | None, label: str | None = None) -> None:
    """Record a server's CPU seconds and peak memory now; never raises (cost is best effort)."""
    if record is None:
        return
    try:
        psutil_proc = psutil.Process(record.pid)
        if abs(psutil_proc.create_time() - record.create_time) > 1.0:
            return  # the pid was reused: not our server
        reading = _tree_cpu_and_peak(record.pid)
        if reading is None:
            return
        cpu, peak = reading
        path = cycle_dir / "usage" / f"{record.role}-{record.pid}-{int(record.create_time)}.json"
        now = utcnow()
        old = read_optional(path, ProcessUsage)
        usage = ProcessUsage(
            pid=record.pid,
            create_time=record.create_time,
            role=record.role,
            label=label or record.candidate_id,
            first_at=old.first_at if old else now,
            first_cpu_s=old.first_cpu_s if old else cpu,
            last_at=now,
            last_cpu_s=cpu,
            peak_rss_gb=round(max(peak / 2**30, (old.peak_rss_gb or 0) if old else 0), 4),
            peak_source="rss and VmHWM of the process tree (Linux)"
            if Path("/proc").is_dir()
            else "rss of the process tree",
        )
        write_model(path, usage)
    except (psutil.Error, OSError, ValueError):
        return


def cycle_cost(home: Home, cycle_id: str, speedup_pct: float | None) -> CycleCost | None:
    """Read the counters once more (the serving process, the supervisor, energy) and build the
    cycle's cost; None if even that fails (cost never blocks sealing)."""
    from mcp_infra.state import cost

    cdir = home.cycle_dir(cycle_id)
    try:
        snapshot_service(cdir, home)
        start, usages, impact = cost.read_inputs(cdir)
        events, _ = home.read_journal(cycle_id)
        energy = energy_counters()
        return cost.build(
            cycle_id,
            events,
            utcnow(),
            start,
            usages,
            impact,
            speedup_pct,
            own_cpu_s(),
            energy,
            {z: energy_range(z) for z in energy},
        )
    except (OSError, ValueError, psutil.Error):
        return None
