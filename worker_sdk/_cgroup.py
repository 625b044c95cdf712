"""Where a process sits in the cgroup v2 hierarchy, and how it moves itself into another group.

Standard library only: the bootstrap, the zygote's forked children and the daemon all use it.
Nothing is assumed about where the hierarchy is mounted: the mount is found in
``/proc/self/mountinfo`` (type ``cgroup2``; on a hybrid host it sits beside the v1 controllers,
on a pure v2 host it is ``/sys/fs/cgroup`` itself) and the process's own group in
``/proc/self/cgroup`` (the line ``0::/path``). No controller is needed: only membership
(``cgroup.procs``), ``cgroup.events`` (``populated``) and ``cgroup.kill``.
"""

from __future__ import annotations

import os
import re

__all__ = ["group_dir", "join", "mount_points", "own_group", "own_group_dir", "to_join"]


def mount_points(mountinfo: str) -> list[tuple[str, str]]:
    """(root, mount point) of every cgroup2 mount listed in ``mountinfo``'s text."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or right.split()[:1] != ["cgroup2"]:
            continue
        found.append((_unescape(fields[3]), _unescape(fields[4])))
    return found


def own_group(cgroup: str) -> str | None:
    """The v2 group (``/a/b``) in ``/proc/PID/cgroup``'s text, or None."""
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def group_dir(mounts: list[tuple[str, str]], group: str) -> str | None:
    """The directory of ``group`` under the first mount that shows it (None: none does)."""
    for root, point in mounts:
        if root == "/":
            rest = group
        elif group == root or group.startswith(root.rstrip("/") + "/"):
            rest = group[len(root.rstrip("/")) :]
        else:
            continue
        path = os.path.join(point, rest.lstrip("/")).rstrip("/") or "/"
        if os.path.isdir(path):
            return path
    return None


def own_group_dir() -> str | None:
    """This process's v2 cgroup directory, or None (no v2 hierarchy, or it is not mounted)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = mount_points(f.read())
        with open("/proc/self/cgroup") as f:
            group = own_group(f.read())
    except OSError:
        return None
    if group is None or not mounts:
        return None
    return group_dir(mounts, group)


def to_join(wanted: object, own: str | None) -> str | bool | None:
    """The cgroup directory a process now in ``own`` must move into to be in ``wanted``; None
    when it need not move, False when it may not."""
    if not isinstance(wanted, str) or wanted == own:
        return None
    if not os.access(os.path.join(wanted, "cgroup.procs"), os.W_OK):
        return False
    return wanted


def join(directory: str) -> None:
    """Move this process into the cgroup ``directory`` (raises OSError when it may not)."""
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
