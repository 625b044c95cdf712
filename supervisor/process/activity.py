"""What a rank's process is doing, as /proc shows it: state, CPU time, where its threads wait.

The evidence the hang rule (:mod:`supervisor.rules.stuck`) judges a silent rank by. Everything is
read from ``/proc/PID`` of the ranks on this node (their pids are known from their hello), which
needs no permission beyond owning the process; a process that is gone, or another system, gives
None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from supervisor.rules.stuck import ThreadState

__all__ = ["ProcSample", "catches", "is_stopped", "read"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One look at a process."""

    state: str  # the state letter: R running, S sleeping, D uninterruptible, T stopped, Z, ...
    cpu_s: float  # user + system CPU time of all its threads so far
    wchan: str  # the kernel function its main thread waits in ("" when running or unknown)
    threads: tuple[ThreadState, ...] = ()  # its other threads, as far as they could be read


def read(pid: int, *, threads: bool = False) -> ProcSample | None:
    """The process's state, CPU time and main thread's wait channel (and, with ``threads``, its
    other threads' names, states and wait channels); None if it is gone."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    if len(fields) < 13:  # gone, or not a stat line: the state, then utime and stime 12th, 13th
        return None
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    except ValueError:
        return None
    others = _threads(pid) if threads else ()
    return ProcSample(fields[0], cpu, _wchan(pid, pid), others)


def _threads(pid: int) -> tuple[ThreadState, ...]:
    """The process's threads other than the main one (those gone meanwhile left out)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit() and int(t) != pid]
    except OSError:
        return ()
    out = []
    for tid in sorted(tids):
        fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        name = _text(f"/proc/{pid}/task/{tid}/comm")
        if fields and name is not None:
            out.append(ThreadState(name.rstrip("\n"), fields[0], _wchan(pid, tid)))
    return tuple(out)


def _stat_fields(path: str) -> list[str]:
    """The fields of a ``stat`` file after the command name, the state first ([] if gone).
    "pid (comm) S ppid ...": comm may hold spaces and parentheses, so they start after the
    last ")"."""
    stat = _text(path)
    return [] if stat is None else stat[stat.rfind(")") + 2 :].split()


def _wchan(pid: int, tid: int) -> str:
    wchan = (_text(f"/proc/{pid}/task/{tid}/wchan") or "").strip()
    return "" if wchan == "0" else wchan


def _text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


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


def is_stopped(pid: int) -> bool:
    """True when ``pid`` is stopped by a signal (state T)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] == b"T"
