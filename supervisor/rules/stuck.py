"""Stuck or busy: whether ranks that finished no step for their hang timeout are hung (pure).

A timeout alone cannot tell a rank that works (rank 0 evaluating alone for minutes, a checkpoint
of the user's own, a slow logging hook) from one that never will (a collective nobody completes,
a stopped process, a deadlock). Before a hang is declared, the silent group is judged from what
each rank's process shows over a window of about a second (:class:`RankEvidence`: its state, its
CPU time, the kernel's wait channel of its main thread, its main thread's Python stack):

=============== ============================================================ ==========
activity        evidence                                                     counts as
=============== ============================================================ ==========
stopped         state ``T`` (SIGSTOP, SIGTSTP)                               stuck
collective      main thread inside a collective (c10d, DDP, autograd), or    waiting
                the flight recorder shows one under way (its host spins in
                CUDA's wait for an NCCL kernel that began, or polls a work)
working         outside collectives, CPU time advanced (>= 5 % of a core)    busy
storage         outside collectives, state ``D``, no CPU (a write or an      busy, idle
                ``fsync`` to slow storage)
thread wait     outside collectives, no CPU, main thread waits on a future,  busy, idle
                queue, event or join (``threading``, ``queue``,
                ``concurrent.futures``) while a thread of its own runs,
                sleeps, or waits for I/O or storage
locked          outside collectives, no CPU, main thread waits on a futex    stuck
                and so does every thread of its own (a deadlock)
silent          outside collectives, no CPU, no Python stack written         stuck
own wait        outside collectives, no CPU, sleeping or waiting for I/O or  busy, idle
                for its data loader (``time.sleep``, ``select``, a read)
unknown         no evidence (a rank on another node, a process gone)         --
=============== ============================================================ ==========

A rank's *own threads* (:class:`ThreadState`) are its threads other than the main one that no
library named: rvsup's (``rvsup-*``), ZeroMQ's, gloo's, torch's (``pt_*``) and CUDA's threads wait
in ``epoll`` or on futexes all the time, so they tell nothing about what the rank waits for. A
rank whose main thread waits on a bare ``Lock.acquire()`` (no Python frame of the wait shows) is
judged locked even if a thread of its own is alive: only a wait the stacks show as one on another
thread counts.

The group is :class:`Stuck` when any rank is stuck, or when no rank is busy (every rank waits in
a collective: the gloo/NCCL hang; or nothing is known). Otherwise it is :class:`Busy`: the ranks
outside collectives are doing something of their own and the others wait for them. A sleep counts
as busy because, to the kernel and the stacks, a rank that sleeps in a logging hook looks exactly
like one that sleeps forever; only time tells them apart, so a busy group is given up to
``hang_timeout_max`` (and judged again meanwhile) before its silence is declared a hang, and a
group busy only with waits of its own (no rank working: :attr:`Busy.working` false: sleeps, waits
on its own threads, on storage) up to ``hang_timeout_idle`` from when a rank was last seen
working.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.rules.culprits import Frame, collective_of, where

__all__ = [
    "WORKING_SHARE",
    "Activity",
    "Busy",
    "RankEvidence",
    "Stuck",
    "ThreadState",
    "activity",
    "judge_silence",
]

WORKING_SHARE = 0.05  # the share of one core a rank must use over the window to be working
_DATA_LOADER = "torch/utils/data/"  # waiting for its data loader's workers: its own wait
# where the main thread's innermost frame is when it waits for another thread of the process
_THREAD_SYNC = ("/threading.py", "/queue.py", "/concurrent/futures/")
# thread names libraries give: rvsup's, ZeroMQ's, gloo's, torch's, CUDA's (never the user's)
_LIBRARY_THREADS = ("rvsup-", "ZMQbg/", "gloo", "pt_", "cuda")


class Activity(enum.Enum):
    """What one silent rank is doing (see the module docstring)."""

    STOPPED = "stopped by a signal"
    COLLECTIVE = "waits in a collective"
    WORKING = "working"
    STORAGE = "waiting on storage (state D)"
    THREAD_WAIT = "waiting on a thread of its own"
    LOCKED = "blocked on a lock"
    SILENT = "wrote no stack and uses no CPU"
    OWN_WAIT = "waiting on its own (a sleep or I/O)"
    UNKNOWN = "not observed"


_STUCK = frozenset({Activity.STOPPED, Activity.LOCKED, Activity.SILENT})
_BUSY = frozenset({Activity.WORKING, Activity.STORAGE, Activity.THREAD_WAIT, Activity.OWN_WAIT})


@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread of a rank other than its main thread, at the end of the judging window."""

    name: str  # its name (``comm``): the process's own unless a library named it
    state: str  # R, S, D, T, ...
    wchan: str  # the kernel function it waits in ("" running or unknown)

    @property
    def libraries(self) -> bool:
        """Whether a library started it (its name says so): it tells nothing of the user's wait."""
        return self.name.startswith(_LIBRARY_THREADS)

    @property
    def waits_on_a_lock(self) -> bool:
        """Blocked on a futex (a lock, a condition, an event, a queue): waiting for another thread."""
        return self.state == "S" and "futex" in self.wchan


@dataclass(frozen=True, slots=True)
class RankEvidence:
    """One rank's process over the judging window; None where it could not be read."""

    rank: int
    state: str | None = None  # /proc state letter at the end of the window (R, S, D, T, ...)
    cpu_s: float | None = None  # CPU time (all threads) used during the window
    window_s: float = 0.0  # the window's length
    wchan: str = ""  # the kernel function the main thread sleeps in ("" running or unknown)
    frames: tuple[Frame, ...] = ()  # the main thread's Python stack, innermost first
    stack_read: bool = False  # a stack was asked for and read (frames may still be empty)
    threads: tuple[ThreadState, ...] = ()  # its other threads (none read: empty)
    collective: str = ""  # the collective its flight recorder shows under way ("" none, unread)


@dataclass(frozen=True, slots=True)
class Busy:
    """Ranks outside collectives are doing something of their own: not a hang (yet)."""

    ranks: tuple[int, ...]
    where: str  # where the first of them is, ``train.py:90 in main``
    detail: str
    working: bool = True  # some rank used CPU; False: every busy rank waits on its own


@dataclass(frozen=True, slots=True)
class Stuck:
    """Nothing moves: a hang."""

    ranks: tuple[int, ...]  # the stuck ranks (empty: all wait in collectives, or unknown)
    detail: str


def activity(e: RankEvidence) -> Activity:
    """One rank's activity from its evidence (the table in the module docstring)."""
    if e.state is None and e.cpu_s is None:
        return Activity.UNKNOWN
    if e.state == "T":  # not "t", a tracing stop: py-spy reading it
        return Activity.STOPPED
    if collective_of(e.frames) is not None or e.collective:
        return Activity.COLLECTIVE
    if e.cpu_s is not None and e.window_s > 0 and e.cpu_s >= WORKING_SHARE * e.window_s:
        return Activity.WORKING
    if e.state == "D":
        return Activity.STORAGE
    if any(_DATA_LOADER in _path(f) for f in e.frames):
        return Activity.OWN_WAIT
    if "futex" in e.wchan:
        return Activity.THREAD_WAIT if _waits_on_a_live_thread(e) else Activity.LOCKED
    if e.stack_read and not e.frames:
        return Activity.SILENT
    return Activity.OWN_WAIT


def judge_silence(evidence: Sequence[RankEvidence]) -> Busy | Stuck:
    """Whether the silent group is busy or stuck (see the module docstring)."""
    seen = [(e, activity(e)) for e in sorted(evidence, key=lambda e: e.rank)]
    stuck = [(e, a) for e, a in seen if a in _STUCK]
    if stuck:
        parts = [f"rank {e.rank} is {a.value}{_at(e)}" for e, a in stuck]
        return Stuck(tuple(e.rank for e, _ in stuck), "; ".join(parts))
    busy = [(e, a) for e, a in seen if a in _BUSY]
    if not busy:
        waiting = [e.rank for e, a in seen if a is Activity.COLLECTIVE]
        if waiting:
            verb = "waits" if len(waiting) == 1 else "wait"
            recorded = [
                f"rank {e.rank} at {where(e.frames) if e.frames else 'an unknown line'}: "
                f"{e.collective} under way"
                for e, _ in seen
                if e.collective and collective_of(e.frames) is None
            ]
            flight = f"; flight recorder: {', '.join(recorded)}" if recorded else ""
            detail = f"{_ranks(waiting)} {verb} in collectives and nothing else runs{flight}"
            return Stuck((), detail)
        return Stuck((), "no rank could be observed")
    parts = [f"rank {e.rank} is {a.value}{_at(e)}" for e, a in busy]
    waiting = [e.rank for e, a in seen if a is Activity.COLLECTIVE]
    if waiting:
        parts.append(f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it")
    first = busy[0][0]
    working = any(a is Activity.WORKING for _, a in busy)
    return Busy(tuple(e.rank for e, _ in busy), where(first.frames), "; ".join(parts), working)


def _waits_on_a_live_thread(e: RankEvidence) -> bool:
    """The main thread waits on another thread (its innermost frame is a thread-synchronising
    library's), and some thread of the rank's own is not itself blocked on a lock."""
    if not e.frames or not any(part in _path(e.frames[0]) for part in _THREAD_SYNC):
        return False
    return any(not t.libraries and not t.waits_on_a_lock for t in e.threads)


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def _at(e: RankEvidence) -> str:
    return f" ({where(e.frames)})" if e.frames else ""


def _ranks(ranks: Sequence[int]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(str(r) for r in ranks)}"
