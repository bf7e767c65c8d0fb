"""Is this pid still the process we recorded? One rule for every record (servers, ranks, the
supervisor, the front): the pid is alive, not a zombie, and started when the record says.

Why the start time is compared with a second of slack: on Linux ``psutil`` adds the process's
start (clock ticks since boot, which never change) to the boot time in ``/proc/stat``, an integer
the kernel derives anew from the wall clock at every read. A clock adjustment that carries the
wall-clock offset across a whole second moves that integer by one, and with it every process's
start time, so a tighter tolerance reads a healthy server as dead mid-start. A pid reused within
a second of the recorded start is no practical risk (the kernel hands pids out in sequence).
macOS records the start as a fixed wall-clock time, so there the slack is never used.
"""

from __future__ import annotations

import psutil

START_SLACK_S = 1.05
"""How far a live process's reported start may sit from the recorded one (see the module)."""


def start_time(pid: int) -> float | None:
    """The process's start time (epoch seconds) as the OS reports it; None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def same_start(reported: float, recorded: float) -> bool:
    """Do two readings of a start time name the same process start?"""
    return abs(reported - recorded) < START_SLACK_S


def started_by(reported: float, recorded: float) -> bool:
    """Did a process start no earlier than a recorded start (within the same slack)?"""
    return reported > recorded - START_SLACK_S


def is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def is_alive(pid: int, create_time: float) -> bool:
    """The pid is alive, not a zombie, and is the process that started at ``create_time``."""
    try:
        proc = psutil.Process(pid)
        return not is_zombie(proc) and same_start(proc.create_time(), create_time)
    except psutil.Error:
        return False
