"""Processes the supervisor is responsible for: exit notification, exit status, tree teardown.

Linux facilities do the work: a pidfd becomes readable the instant its process exits (no polling,
works for grandchildren), ``/proc/<pid>/stat`` still holds the exit status while the process is a
zombie, and ``PR_SET_CHILD_SUBREAPER`` makes orphaned descendants our children so that teardown can
reap them: no zombie and no orphan survives an attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

__all__ = [
    "AFTER_WORKERS_S",
    "ExitStatus",
    "TeardownReport",
    "become_subreaper",
    "descendants",
    "open_pidfd",
    "teardown",
    "zombie_wait_status",
]

_PR_SET_CHILD_SUBREAPER = 36
#: Once the workers are gone, how much longer the others sent SIGTERM (a rank's own children)
#: get before SIGKILL.
AFTER_WORKERS_S = 0.2


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None when it is already gone."""
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def zombie_wait_status(pid: int) -> int | None:
    """The raw wait status of an exited, not yet reaped process (``/proc/PID/stat`` field 52)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    return int(fields[49])


@dataclass(frozen=True, slots=True)
class ExitStatus:
    code: int | None
    signal: int | None

    @classmethod
    def from_wait_status(cls, status: int | None) -> ExitStatus:
        if status is None:
            return cls(None, None)
        if os.WIFSIGNALED(status):
            return cls(None, os.WTERMSIG(status))
        return cls(os.WEXITSTATUS(status), None)

    @classmethod
    def from_returncode(cls, rc: int | None) -> ExitStatus:
        if rc is None:
            return cls(None, None)
        return cls(None, -rc) if rc < 0 else cls(rc, None)


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _gone(pid: int, popens: dict[int, subprocess.Popen[bytes]]) -> bool:
    """True when ``pid`` has exited (reaping it if it is our zombie child)."""
    if pid in popens:  # let Popen reap its own child, so that it records the exit status
        return popens[pid].poll() is not None
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass(frozen=True, slots=True)
class TeardownReport:
    signalled: int  # processes found and sent SIGTERM
    killed: int  # still alive at the deadline and sent SIGKILL
    leftover: int  # still not gone after SIGKILL (should be 0)
    seconds: float
    left: tuple[int, ...] = ()  # the pids of those left
    forced: int = 0  # of the killed, those that had been sent SIGTERM first (not spared)


def teardown(
    pids: Iterable[int],
    *,
    term_timeout_s: float,
    kill_timeout_s: float = 5.0,
    popens: Iterable[subprocess.Popen[bytes]] = (),
    workers: Iterable[int] | None = None,
    spared: Iterable[int] = (),
    members: Callable[[], set[int]] | None = None,
    kill_all: Callable[[], None] | None = None,
) -> TeardownReport:
    """SIGTERM every process (SIGCONT first, so stopped ones can act), wait until a monotonic
    deadline, SIGKILL the survivors, wait again, reaping whatever is our child. Blocking: run it in a
    thread from async code. Descendants that appear meanwhile are included.

    ``workers``: the processes whose end is worth waiting for (the ranks): once they are gone, the
    deadline is now, and the rest (a launcher taking its time to shut down: torchrun needs
    seconds after SIGTERM) are SIGKILLed at once. ``spared``: processes sent neither SIGTERM
    nor SIGCONT, only the SIGKILL (a single-node torchrun, whose shutdown would only log
    warnings, and which may have been stopped so that it cannot race the teardown).
    ``members``: every process of the attempt's cgroup, signalled with the rest (those that
    appear later are SIGKILLed); ``kill_all``: how to SIGKILL them all at once
    (``cgroup.kill``)."""
    t0 = time.monotonic()
    owned = {p.pid: p for p in popens}
    me = os.getpid()
    alive = {p for p in pids if p != me} | set(owned)
    for pid in list(alive):
        alive |= descendants(pid)
    if members is not None:
        alive |= members() - {me}
    seen = set(alive)  # a zombie counted gone may be re-parented to us later: reap it at the end
    signalled = len(alive)
    told = alive - set(spared)
    _signal_all(told, signal.SIGTERM)
    _signal_all(told, signal.SIGCONT)
    deadline = t0 + term_timeout_s
    if workers is not None and not _wait_gone(set(workers) & alive, deadline, owned):
        # the workers obeyed: what else was sent SIGTERM gets a moment more, a spared none
        _wait_gone(told & alive, min(deadline, time.monotonic() + AFTER_WORKERS_S), owned)
        deadline = time.monotonic()
    alive = _wait_gone(alive, deadline, owned)
    if members is not None:  # started meanwhile, or re-parented out of our sight
        alive |= {p for p in members() - {me} if not _gone(p, owned)}
    killed = len(alive)
    forced = len(alive - set(spared))
    if alive:
        for pid in list(alive):
            alive |= descendants(pid)
        seen |= alive
        if kill_all is not None:
            kill_all()
        _signal_all(alive, signal.SIGKILL)
        alive = _wait_gone(alive, time.monotonic() + kill_timeout_s, owned)
    if members is not None:
        alive |= {p for p in members() - {me} if not _gone(p, owned)}
        seen |= alive
    for pid in seen - set(owned):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    left = tuple(sorted(alive))
    return TeardownReport(signalled, killed, len(left), time.monotonic() - t0, left, forced)


def _wait_gone(
    pids: set[int], deadline: float, owned: dict[int, subprocess.Popen[bytes]]
) -> set[int]:
    alive = set(pids)
    while alive:
        alive = {p for p in alive if not _gone(p, owned)}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return alive
