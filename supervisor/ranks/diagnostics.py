"""Evidence from the ranks' node: the Python stacks of a hung group, the ranks' step slots.

The SDK arms faulthandler on ``protocol.DUMP_SIGNAL`` (SIGUSR2) in ``resume()``, writing every
thread's stack to ``<run_dir>/diagnostics/attempt-N/rank-NNNNN.stacks``. faulthandler's handler
is C code, so it answers even while the rank blocks in a collective or holds the GIL in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from supervisor.process import proctree
from worker_sdk import protocol as p

__all__ = ["DUMP_WAIT_S", "collect_stacks", "read_stacks", "read_steps"]

DUMP_WAIT_S = 1.0  # the longest the ranks get to write their stacks


async def collect_stacks(ranks: Mapping[int, int], directory: Path) -> str | None:
    """Signal every rank (pid -> rank) and wait until each has written, at most DUMP_WAIT_S.

    A stopped rank is continued so that it can answer; to keep that window (in which it runs
    again) short, the files are polled and the wait ends as soon as every rank has written.
    Returns the directory, or None when nothing was written.
    """
    files = {pid: directory / p.stacks_file(rank) for pid, rank in ranks.items()}
    before = {pid: _size(path) for pid, path in files.items()}
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, p.DUMP_SIGNAL)
            if proctree.is_stopped(pid):
                os.kill(pid, signal.SIGCONT)  # it handles the pending signal once continued
    deadline = time.monotonic() + DUMP_WAIT_S
    waiting = set(files)
    while waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        grown = {pid for pid in waiting if _size(files[pid]) > before[pid]}
        if grown:
            await asyncio.sleep(0.02)  # let a dump in progress finish
        waiting -= grown
    return str(directory) if directory.is_dir() else None


def read_stacks(directory: Path, world_size: int) -> dict[int, str]:
    """The dumped stacks of the ranks whose file is in ``directory`` (on another node's disk a
    rank's file may not be: it is then left out)."""
    dumps: dict[int, str] = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError):
            dumps[rank] = (directory / p.stacks_file(rank)).read_text(errors="replace")
    return dumps


def read_steps(directory: Path, ranks: Iterable[int]) -> dict[int, int]:
    """The exact last finished step of each rank whose step slot is in ``directory``."""
    steps = {rank: p.read_step_slot(directory / p.step_slot_file(rank)) for rank in ranks}
    return {rank: step for rank, step in steps.items() if step is not None}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
