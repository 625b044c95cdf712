"""Where a process sits in the cgroup v2 hierarchy, and how it is placed into a group.

One rule for every process rvsup starts: **the process that starts it places it** (the daemon
its launchers, standby and zygote; the zygote the ranks it forks; a node's wrapper its
torchrun), with :func:`place`, before the process runs anything of its own; the process itself
moves nothing, and only checks that it is where it was meant to be (:func:`wait_placed`).
Groups are never moved between: a process stays in the group it was placed in until it ends.

Standard library only: the bootstrap, the zygote and its forked children and the daemon all use
it.
Nothing is assumed about where the hierarchy is mounted: the mount is found in
``/proc/self/mountinfo`` (type ``cgroup2``; on a hybrid host it sits beside the v1 controllers,
on a pure v2 host it is ``/sys/fs/cgroup`` itself) and the process's own group in
``/proc/self/cgroup`` (the line ``0::/path``). No controller is needed: only membership
(``cgroup.procs``), ``cgroup.events`` (``populated``) and ``cgroup.kill``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

__all__ = [
    "Group",
    "group_dir",
    "join_memory_group",
    "leave_memory_group",
    "mount_points",
    "own_group",
    "own_group_dir",
    "own_memory_v1_dir",
    "place",
    "placement",
    "stale_groups",
    "wait_placed",
]

_EMPTY_WAIT_S = 1.0


def mount_points(mountinfo: str, *, v1_controller: str | None = None) -> list[tuple[str, str]]:
    """(root, mount point) of every cgroup2 mount listed in ``mountinfo``'s text, or, given
    ``v1_controller`` (``"memory"``), of every cgroup v1 mount of that controller."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        if v1_controller is None:
            if tail[0] != "cgroup2":
                continue
        elif tail[0] != "cgroup" or len(tail) < 3 or v1_controller not in tail[2].split(","):
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


def own_group_dir(pid: int | str = "self") -> str | None:
    """This process's (or process ``pid``'s) v2 cgroup directory, or None (no v2 hierarchy, it
    is not mounted, or the process is gone)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = mount_points(f.read())
        with open(f"/proc/{pid}/cgroup") as f:
            group = own_group(f.read())
    except OSError:
        return None
    if group is None or not mounts:
        return None
    return group_dir(mounts, group)


def own_memory_v1_dir(pid: int | str = "self") -> str | None:
    """This process's (or process ``pid``'s) cgroup v1 memory group directory, or None (no v1
    memory controller mounted, or the process is gone)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = mount_points(f.read(), v1_controller="memory")
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if "memory" in controllers.split(","):
            return group_dir(mounts, group)
    return None


def placement(wanted: object, own: str | None) -> str | bool | None:
    """The cgroup directory a process started by one now in ``own`` must be placed into to be in
    ``wanted``; None when it need not be placed (it is there by birth), False when it may not."""
    if not isinstance(wanted, str) or wanted == own:
        return None
    if not os.access(os.path.join(wanted, "cgroup.procs"), os.W_OK):
        return False
    return wanted


def place(pid: int, directory: str) -> None:
    """Move process ``pid`` (all its threads) into the cgroup ``directory``: what the process
    that started it does, before it lets it run (raises OSError when it may not)."""
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def wait_placed(held: int, directory: str) -> str | None:
    """In a process just started: wait until the process that started it has placed it (it
    closes its end of the pipe whose read end is ``held``), then check it is in ``directory``;
    None when it is, else what is wrong."""
    try:
        while os.read(held, 512):
            pass
    finally:
        os.close(held)
    here = own_group_dir()
    if here != directory:
        return f"it is in the cgroup {here}, not in {directory}, where it was to be placed"
    return None


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


class Group:
    """One cgroup v2 directory and everything below it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pids(self) -> set[int]:
        """Every process in the group or a group below it."""
        found: set[int] = set()
        for directory, _, files in os.walk(self.path):
            if "cgroup.procs" not in files:
                continue
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in Path(directory, "cgroup.procs").read_text().split())
        return found

    def populated(self) -> bool:
        """Some process still lives in it (``cgroup.events``); False once it is gone."""
        try:
            text = (self.path / "cgroup.events").read_text()
        except OSError:
            return False
        return "populated 1" in text.splitlines()

    def kill(self) -> None:
        """SIGKILL every member at once (``cgroup.kill``, Linux 5.14), else one by one."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def wait_empty(self, timeout_s: float) -> bool:
        """Until no process is left in it (monotonic deadline); False when some still are."""
        deadline = time.monotonic() + timeout_s
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def remove(self) -> bool:
        """Remove the group and the groups below it (False when a process is still inside)."""
        ok = True
        for directory, _, _ in sorted(os.walk(self.path), key=lambda w: -len(w[0])):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok

    def end(self) -> bool:
        """Kill everything in it and remove it; False when something could not be ended."""
        if not self.path.is_dir():
            return True
        self.kill()
        return self.wait_empty(_EMPTY_WAIT_S) and self.remove()


def stale_groups(parent: Path, prefix: str) -> list[Group]:
    """The groups ``PREFIX-PID`` under ``parent`` whose process ``PID``, which made them, is
    gone (killed before it could end what was left in them)."""
    out = []
    for path in sorted(parent.glob(prefix + "*")):
        pid = path.name.removeprefix(prefix)
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            out.append(Group(path))
    return out


def join_memory_group(prefix: str) -> tuple[Path, str] | str | None:
    """A cgroup v1 memory group ``PREFIX-PID`` (this pid) made under this process's own, with
    this process placed in it, so that whatever it starts is in it too (empty groups of the
    same prefix whose process is gone are removed first); and the group it was in. None: no v1
    memory controller; a text: why no group could be made or joined there."""
    own = own_memory_v1_dir()
    if own is None:
        return None
    for gone in stale_groups(Path(own), prefix):
        gone.remove()  # what is still in one is ended by its owner's next start
    path = Path(own) / f"{prefix}{os.getpid()}"
    try:
        path.mkdir(exist_ok=True)  # left by a process gone with our pid: ours now
        place(os.getpid(), str(path))
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.rmdir()
        return f"cannot use a cgroup v1 memory group under {own}: {exc.strerror or exc}"
    return path, own


def leave_memory_group(path: Path, own: str) -> None:
    """Back to the group ``own`` this process was in, and its memory group ``path`` removed (once
    empty: what it started has ended)."""
    with contextlib.suppress(OSError):
        place(os.getpid(), own)
    Group(path).remove()
