"""The memory tier's events (docs/memory-tier.md)."""

from __future__ import annotations

import types
from dataclasses import dataclass

from supervisor.record.schema.base import Event

__all__ = ["MemoryDirRefused", "MemorySnapshots", "MemoryTierOff", "SnapshotsSwept"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySnapshots(Event):
    """The memory tier's snapshots of one attempt, summed up once as it ends (docs/memory-tier.md);
    not one event per snapshot."""

    NAME = "memory_snapshots"
    LEVEL = "info"
    DIGITS = types.MappingProxyType({"blocked_s": 4})
    count: int
    """Snapshots completed (committed for every rank)."""
    blocked_s: float
    """How long ``step()`` was blocked by them, in all (rank 0's)."""
    bytes: int | None
    """The newest snapshot's size; None when unknown."""
    interval: int | None
    """Steps between snapshots: the configured number, or the one ``"auto"`` chose last; None
    with one snapshot or none (no interval to report)."""
    newest_step: int | None
    """The newest complete snapshot's step; None when there is none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTierOff(Event):
    """The memory tier stopped for the rest of the attempt (a full ``/dev/shm``, a memory
    limit): storage checkpoints go on."""

    NAME = "memory_tier_off"
    LEVEL = "warning"
    reason: str
    """Why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryDirRefused(Event):
    """A snapshot directory the job was to use is not its own (another user's, a symbolic link,
    open to others): it is never used, and the tier makes a fresh private one
    (docs/security.md)."""

    NAME = "memory_dir_refused"
    LEVEL = "warning"
    path: str
    """The directory refused."""
    reason: str
    """Why it is not this user's private directory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotsSwept(Event):
    """Snapshot directories that daemons killed before their end left on this node (host
    memory) were removed at this start."""

    NAME = "snapshots_swept"
    LEVEL = "info"
    paths: tuple[str, ...]
    """The directories removed."""
