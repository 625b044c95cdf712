"""Every process a test started, found and ended: the leftover check of the test suite
(``tests/conftest.py``) and of the chaos runner (``python -m tests.chaos``).

How a process is found. The guarded process (pytest, the chaos runner) makes itself a child
subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4, no privilege needed): an orphan among
its descendants is re-parented to it instead of to init, so every process it started, directly or
through any number of forks, stays one of its descendants until it is reaped, whatever it did to
get away: a double fork, ``setsid()``, a new process group, an empty environment, another cgroup.
The other ways were weaker: a marker in ``/proc/PID/environ`` is lost by a process that clears or
replaces its environment (the zygote strips ``RVSUP_*``, and its forked ranks show its
environment); a process group or session is left by ``setsid()``; the plain process tree loses a
double-forked daemon to init; a cgroup per test needs root and cgroup v2 delegation, rvsup moves
its processes into groups of its own, and on a shared machine the ``rvsup-PID`` groups beside
ours may be another user's. One more net catches what was started on our behalf by someone else,
outside our tree: processes carrying the marker (a Slurm batch script inherits the submitter's
environment).

Adopted orphans must be reaped, or they would stay zombies (that ``psutil.pid_exists`` sees) until
the guarded process ends: a thread reaps them as they exit. It never reaps a child this process
started itself (``subprocess.Popen``, ``os.fork``), whose exit status belongs to the code that
started it, and it pauses where a test reaps on purpose (:meth:`ProcessGuard.reaping_paused`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Collection, Iterator
from typing import Any

import psutil

__all__ = ["ProcessGuard", "guard"]

_PR_SET_CHILD_SUBREAPER = 36
_REAP_INTERVAL_S = 0.02
_SCAN_INTERVAL_S = 0.5  # at most this often while a zombie child is one the code that started
# it has yet to wait for (a scan of /proc costs milliseconds)
_CONSTRUCTION_S = 5.0  # a Popen this long without a pid failed to start


class ProcessGuard:
    """This process as the subreaper of everything it starts; see the module."""

    def __init__(self, *, mark: tuple[str, str] | None, exempt: Collection[str] = ()) -> None:
        self.mark = mark
        """``(variable, value)`` carried by processes started for us outside our tree."""
        self.exempt = frozenset(exempt)
        """Names of long-lived daemons (a test cluster's) left alone, with their descendants,
        where a check exempts them."""
        self._popens: weakref.WeakKeyDictionary[subprocess.Popen[Any], float] = (
            weakref.WeakKeyDictionary()
        )
        self._forked: set[int] = set()
        self._paused = 0
        self._lock = threading.Lock()
        self._last_scan = 0.0
        self._pid = 0  # the guarded process, once started

    # ------------------------------------------------------------------ finding
    def processes(self, *, exempt: bool) -> dict[int, str]:
        """pid -> command line of every live process of ours: our descendants and the processes
        carrying the marker (never this process; with ``exempt``, never an exempt daemon nor
        what descends from it)."""
        me = os.getpid()
        pids = self._descendants(me, exempt=exempt)
        found: dict[int, str] = {}
        for proc in psutil.process_iter(["pid", "name", "status"]):
            try:
                if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if exempt and proc.info["name"] in self.exempt:
                    continue
                if proc.pid not in pids and not self._marked(proc):
                    continue
                found[proc.pid] = " ".join(proc.cmdline())[:200]
            except (psutil.Error, OSError):
                continue
        return found

    def _descendants(self, root: int, *, exempt: bool) -> set[int]:
        children: dict[int, list[int]] = {}
        names: dict[int, str] = {}
        for proc in psutil.process_iter(["pid", "ppid", "name"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
            names[proc.pid] = proc.info["name"]
        found: set[int] = set()
        todo = list(children.get(root, []))
        while todo:
            pid = todo.pop()
            if pid in found or (exempt and names.get(pid) in self.exempt):
                continue
            found.add(pid)
            todo += children.get(pid, [])
        return found

    def _marked(self, proc: psutil.Process) -> bool:
        if self.mark is None:
            return False
        name, value = self.mark
        return bool(proc.environ().get(name) == value)

    # ------------------------------------------------------------------ ending
    def leftovers(self, before: Collection[int], *, exempt: bool, grace_s: float) -> dict[int, str]:
        """The processes of ours that did not exist ``before`` and are still alive after up to
        ``grace_s`` (a process on its way out is given the time to go)."""
        deadline = time.monotonic() + grace_s
        while True:
            left = {
                pid: cmd for pid, cmd in self.processes(exempt=exempt).items() if pid not in before
            }
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def check(self, before: Collection[int], *, grace_s: float) -> dict[int, str]:
        """The check after a test (or a chaos run): the processes of ours, daemons exempt, that
        did not exist ``before`` and are still alive ``grace_s`` on, ended; pid -> command
        line."""
        left = self.leftovers(before, exempt=True, grace_s=grace_s)
        self.end(left)
        return left

    def end(self, pids: Collection[int]) -> None:
        """SIGKILL ``pids``, then wait until they are gone (reaped, where they are ours)."""
        procs = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                proc.kill()
                procs.append(proc)
        psutil.wait_procs(procs, timeout=10)

    # ------------------------------------------------------------------ reaping
    def start(self) -> None:
        """Become the subreaper and start reaping the adopted orphans that exit."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
        self._pid = os.getpid()
        sys.addaudithook(self._on_audit)
        os.register_at_fork(after_in_parent=self._after_fork, after_in_child=self._in_child)
        threading.Thread(
            target=self._reap_forever, name="process-guard-reaper", daemon=True
        ).start()

    @contextlib.contextmanager
    def reaping_paused(self) -> Iterator[None]:
        """Reap nothing in the block: the test reaps (or inspects zombies) itself."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def _in_child(self) -> None:
        """A forked child is not the subreaper: its copy of the guard stays idle (and gets a
        lock of its own: the parent's may have been held by the reaper at the fork)."""
        self._lock = threading.Lock()

    def _on_audit(self, event: str, _args: tuple[Any, ...]) -> None:
        if os.getpid() != self._pid:
            return
        if event == "subprocess.Popen":  # raised by the Popen being started, in its frame
            started = sys._getframe(1).f_locals.get("self")
            if isinstance(started, subprocess.Popen):
                with self._lock:
                    self._popens[started] = time.monotonic()

    def _after_fork(self) -> None:
        with self._lock, contextlib.suppress(psutil.Error):
            self._forked |= {c.pid for c in psutil.Process().children()}

    def _reap_forever(self) -> None:
        while True:
            time.sleep(_REAP_INTERVAL_S)
            with contextlib.suppress(Exception):  # never let the thread die: it would stop reaping
                self._reap_adopted()

    def _reap_adopted(self) -> None:
        try:
            first = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if first is None:
            return  # no child has exited
        with self._lock:
            if self._paused:
                return
            now = time.monotonic()
            starting = [
                p for p, t in self._popens.items() if p.pid is None and now - t < _CONSTRUCTION_S
            ]
            if starting:
                return  # a child that exits before its Popen knows its pid must not be taken
            kept = {p.pid for p in self._popens if p.returncode is None} | self._forked
        if first.si_pid in kept:
            if now - self._last_scan < _SCAN_INTERVAL_S:
                return
            self._last_scan = now
            zombies = [
                c.pid for c in psutil.Process().children() if _is_zombie(c) and c.pid not in kept
            ]
        else:
            zombies = [first.si_pid]
        for pid in zombies:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        with self._lock:
            self._forked = {pid for pid in self._forked if psutil.pid_exists(pid)}


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


_guard: ProcessGuard | None = None


def guard(*, mark: tuple[str, str] | None = None, exempt: Collection[str] = ()) -> ProcessGuard:
    """This process's guard, started at the first call (the later calls' arguments are ignored)."""
    global _guard  # one subreaper per process
    if _guard is None:
        _guard = ProcessGuard(mark=mark, exempt=exempt)
        _guard.start()
    return _guard
