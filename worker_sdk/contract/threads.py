"""The kernel names rvsup gives the threads it starts in a rank.

The hang rule (``supervisor.rules.stuck``) reads a rank's threads to tell a main thread that
waits on a thread of the user's (an upload, a logger's flush: busy) from a deadlock. rvsup's own
threads in the rank (the flight recorder's reader, the memory tier's replica server and its
authenticator) wait all the time and say nothing about the user's wait, so they carry a name
that starts with :data:`PREFIX`, which the rule leaves out.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Final

__all__ = ["PREFIX", "name_os_thread"]

PREFIX: Final = "rvsup-"
_COMM_MAX = 15  # the kernel keeps this many bytes of a thread's name


def name_os_thread(thread: threading.Thread, name: str) -> None:
    """Give the started ``thread`` the kernel name ``rvsup-<name>`` (as ``/proc/.../comm``
    shows it); nothing where /proc cannot be written."""
    tid = thread.native_id
    if tid is None:
        return
    with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm", "w") as f:
        f.write((PREFIX + name)[:_COMM_MAX])
