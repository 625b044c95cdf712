"""One look at the ranks of a node over a window of about a second: the evidence a silence is
judged by (:func:`supervisor.rules.stuck.judge_silence`).

At the window's start each rank's process is sampled (:mod:`.activity`) and asked for its
Python stacks (faulthandler's dump on ``protocol.DUMP_SIGNAL``, only of ranks that handle that
signal, and not into a stacks file grown past :data:`STACKS_CAP_BYTES`, which a job that keeps
coming close to its timeout would otherwise fill) and, where it serves one, for its flight
recorder (:func:`~supervisor.process.diagnostics.request_flight`); at its end each is sampled
again, what it added to its stacks file is read, and the collective a new flight-recorder dump
shows under way (:func:`~supervisor.rules.culprits.under_way`): a rank whose host spins waiting
for a collective is in one, though its stack is at the user's line. The daemon looks at the
ranks of its own node this way (:mod:`supervisor.ranks.slow`); a node agent at the ranks of its
node (:mod:`supervisor.agent`), which sends the result to the daemon.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.process import activity
from supervisor.process.diagnostics import request_flight, stacks_size
from supervisor.rules import culprits
from supervisor.rules.stuck import RankEvidence
from worker_sdk.contract import protocol as p

__all__ = [
    "STACKS_CAP_BYTES",
    "Look",
    "Window",
    "close",
    "evidence",
    "open_window",
    "stacks_since",
]

STACKS_CAP_BYTES = 16 << 20  # a rank's stacks file this large is not added to: /proc alone judges


@dataclass
class Window:
    """A window opened at monotonic ``t0`` on the ranks ``pids`` (pid -> rank)."""

    t0: float
    pids: dict[int, int]
    before: dict[int, activity.ProcSample]  # pid -> sample at t0
    offsets: dict[int, int]  # rank -> size of its stacks file before the dump (asked ones)
    flights: dict[int, tuple[int, int] | None]  # rank -> its flight dump's (inode, mtime) before


@dataclass(frozen=True, slots=True)
class Look:
    """What one rank showed over a window: its evidence, and the stacks it wrote ("" when none
    were asked for or written)."""

    evidence: RankEvidence
    stacks: str


def open_window(diag_dir: Path, pids: Mapping[int, int], now: float) -> Window:
    """Sample every rank and ask those that can answer for their stacks."""
    before = {pid: s for pid in pids if (s := activity.read(pid)) is not None}
    offsets: dict[int, int] = {}
    flights: dict[int, tuple[int, int] | None] = {}
    for pid, rank in pids.items():
        size = stacks_size(diag_dir, rank)
        if pid in before and size < STACKS_CAP_BYTES and activity.catches(pid, p.DUMP_SIGNAL):
            offsets[rank] = size
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, p.DUMP_SIGNAL)
        if pid in before:
            dumped = _flight_id(diag_dir, rank)
            if request_flight(diag_dir, rank):
                flights[rank] = dumped
    return Window(now, dict(pids), before, offsets, flights)


def close(diag_dir: Path, window: Window, now: float) -> list[Look]:
    """Every rank's look over the window, ending ``now`` (a rank gone is unknown)."""
    out = []
    for pid, rank in window.pids.items():
        first, last = window.before.get(pid), activity.read(pid, threads=True)
        if first is None or last is None:
            out.append(Look(RankEvidence(rank), ""))
            continue
        offset = window.offsets.get(rank)
        text = "" if offset is None else stacks_since(diag_dir, rank, offset)
        out.append(
            Look(
                RankEvidence(
                    rank,
                    state=last.state,
                    cpu_s=last.cpu_s - first.cpu_s,
                    window_s=now - window.t0,
                    wchan=last.wchan,
                    frames=tuple(culprits.main_thread(text)),
                    stack_read=offset is not None,
                    threads=last.threads,
                    collective=_under_way(diag_dir, rank, window),
                ),
                text,
            )
        )
    return out


def evidence(diag_dir: Path, window: Window, now: float) -> list[RankEvidence]:
    """The ranks' evidence over the window (:func:`close` without the stacks' text)."""
    return [look.evidence for look in close(diag_dir, window, now)]


def _flight_id(diag_dir: Path, rank: int) -> tuple[int, int] | None:
    """Which flight-recorder dump of ``rank`` is in place (a new one is renamed over it)."""
    try:
        st = os.stat(diag_dir / p.flight_file(rank))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _under_way(diag_dir: Path, rank: int, window: Window) -> str:
    """The collective the dump ``rank`` wrote since the window opened shows under way ("" when
    it was not asked, wrote none yet, or shows none)."""
    if rank not in window.flights or _flight_id(diag_dir, rank) in (None, window.flights[rank]):
        return ""
    try:
        text = (diag_dir / p.flight_file(rank)).read_text(errors="replace")
    except OSError:
        return ""
    return culprits.under_way(text)


def stacks_since(diag_dir: Path, rank: int, offset: int) -> str:
    """What ``rank`` wrote to its stacks file past ``offset``."""
    try:
        with open(diag_dir / p.stacks_file(rank), "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
