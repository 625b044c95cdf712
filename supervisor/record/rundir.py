"""The run directory's layout: every path rvsup writes under ``job.run_dir``, named once.

::

    <run_dir>/events.jsonl                  the history (supervisor.record.events)
    <run_dir>/secret                        the per-job secret, 0600
    <run_dir>/lock                          held by the one daemon of the job
    <run_dir>/daemon.json                   how `rvsup status|stop` reach the daemon
    <run_dir>/ctl/                          0700: the rank channel's and the control socket
    <run_dir>/logs/attempt-N/               torchrun's per-rank stdout/stderr of attempt N
    <run_dir>/diagnostics/attempt-N/        stacks of every rank before a hang was killed
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = [
    "DAEMON_FILE",
    "EVENTS_FILE",
    "LOCK_FILE",
    "SECRET_FILE",
    "attempt_name",
    "diagnostics_dir",
    "logs_dir",
]

EVENTS_FILE: Final = "events.jsonl"
SECRET_FILE: Final = "secret"
LOCK_FILE: Final = "lock"
DAEMON_FILE: Final = "daemon.json"


def attempt_name(attempt: int) -> str:
    """``attempt-3``: the folder of attempt 3 under ``logs/`` and ``diagnostics/``."""
    return f"attempt-{attempt}"


def logs_dir(run_dir: Path, attempt: int) -> Path:
    """Where torchrun writes the ranks' output of ``attempt``."""
    return run_dir / "logs" / attempt_name(attempt)


def diagnostics_dir(run_dir: Path, attempt: int) -> Path:
    """Where the ranks of ``attempt`` write their stacks when a hang is caught."""
    return run_dir / "diagnostics" / attempt_name(attempt)
