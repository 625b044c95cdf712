"""Each pytest process of the suite in a cgroup of its own: ``rvtest-PID`` under the group it
was started in (cgroup v2, where one can be made; otherwise nothing changes).

An ``rvsup start`` makes its job's group beside the groups of the other daemons that run in
its own group, and ends what a daemon killed by SIGKILL left in its groups there
(``supervisor/process/cgroup.py``). Two xdist workers in one group would see each other's
dead daemons: a start in one worker would end, meanwhile, what a test of the other worker
killed a daemon to look at. In a group per process, a start sees only the daemons its own
process's tests started, so a test that kills a daemon shares the machine like any other.

The group is left (the process moves back to its parent group) and removed at exit; groups of
earlier suite processes that are gone (killed) are removed when empty. An xdist worker's group
is made inside its controller's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
from pathlib import Path

from worker_sdk.spawn import cgroup as _cgroup

__all__ = ["PREFIX", "enter_own_group", "in_own_group"]

PREFIX = "rvtest-"


def enter_own_group() -> str | None:
    """Move this process into a new ``rvtest-PID`` group under its own; the group it is in
    after that (None: no cgroup v2 group at all)."""
    own = _cgroup.own_group_dir()
    if own is None:
        return None
    parent = Path(own)  # an xdist worker's group is made inside its controller's
    for gone in _cgroup.stale_groups(parent, PREFIX):
        if not gone.populated():
            _remove_tree(gone.path)
    path = parent / f"{PREFIX}{os.getpid()}"
    try:
        path.mkdir(exist_ok=True)
        _cgroup.place(os.getpid(), str(path))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return own
    atexit.register(_leave, parent, path)
    return str(path)


@functools.cache
def in_own_group() -> bool:
    """Whether this process is in a group of its own (``enter_own_group`` made one)."""
    own = _cgroup.own_group_dir()
    return own is not None and Path(own).name == f"{PREFIX}{os.getpid()}"


def _leave(parent: Path, path: Path) -> None:
    """Back to the parent group; the group removed (it is empty once the suite's last check
    has ended what was left in it)."""
    with contextlib.suppress(OSError):
        _cgroup.place(os.getpid(), str(parent))
        path.rmdir()


def _remove_tree(path: Path) -> None:
    """An empty group and the empty groups inside it (an xdist worker's in its controller's,
    rvsup's in a worker's), deepest first."""
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
