"""The memory tier's events (docs/memory-tier.md)."""

from __future__ import annotations

import types
from dataclasses import dataclass

from supervisor.record.schema.base import Event

__all__ = ["MemorySnapshots", "MemoryTierOff"]


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
    """Steps between snapshots: the configured number, or the one ``"auto"`` chose last."""
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
