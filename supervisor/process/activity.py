"""What a rank's process is doing, as /proc shows it: state, CPU time, where its main thread waits.

The evidence the hang rule (:mod:`supervisor.rules.stuck`) judges a silent rank by. Everything is
read from ``/proc/PID`` of the ranks on this node (their pids are known from their hello), which
needs no permission beyond owning the process; a process that is gone, or another system, gives
None.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = ["ProcSample", "catches", "read"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One look at a process."""

    state: str  # the state letter: R running, S sleeping, D uninterruptible, T stopped, Z, ...
    cpu_s: float  # user + system CPU time of all its threads so far
    wchan: str  # the kernel function its main thread waits in ("" when running or unknown)


def read(pid: int) -> ProcSample | None:
    """The process's state, CPU time and main thread's wait channel; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) S ppid ...": comm may hold spaces and parentheses; the rest starts after the
    # last ")": state is its first field, utime and stime its 12th and 13th
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 13:
        return None
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    except ValueError:
        return None
    wchan = ""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/wchan", "rb") as f:
        wchan = f.read().decode("ascii", "replace").strip()
    return ProcSample(fields[0], cpu, "" if wchan == "0" else wchan)


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (SigCgt in /proc/PID/status): signalling
    a process that has none may kill it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False
