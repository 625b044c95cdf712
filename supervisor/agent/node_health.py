"""What a node's agent says of its node in every beat: the kernel's OOM kills of the node's
processes since the agent started, and the memory available.

The kills are counted where the node wrapper put the node's processes
(``worker_sdk.spawn.node_group``): its cgroup v2 group when the memory controller is on there,
else the cgroup v1 memory group it made; both are named ``rvsup-node-PID``, and the agent is in
them too. Elsewhere only the host's counter is there to read: it counts every process's kills,
and the beat says so (the daemon then takes them only for a node whose rank died of SIGKILL,
as for its own node: :mod:`supervisor.process.oom_count`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from supervisor.process.health_probe import read_memory_available
from supervisor.process.oom_count import OomCounter
from worker_sdk.contract.protocol import NODE_GROUP_PREFIX
from worker_sdk.spawn.cgroup import own_group_dir, own_memory_v1_dir

__all__ = ["Health", "NodeHealth", "node_counter"]


@dataclass(frozen=True, slots=True)
class Health:
    """One reading: OOM kills since the agent started (None: not known), why they are the
    host's count ("" when the node's own), and the memory available in bytes (None: not known)."""

    oom_kills: int | None
    oom_host_wide: str
    memory_available: int | None


def node_counter() -> OomCounter:
    """Where this node's OOM kills are counted (see the module docstring)."""
    v2 = own_group_dir()
    named = Path(v2).name.startswith(NODE_GROUP_PREFIX) if v2 is not None else False
    if v2 is not None and named and (Path(v2) / "memory.events").exists():
        return OomCounter.of_job(Path(v2), None, "")
    v1 = own_memory_v1_dir()
    if v1 is not None and Path(v1).name.startswith(NODE_GROUP_PREFIX):
        return OomCounter.of_job(None, Path(v1), "")
    return OomCounter.of_job(None, None, "no memory cgroup of the node's processes")


class NodeHealth:
    """The node's health as its agent reads it at every beat (two small files)."""

    def __init__(self, counter: OomCounter) -> None:
        self.counter = counter
        self._baseline = counter.read()

    def read(self) -> Health:
        count = self.counter.read()
        kills = None if count is None or self._baseline is None else count - self._baseline
        return Health(kills, self.counter.host_wide, read_memory_available())
