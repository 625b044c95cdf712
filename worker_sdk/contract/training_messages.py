"""The messages of the training checks: a loss that is not finite, replicas that diverged, the
fingerprints of steps for the resume check. Read and written by :mod:`.messages`."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from .protocol import Kind

__all__ = ["LossNonFinite", "ReplicasDiverged", "StepPrints", "bits_float", "float_bits"]


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


@dataclass(frozen=True, slots=True)
class StepPrints:
    """Fingerprints of steps after a resume or a save (the resume check): the losses of steps
    ``first``, ``first + 1``, ... (None where ``step()`` was given none) and a sampled checksum
    of the parameters at ``params_step``; ``exact``: the values repeat bit for bit when the
    computation is repeated (no CUDA, or deterministic algorithms)."""

    KIND: ClassVar = Kind.STEP_PRINTS
    first: int
    losses: tuple[float | None, ...] = ()
    params_step: int | None = None
    params: int | None = None  # the int64 bits of the float64 checksum
    exact: bool = True


def float_bits(value: float) -> int:
    """A float64's bit pattern as an int64: how a checksum travels (its bits compared)."""
    bits: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits


def bits_float(bits: int) -> float:
    """The float64 whose bit pattern is ``bits`` (:func:`float_bits` undone)."""
    value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
    return value
