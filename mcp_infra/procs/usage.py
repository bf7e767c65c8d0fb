"""CPU, memory and energy counters of a cycle, read with psutil and sysfs (no privileges).

``cycle_start`` reads the supervisor's CPU time and any readable energy counter when a cycle
begins; ``snapshot`` records a server's CPU time and peak memory (first and latest reading) in
``<cycle>/usage/``, called before each server is stopped and when the cycle is sealed.
``load_snapshot`` reads the machine's counters that ``core.machine`` turns into the rest of the
machine's load around each server start (the same calls on Linux and macOS).
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from mcp_infra.contracts import CycleCost, ProcessRecord, ProcessUsage, UsageStart
from mcp_infra.core.machine import LoadSnapshot
from mcp_infra.procs.front import front_record
from mcp_infra.procs.identity import same_start
from mcp_infra.procs.runtime import vm_hwm
from mcp_infra.state.store import CorruptFile, Home, read_optional, utcnow, write_model

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
        if not same_start(psutil_proc.create_time(), record.create_time):
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
        end = cost.EndReadings(utcnow(), own_cpu_s(), energy, {z: energy_range(z) for z in energy})
        return cost.build(cycle_id, events, start, usages, impact, speedup_pct, end)
    except (OSError, ValueError, psutil.Error):
        return None


# ---------------------------------------------------------------------------------------------
# The rest of the machine's load
# ---------------------------------------------------------------------------------------------

IDLE_FIELDS = ("idle", "iowait", "steal", "guest", "guest_nice")
"""CPU time fields that are not this machine's processes at work (Linux counts guest time in
user time too; steal is time a hypervisor gave to other machines, kept apart)."""


def _cpu_of(proc: psutil.Process) -> float:
    """Another process's CPU seconds, with those of its children it has waited for (Linux;
    macOS reports the process alone)."""
    times = proc.cpu_times()
    return (
        times.user
        + times.system
        + getattr(times, "children_user", 0.0)
        + getattr(times, "children_system", 0.0)
    )


def _tree_cpu(proc: psutil.Process) -> float:
    """A process's CPU seconds with those of its live descendants (the front's keeper runs its
    proxy as a child) and of the children they waited for."""
    total = _cpu_of(proc)
    for child in proc.children():
        with contextlib.suppress(psutil.Error):
            total += _tree_cpu(child)
    return total


def _own_and_reaped_cpu_s() -> float:
    """This process's CPU seconds and its waited-for children's (getrusage: the same on Linux
    and macOS, where psutil reports no children's time)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def load_snapshot(exclude: Sequence[ProcessRecord] = ()) -> LoadSnapshot:
    """The machine's cumulative counters now. This process's CPU time counts its reaped
    children: the measured server is one once it has been stopped (``runtime.stop_server``
    reaps it), so its whole run is left out of "other". ``exclude``: more processes of ours
    (the front), each by pid and start time so a reused pid is never counted as ours."""
    cpu = psutil.cpu_times()
    fields = cpu._asdict()
    busy = sum(v for k, v in fields.items() if k not in IDLE_FIELDS)
    ours = {"supervisor": _own_and_reaped_cpu_s()}
    for record in exclude:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(record.pid)
            if same_start(proc.create_time(), record.create_time):
                ours[f"{record.role}:{record.pid}:{record.create_time:.2f}"] = _tree_cpu(proc)
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = psutil.getloadavg()[0]
    memory = psutil.virtual_memory()
    swap_in = swap_out = None
    with contextlib.suppress(OSError, RuntimeError):
        swap = psutil.swap_memory()
        swap_in, swap_out = int(swap.sin), int(swap.sout)
    return LoadSnapshot(
        monotonic=time.monotonic(),
        cpus=psutil.cpu_count() or 1,
        busy_cpu_s=busy,
        steal_s=fields.get("steal"),
        own_cpu_s=ours,
        load_avg_1m=load,
        available_memory_fraction=min(1.0, memory.available / memory.total)
        if memory.total
        else None,
        swap_in_bytes=swap_in,
        swap_out_bytes=swap_out,
    )


def machine_reader(home: Home) -> Callable[[], LoadSnapshot]:
    """A reading of the machine that leaves out this supervisor, the servers it reaped and the
    home's front (its record is read each time: a front restarted by the healer is still ours)."""

    def read() -> LoadSnapshot:
        front = None
        with contextlib.suppress(CorruptFile, OSError):
            front = front_record(home)
        return load_snapshot([front] if front else [])

    return read
