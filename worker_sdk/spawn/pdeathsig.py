"""The parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``): a process that must not outlive
its parent asks the kernel to kill it when the parent goes.

Standard library only: the zygote loads this package by path on the job's interpreter.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Final

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG: Final = 1


def die_with_parent(sig: int = signal.SIGKILL, *, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits; False where
    it cannot (not Linux, or the call failed). With ``parent`` (the pid this process was started
    by), exit at once with status 1 if that parent is already gone: it may have died before the
    request took effect, and then no signal would ever come."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
        except (OSError, AttributeError):
            armed = False
    if parent is not None and os.getppid() != parent:
        os._exit(1)
    return armed
