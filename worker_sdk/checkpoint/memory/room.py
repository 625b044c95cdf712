"""Whether this node has room for the memory tier's snapshots, asked before any is staged.

A snapshot lives in host memory twice over: in each rank's staging arena (``memfd``) and as the
files of the snapshot directory (tmpfs). Both are charged to the job's memory cgroup, and a
cgroup over its limit does not fail the write: the kernel's OOM killer kills a process of the
job (a rank), so a tier that outgrows the job's memory limit would turn every attempt into an
``oom`` failure. The tier therefore asks before each staging arena is allocated or grown (the
first snapshot of an attempt, and a state that grew) whether what the snapshots will need on
this node fits, and turns itself off for the attempt (``memory_tier_off``, with the figures)
when it does not. Storage checkpoints go on.

What the snapshots need on a node, with ``L`` ranks per node on ``N`` nodes: the snapshot
directory at its fullest, :data:`SNAPSHOTS_AT_ONCE` snapshots (the two kept and the one being
written), each of them the state saved once (the replicated state of plain and DDP models,
which rank 0 saves for every rank) and the part of every rank whose copy this node keeps
(``L * N``: on several nodes, every node keeps every snapshot), less what the directory holds
already (an earlier attempt's snapshots, replaced as new ones commit); and the staging arenas.
Each rank works it out from its own sizes: rank 0 knows the state saved once, and takes the
other ranks' parts as large as its own part; the others take every rank's part as large as
theirs (sharded state: shards of about one size). One rank's figure that does not fit turns
the tier off for every rank.

The room: the tmpfs's free space (for the directory), and the memory left (for both): the
least, over the process's memory cgroups (v2, or v1's memory controller) and their ancestors
that have a limit, of the limit less the working set (the usage less the inactive file cache,
which the kernel reclaims first), and the host's ``MemAvailable``. The snapshots may take
:data:`SHARE` of it: the training's own memory may still grow after its first step.

Standard library only; the figures are read from ``/proc`` and the cgroup files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from worker_sdk.spawn import cgroup as _cgroup

__all__ = [
    "SHARE",
    "SNAPSHOTS_AT_ONCE",
    "Need",
    "NoRoomError",
    "Room",
    "bytes_in",
    "cgroup_headroom",
    "left_in",
    "measure",
    "memory_groups",
    "need",
    "shortfall",
    "working_set",
]

SHARE: Final = 0.5  # of the memory left (and of the tmpfs's free space) the snapshots may take
SNAPSHOTS_AT_ONCE: Final = 3  # the two kept, and the one being written
_UNLIMITED: Final = 2**60  # v1 reports "no limit" as a huge number (page-rounded LONG_MAX)
_MIB: Final = 2**20


class NoRoomError(MemoryError):
    """The snapshots would not fit this node's memory: the tier turns off for the attempt."""


@dataclass(frozen=True)
class Room:
    """What this node has free for snapshots, in bytes (None: not known, no bound)."""

    tmpfs_free: int | None
    memory_free: int | None
    memory_where: str  # what bounds memory_free: "cgroup /path" or "the host"


@dataclass(frozen=True)
class Need:
    """What the snapshots would add on this node, in bytes."""

    snapshots: int  # in the snapshot directory, at its fullest, beyond what it holds
    arenas: int  # staging arenas still to allocate (or grow)

    @property
    def memory(self) -> int:
        return self.snapshots + self.arenas


def need(
    *,
    arena_growth: int,
    once: int,
    per_rank: int,
    once_growing: bool,
    ranks_here: int,
    nodes: int,
    held: int,
) -> Need:
    """What this node's snapshots need beyond what it holds (module docstring). A snapshot is
    ``once`` bytes held once per node (the replicated state rank 0 saves for every rank) and
    ``per_rank`` bytes for each rank whose copy the node keeps; the directory, which holds
    ``held`` bytes, reaches :data:`SNAPSHOTS_AT_ONCE` of them. An arena grows by
    ``arena_growth`` bytes: once when it is the ``once`` arena (``once_growing``), else on each
    of the node's ``ranks_here`` ranks."""
    if min(arena_growth, once, per_rank, held) < 0 or ranks_here < 1 or nodes < 1:
        raise ValueError(
            f"bad sizes: {arena_growth}, {once}, {per_rank}, {ranks_here}, {nodes}, {held}"
        )
    fullest = SNAPSHOTS_AT_ONCE * (once + per_rank * ranks_here * nodes)
    arenas = arena_growth if once_growing else arena_growth * ranks_here
    return Need(snapshots=max(0, fullest - held), arenas=arenas)


def shortfall(needed: Need, room: Room, directory: Path, share: float = SHARE) -> str | None:
    """Why the snapshots do not fit (a sentence with the figures), or None when they do."""
    if room.tmpfs_free is not None and needed.snapshots > share * room.tmpfs_free:
        return (
            f"No space for snapshots in {directory}: they need about {_mib(needed.snapshots)} "
            f"more on this node, {_mib(room.tmpfs_free)} is free there (the tier takes at "
            f"most {share:.0%} of it); set memory_dir to a larger tmpfs or memory_every_steps "
            f'= "off"'
        )
    if room.memory_free is not None and needed.memory > share * room.memory_free:
        return (
            f"not enough memory for snapshots: they need about {_mib(needed.memory)} more on "
            f"this node (staging {_mib(needed.arenas)}, files {_mib(needed.snapshots)}), "
            f"{room.memory_where} leaves {_mib(room.memory_free)} (the tier takes at most "
            f"{share:.0%} of it)"
        )
    return None


def measure(directory: Path) -> Room:
    """The room there is now for snapshots in ``directory`` (its nearest existing folder)."""
    tmpfs = None
    here = Path(directory)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        st = os.statvfs(here)
        tmpfs = st.f_bavail * st.f_frsize
    except OSError:
        pass
    free, where = None, "the host"
    host = _host_available()
    if host is not None:
        free = host
    for path, left in cgroup_headroom():
        if free is None or left < free:
            free, where = left, f"the memory limit of cgroup {path}"
    return Room(tmpfs, free, where)


def bytes_in(directory: Path) -> int:
    """The bytes the files under ``directory`` take (0 when it is not there)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # removed meanwhile (a prune)
    return total


def working_set(usage: int, stat: str, *, v2: bool) -> int:
    """A cgroup's usage less its inactive file cache (``memory.stat``'s text), never below 0."""
    key = "inactive_file" if v2 else "total_inactive_file"
    for line in stat.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return max(0, usage - int(value))
    return usage


def cgroup_headroom() -> Iterator[tuple[str, int]]:
    """(group, limit less working set) for each memory cgroup of this process, and each of
    their ancestors, that has a limit: v2's ``memory.max``, v1's ``memory.limit_in_bytes``."""
    for directory, v2 in memory_groups():
        here = Path(directory)
        while True:
            left = left_in(here, v2=v2)
            if left is not None:
                yield str(here), left
            if here == here.parent or not (here.parent / "cgroup.procs").exists():
                break
            here = here.parent


# ---------------------------------------------------------------------- the files
def left_in(group: Path, *, v2: bool) -> int | None:
    """What the limit of cgroup ``group`` leaves (its limit less its working set), or None
    when it has no limit (or its files cannot be read)."""
    limit_file, usage_file = (
        ("memory.max", "memory.current")
        if v2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )
    try:
        raw = (group / limit_file).read_text().strip()
        if raw == "max" or not raw.isdigit() or int(raw) >= _UNLIMITED:
            return None
        usage = int((group / usage_file).read_text())
        stat = (group / "memory.stat").read_text()
    except (OSError, ValueError):
        return None
    return max(0, int(raw) - working_set(usage, stat, v2=v2))


def memory_groups() -> Iterator[tuple[str, bool]]:
    """This process's memory cgroup directories: (directory, whether v2)."""
    try:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, group = line.split(":", 2)
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        mounts = _cgroup.mount_points(mountinfo, v1_controller=None if v2 else "memory")
        path = _cgroup.group_dir(mounts, group)
        if path is not None:
            yield path, v2


def _host_available() -> int | None:
    """The host's ``MemAvailable`` in bytes (None: not known)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mib(nbytes: int) -> str:
    return f"{nbytes / _MIB:,.0f} MiB" if nbytes >= _MIB else f"{nbytes / 1024:,.0f} KiB"
