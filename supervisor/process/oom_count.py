"""How many of the job's processes the kernel's OOM killer killed: read from the job's own memory
cgroup, so that another job's OOM on a shared node is never taken for this job's.

The kernel counts every process its OOM killer kills (the host's, or a memory cgroup limit's:
Slurm's, a container's) in the victim's memory cgroup, as ``oom_kill`` in ``memory.events``
(cgroup v2, counted in every ancestor too) or in ``memory.oom_control`` (v1, counted in the
victim's group alone: the job's groups are summed). Where the job has no memory cgroup of its own
(no memory controller it may use), the host's counter (``oom_kill`` in ``/proc/vmstat``) is
all there is: it counts every job's kills, and the failure's detail says it was counted so.

The job's memory cgroup is the one :class:`supervisor.process.cgroup.JobGroups` makes
(``rvsup-PID``: the v2 group when its memory controller is on, else a v1 memory group of the
same name that the daemon places itself in before it starts anything).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOST", "OomCounter", "oom_kill_field"]

HOST = Path("/proc/vmstat")


def oom_kill_field(text: str) -> int | None:
    """The ``oom_kill N`` line's N in ``memory.events``, ``memory.oom_control`` or
    ``/proc/vmstat`` text; None when there is none."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


@dataclass(frozen=True, slots=True)
class OomCounter:
    """Where OOM kills are counted: ``files`` summed (a v1 group's ``memory.oom_control`` with
    those of the groups below it, walked at each read), or the host's counter. ``host_wide``:
    empty when only the job's processes are counted, else why the host's counter is read."""

    path: Path
    host_wide: str = ""
    subtree: bool = False

    @classmethod
    def of_job(cls, v2_group: Path | None, v1_group: Path | None, why_not: str) -> OomCounter:
        """The job's counter: its v2 group's ``memory.events`` when there is one, else its v1
        memory group's ``memory.oom_control`` (summed over the groups below it), else the
        host's, with ``why_not`` (why the job has no memory cgroup) as the reason."""
        if v2_group is not None and (v2_group / "memory.events").exists():
            return cls(v2_group / "memory.events")
        if v1_group is not None and (v1_group / "memory.oom_control").exists():
            return cls(v1_group, subtree=True)
        return cls(HOST, host_wide=why_not or "no memory cgroup of the job's")

    @property
    def where(self) -> str:
        """The counter, for people: a file, or a v1 group and the groups below it."""
        if self.subtree:
            return f"cgroup v1 memory.oom_control under {self.path}"
        return str(self.path)

    def read(self) -> int | None:
        """The count now (None: it cannot be read)."""
        if not self.subtree:
            try:
                return oom_kill_field(self.path.read_text())
            except OSError:
                return None
        total, found = 0, False
        for directory, _, files in os.walk(self.path):
            if "memory.oom_control" not in files:
                continue
            try:
                count = oom_kill_field(Path(directory, "memory.oom_control").read_text())
            except OSError:
                continue  # removed meanwhile
            if count is not None:
                total, found = total + count, True
        return total if found else None
