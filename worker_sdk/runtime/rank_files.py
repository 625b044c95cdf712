"""A rank's files, for the runtime's start-up (and its end): its step slot and its stack-dump
file under the diagnostics directory (the daemon reads both), and the files its own output goes
to (``rvsup logs``)."""

from __future__ import annotations

import faulthandler
import mmap
import os
from pathlib import Path
from typing import IO

from worker_sdk.contract import protocol as p

from . import flight as _flight
from .settings import Settings

__all__ = ["arm_stack_dumps", "disarm_stack_dumps", "local_rank", "map_step_slot", "output_files"]


def map_step_slot(diag: Path, rank: int) -> tuple[mmap.mmap, memoryview]:
    """The rank's step slot (see ``protocol.step_slot_file``), mapped: the map and the one
    signed 64-bit slot every step() stores the last finished step in."""
    diag.mkdir(parents=True, exist_ok=True)
    fd = os.open(diag / p.step_slot_file(rank), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 8)
        slot_map = mmap.mmap(fd, 8)
    finally:
        os.close(fd)
    return slot_map, memoryview(slot_map).cast("q")


def arm_stack_dumps(settings: Settings, rank: int) -> IO[str] | None:
    """Dump every thread's stack to the rank's stacks file on the dump signal, and arm the
    flight recorder's dump; the file (None without a diagnostics directory)."""
    diag = settings.diagnostics_dir
    if diag is None:
        return None
    diag.mkdir(parents=True, exist_ok=True)
    dump_file = open(diag / p.stacks_file(rank), "a")  # noqa: SIM115
    faulthandler.register(settings.dump_signal, file=dump_file, all_threads=True, chain=False)
    _flight.arm(diag, rank)
    return dump_file


def disarm_stack_dumps(settings: Settings, dump_file: IO[str]) -> None:
    """Undo :func:`arm_stack_dumps` at the rank's end: no more dumps on the signal; the file closed."""
    faulthandler.unregister(settings.dump_signal)
    dump_file.close()


def output_files() -> tuple[str | None, str | None]:
    """The files this process's stdout and stderr are (``rvsup logs`` finds a rank's output by
    them); None for a stream that is not a file (a terminal, a pipe)."""
    return _output_file(1), _output_file(2)


def _output_file(fd: int) -> str | None:
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return path if path.startswith("/") else None


def local_rank() -> int:
    """``LOCAL_RANK``: the rank's index on its node."""
    return int(os.environ.get("LOCAL_RANK", "0"))
