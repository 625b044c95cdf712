"""``rvsup logs``: the ranks' stdout and stderr of an attempt, printed or followed.

By default the latest attempt, every rank, each line prefixed ``[rank N]`` (a rank's stdout,
then its stderr); ``--rank`` shows one rank's lines as they are. ``-f`` follows like ``tail -F``:
the lines of the attempt as they are written, then the next attempt's after a restart, until the
daemon has ended and everything is shown. The files are found through
:mod:`supervisor.record.rank_logs`; nothing here needs the daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from supervisor.record import rank_logs
from supervisor.record.rank_logs import RankLogs

__all__ = ["LogsError", "follow", "show"]

_POLL_S = 0.2


class LogsError(Exception):
    """An attempt or a rank that is not there; the message says what is."""


def show(run_dir: Path, out: TextIO, *, attempt: int | None, rank: int | None) -> None:
    """Print the chosen attempt's output once."""
    number = _choose_attempt(run_dir, attempt)
    assert number is not None  # allow_none is off: no attempt raises
    for logs in _choose_ranks(run_dir, number, rank, waiting=False):
        prefix = "" if rank is not None else f"[rank {logs.rank}] "
        for path in (logs.stdout, logs.stderr):
            tail = _Tail(path)
            tail.emit(out, prefix, final=True)


def follow(
    run_dir: Path,
    out: TextIO,
    *,
    attempt: int | None,
    rank: int | None,
    running: Callable[[], bool],
    poll_s: float = _POLL_S,
) -> None:
    """Print the attempt's output as it is written and go on with each later attempt, until
    ``running()`` says the daemon has ended and the last lines are out."""
    number = _choose_attempt(run_dir, attempt, allow_none=True)
    tails: dict[Path, _Tail] = {}
    while True:
        alive = running()  # before the last read: what is written before it ended is shown
        if number is not None:
            for logs in _choose_ranks(run_dir, number, rank, waiting=True):
                prefix = "" if rank is not None else f"[rank {logs.rank}] "
                for path in (logs.stdout, logs.stderr):
                    tails.setdefault(path, _Tail(path)).emit(out, prefix, final=not alive)
        newer = [n for n in rank_logs.attempts(run_dir) if number is None or n > number]
        if newer:
            if number is not None:
                for tail in tails.values():
                    tail.emit(out, tail.prefix, final=True)
            number, tails = newer[0], {}
            out.write(f"==> attempt {number} <==\n")
            out.flush()
            continue
        if not alive:
            return
        time.sleep(poll_s)


def _choose_attempt(run_dir: Path, attempt: int | None, *, allow_none: bool = False) -> int | None:
    known = rank_logs.attempts(run_dir)
    if attempt is None:
        if known:
            return known[-1]
        if allow_none:
            return None
        raise LogsError(f"no attempt has written logs in {run_dir / 'logs'} yet")
    if attempt not in known:
        have = f"attempts {_spans(known)}" if known else "none yet"
        raise LogsError(f"no logs of attempt {attempt} in {run_dir / 'logs'} ({have})")
    return attempt


def _choose_ranks(
    run_dir: Path, attempt: int, rank: int | None, *, waiting: bool
) -> list[RankLogs]:
    found = rank_logs.find(run_dir, attempt)
    if rank is None:
        return found
    chosen = [logs for logs in found if logs.rank == rank]
    if not chosen and found and not waiting:
        ranks = _spans([logs.rank for logs in found])
        raise LogsError(f"attempt {attempt} has no rank {rank} (ranks {ranks})")
    return chosen


def _spans(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    parts: list[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


@dataclass(slots=True)
class _Tail:
    """One file read from where the last read ended; a line is shown once it is complete
    (or, at the end, whatever is left)."""

    path: Path
    offset: int = 0
    pending: bytes = b""
    prefix: str = field(default="")

    def emit(self, out: TextIO, prefix: str, *, final: bool) -> None:
        self.prefix = prefix
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:  # not written yet, or gone with a cleaned run directory
            chunk = b""
        self.offset += len(chunk)
        data = self.pending + chunk
        *lines, self.pending = data.split(b"\n")
        if final and self.pending:
            lines.append(self.pending)
            self.pending = b""
        if lines:
            out.writelines(f"{prefix}{line.decode(errors='replace')}\n" for line in lines)
            out.flush()
