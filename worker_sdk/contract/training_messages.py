"""The messages of the training checks: a loss that is not finite, replicas that diverged. Read
and written by :mod:`.messages`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .protocol import Kind

__all__ = ["LossNonFinite", "ReplicasDiverged"]


@dataclass(frozen=True, slots=True)
class LossNonFinite:
    """A loss that is not finite, at ``step`` (sent at once)."""

    KIND: ClassVar = Kind.LOSS_NONFINITE
    step: int
    value: float
    since: int | None  # the first step it may come from


@dataclass(frozen=True, slots=True)
class ReplicasDiverged:
    """From rank 0: the replicas' parameter fingerprints differed at ``step``."""

    KIND: ClassVar = Kind.REPLICAS_DIVERGED
    step: int
    ranks: tuple[int, ...]  # those that differ from the majority (all when there is none)
    since: int | None  # the step after the last check that agreed
