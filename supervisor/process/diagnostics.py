"""Evidence from the ranks' node: the Python stacks and flight recorders of a hung group, the
ranks' step slots.

The SDK arms faulthandler on ``protocol.DUMP_SIGNAL`` (SIGUSR2) in ``resume()``, writing every
thread's stack to ``<run_dir>/diagnostics/attempt-N/rank-NNNNN.stacks``. faulthandler's handler
is C code, so it answers even while the rank blocks in a collective or holds the GIL in a loop.
Where c10d records collectives, a byte written to ``rank-NNNNN.flight.fifo`` makes the rank dump
torch's flight recorder to ``rank-NNNNN.flight.json`` (see worker_sdk.runtime.flight). Where py-spy
is installed, ``rank-NNNNN.native`` holds the native stacks (see :mod:`supervisor.process.native`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from supervisor.process import activity, native
from worker_sdk.contract import protocol as p

__all__ = [
    "DUMP_WAIT_S",
    "collect_stacks",
    "note_stopped",
    "read_flights",
    "read_stacks",
    "read_steps",
    "read_stopped",
    "request_flight",
    "stacks_size",
]

DUMP_WAIT_S = 1.0  # the longest the ranks get to write their stacks
_SETTLE_S = 0.05  # a dump is complete once its file has not grown for this long


def stopped_file(rank: int) -> str:
    """``rank-00001.stopped``: written when rank ``rank`` was found stopped (state T)."""
    return f"rank-{rank:05d}.stopped"


async def collect_stacks(
    ranks: Mapping[int, int],
    directory: Path,
    py_spy: str | None = None,
    *,
    native_taken: frozenset[int] = frozenset(),
) -> str | None:
    """Signal every rank (pid -> rank) and wait until each has written, at most DUMP_WAIT_S;
    ask the ranks that serve one for their flight recorder; with ``py_spy``, take the native
    stacks (at most native.NATIVE_WAIT_S) of every rank not in ``native_taken`` (whose native
    stacks are in ``directory`` already, taken while the hang was being confirmed).

    A stopped rank is noted (``rank-NNNNN.stopped``: it is a culprit whatever its dump says) and
    answers last: first the running ranks dump (they cannot progress while it is stopped). With
    py-spy, the stopped ranks' Python stacks are then read without continuing them; without it,
    the running ranks are stopped in turn and the stopped ranks continued to answer, then
    stopped again. So no rank finishes a step or commits a checkpoint after the hang was caught
    (the teardown continues every rank it terminates) and, with py-spy, a stopped rank does not
    even run (a single process, which no other rank waits for, would otherwise train on for the
    moment its dump takes, and the next attempt's resume point race with it). Files are polled,
    and the wait ends as soon as every rank's file has grown and then stayed the same for a
    moment (a dump in progress is not read half written). Returns the directory, or None when
    nothing was written.
    """
    stopped = {pid: rank for pid, rank in ranks.items() if activity.is_stopped(pid)}
    running = {pid: rank for pid, rank in ranks.items() if pid not in stopped}
    for rank in stopped.values():
        note_stopped(directory, rank)
    await _dump(running, directory, py_spy, native_taken)
    if stopped and py_spy is not None:
        await native.collect_stopped(stopped, directory, py_spy)
    elif stopped:
        _signal_all(running, signal.SIGSTOP)
        await _dump(stopped, directory, py_spy, native_taken, continued=True)
        _signal_all(stopped, signal.SIGSTOP)
    return str(directory) if directory.is_dir() else None


async def _dump(
    ranks: Mapping[int, int],
    directory: Path,
    py_spy: str | None,
    native_taken: frozenset[int],
    *,
    continued: bool = False,
) -> None:
    """Stacks, flight recorders and native stacks of ``ranks``; with ``continued``, the ranks
    are stopped and continued once signalled (they handle the pending signal then)."""
    if not ranks:
        return
    files = {pid: directory / p.stacks_file(rank) for pid, rank in ranks.items()}
    sizes = {pid: stacks_size(directory, rank) for pid, rank in ranks.items()}
    _signal_all(ranks, p.DUMP_SIGNAL)
    if continued:
        _signal_all(ranks, signal.SIGCONT)
    flights: dict[Path, tuple[int, int] | None] = {}
    unasked = set(ranks.values())  # a rank continued just now may not be reading its FIFO yet
    deadline = time.monotonic() + DUMP_WAIT_S
    waiting = set(files)
    grew_at: dict[int, float] = {}
    while (waiting or flights or unasked) and time.monotonic() < deadline:
        for rank in list(unasked):
            path = directory / p.flight_file(rank)
            before = _identity(path)
            asked = request_flight(directory, rank)
            if asked is not None:
                unasked.discard(rank)
            if asked:
                flights[path] = before
        await asyncio.sleep(0.01)
        now = time.monotonic()
        for pid in list(waiting):
            size = stacks_size(directory, ranks[pid])
            if size != sizes[pid]:
                sizes[pid], grew_at[pid] = size, now
            elif pid in grew_at and now - grew_at[pid] >= _SETTLE_S:
                waiting.discard(pid)  # written, and no longer growing: the dump is complete
        for path, before in list(flights.items()):
            if _identity(path) != before:
                del flights[path]  # renamed into place: complete
    untaken = {pid: rank for pid, rank in ranks.items() if rank not in native_taken}
    if py_spy is not None and untaken:  # after the dumps: py-spy suspends a rank while reading
        directory.mkdir(parents=True, exist_ok=True)
        await native.collect_native(untaken, directory, py_spy)  # each py-spy has a deadline


def _signal_all(ranks: Mapping[int, int], sig: signal.Signals) -> None:
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def request_flight(directory: Path, rank: int) -> bool | None:
    """Ask rank ``rank`` for a flight-recorder dump: True when asked; False when it does not
    serve one (no FIFO: collectives not recorded, or an older SDK); None when nobody reads the
    FIFO right now (a stopped rank's read is interrupted until it is continued): ask again."""
    try:
        fd = os.open(directory / p.flight_fifo_file(rank), os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        return None if e.errno == errno.ENXIO else False
    try:
        os.write(fd, b"d")
    except OSError:
        return None
    finally:
        os.close(fd)
    return True


def read_flights(directory: Path, world_size: int) -> dict[int, str]:
    """The flight-recorder dumps (torch's JSON) of the ranks that wrote one in ``directory``."""
    dumps: dict[int, str] = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError):
            dumps[rank] = (directory / p.flight_file(rank)).read_text(errors="replace")
    return dumps


def read_stacks(directory: Path, world_size: int) -> dict[int, str]:
    """The dumped stacks of the ranks whose file is in ``directory`` (on another node's disk a
    rank's file may not be: it is then left out)."""
    dumps: dict[int, str] = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError):
            dumps[rank] = (directory / p.stacks_file(rank)).read_text(errors="replace")
    return dumps


def read_stopped(directory: Path, world_size: int) -> frozenset[int]:
    """The ranks :func:`collect_stacks` found stopped by a signal (SIGSTOP, SIGTSTP, a debugger)."""
    return frozenset(r for r in range(world_size) if (directory / stopped_file(r)).exists())


def read_steps(directory: Path, ranks: Iterable[int]) -> dict[int, int]:
    """The exact last finished step of each rank whose step slot is in ``directory``."""
    steps = {rank: p.read_step_slot(directory / p.step_slot_file(rank)) for rank in ranks}
    return {rank: step for rank, step in steps.items() if step is not None}


def note_stopped(directory: Path, rank: int) -> None:
    """Note in ``directory`` that ``rank`` was found stopped (``rank-NNNNN.stopped``)."""
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / stopped_file(rank)).write_text(
            "stopped by a signal (process state T) when the hang was caught; its Python stacks "
            "read by py-spy without continuing it (so no flight recorder of its own) or, without "
            "py-spy, continued to dump, then stopped again\n"
        )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def stacks_size(directory: Path, rank: int) -> int:
    """The size of ``rank``'s stacks file in ``directory`` (0: none yet)."""
    try:
        return (directory / p.stacks_file(rank)).stat().st_size
    except OSError:
        return 0
