"""What a rank's (or the launcher's) exit status means, and how it reads in a failure's detail.

Exit statuses follow the POSIX shell convention as well: a code ``128 + N`` (from a wrapper shell
or ``srun``) means "killed by signal N", and a negative launcher status ``-N`` (Python's
``returncode``) means the same. Pure: :mod:`.failures` classifies with these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from supervisor.rules.observation import RankExit, signal_name
from worker_sdk.contract.protocol import EXIT_OOM, EXIT_SYNC_TIMEOUT, EXIT_USAGE

__all__ = [
    "codes_and_signals",
    "ending_text",
    "is_failure",
    "launcher_text",
    "rank_text",
    "signal_from_status",
    "signal_of",
]

_SHELL_SIGNAL_BASE: Final = 128
_MAX_SIGNAL: Final = 64
_EXIT_MEANINGS: Final[Mapping[int, str]] = {
    EXIT_OOM: "out of memory",
    EXIT_SYNC_TIMEOUT: "a coordinated save timed out",
    EXIT_USAGE: "the script called worker_sdk wrongly",
}


def signal_of(e: RankExit) -> int | None:
    """The signal that ended ``e``: explicit, negative status, or a shell-style 128+N."""
    if e.signal is not None:
        return e.signal
    return signal_from_status(e.exit_code)


def signal_from_status(status: int | None) -> int | None:
    if status is None:
        return None
    if status < 0:
        return -status
    if _SHELL_SIGNAL_BASE < status <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
        return status - _SHELL_SIGNAL_BASE
    return None


def is_failure(e: RankExit) -> bool:
    return signal_of(e) is not None or (e.exit_code is not None and e.exit_code != 0)


def codes_and_signals(exits: Iterable[RankExit]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    codes: list[int] = []
    sigs: list[str] = []
    for e in exits:
        if e.exit_code is not None and e.exit_code >= 0:
            codes.append(e.exit_code)
        signum = signal_of(e)
        if signum is not None:
            sigs.append(signal_name(signum))
    return tuple(codes), tuple(sigs)


def ending_text(e: RankExit) -> str:
    signum = signal_of(e)
    if signum is not None:
        text = f"killed by {signal_name(signum)}"
        if e.exit_code is not None and e.exit_code > 0:
            text += f" (exit code {e.exit_code})"
        return text
    if e.exit_code is None:
        return "ended with an unknown status"
    meaning = _EXIT_MEANINGS.get(e.exit_code)
    return f"exited with code {e.exit_code}" + (f" ({meaning})" if meaning else "")


def launcher_text(status: int | None) -> str:
    if status is None:
        return "launcher exited without any rank reporting a failure"
    signum = signal_from_status(status)
    if signum is not None:
        return f"launcher killed by {signal_name(signum)}"
    return f"launcher exited with code {status}"


def rank_text(e: RankExit) -> str:
    return f"rank {e.rank}" if e.rank is not None else f"pid {e.pid} (rank unknown)"
