"""Replicas that silently diverge: the parameters of plain DDP compared across the ranks.

Every ``verify_every_steps`` steps (at the steps ``s`` with ``(s + 1) % N == 0``: every rank
reaches them, so they agree without a message) each rank sums a strided sample of its DDP
parameters in float64 and the ranks all-gather the sums' bit patterns (one int64 per rank).
DDP keeps the replicas bit-identical, so any difference is a corruption (a flipped bit, a bad
device): the ranks whose sum differs from the majority's are named (every rank when there is
no majority, e.g. two ranks that disagree). The sample's offset moves by one element at each
check, so over ``stride`` checks every element is covered; a corruption outside the sample is
caught at a later check.

Only plain DDP is checked: sharded state (FSDP1, FSDP2, DTensor) differs between the ranks by
design, and a replicated shard group would need its own group of ranks to compare; modules
that are not wrapped in DDP may differ on purpose. Neither is fingerprinted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import torch
from torch import nn

from worker_sdk.checkpoint import parallel as _parallel
from worker_sdk.checkpoint.collectives import all_gather_ints
from worker_sdk.contract.training_messages import ReplicasDiverged, float_bits

__all__ = [
    "SAMPLE",
    "ReplicaCheck",
    "compare",
    "ddp_modules",
    "divergent",
    "fingerprint",
    "sampled_sum",
]

SAMPLE: Final = 4096
"""Elements per parameter at most in one check."""


class ReplicaCheck:
    """The checks of one rank: at the steps ``s`` with ``(s + 1) % every == 0``."""

    def __init__(self, every: int, modules: Sequence[nn.Module], last_finished: int) -> None:
        self.every = every
        self.modules = list(modules)
        self.verified = last_finished
        self.next_step = self._after(last_finished)

    def _after(self, step: int) -> int:
        return ((step + 1) // self.every + 1) * self.every - 1

    def run(self, step: int) -> ReplicasDiverged | None:
        """Compare at ``step`` (a collective: every rank calls it at the same step); the
        report to send when some ranks differ, else None."""
        diverged = compare(fingerprint(self.modules, step // self.every))
        since = self.verified + 1
        self.verified, self.next_step = step, self._after(step)
        if not diverged:
            return None
        return ReplicasDiverged(step, tuple(diverged), since)


def ddp_modules(objects: Sequence[Any]) -> list[nn.Module]:
    """The modules among ``objects`` that plain DDP replicates (none sharded)."""
    return [
        _parallel.unwrap(obj)
        for obj in objects
        if isinstance(obj, nn.Module) and _parallel.module_kind(obj) == _parallel.KIND_DDP
    ]


@torch.no_grad()
def sampled_sum(modules: Sequence[nn.Module], *, sample: int, offset: int = 0) -> torch.Tensor:
    """The float64 sum of a strided sample of every parameter this rank holds (a DTensor's
    local shard): at most ``sample`` elements of each, from ``offset`` (modulo the stride).
    Left where it was computed: reading it is the only device sync."""
    total: torch.Tensor | None = None
    for module in modules:
        for p in _parallel.unwrap(module).parameters():
            flat = _parallel.local_of(p).detach().reshape(-1)
            if flat.numel() == 0:
                continue
            stride = max(1, flat.numel() // sample)
            part = flat[offset % stride :: stride].to(torch.float64).sum()
            total = part if total is None else total + part.to(total.device)
    return torch.zeros((), dtype=torch.float64) if total is None else total


def fingerprint(modules: Sequence[nn.Module], check: int) -> int:
    """The bit pattern (int64) of :func:`sampled_sum`; ``check`` (the same on every rank) moves
    the sample's offset."""
    return float_bits(float(sampled_sum(modules, sample=SAMPLE, offset=check)))


def compare(mine: int) -> tuple[int, ...]:
    """All-gather the fingerprints; the ranks that differ from the majority (none: agreed)."""
    values = [v for (v,) in all_gather_ints([mine])]
    return divergent(values)


def divergent(values: Sequence[int]) -> tuple[int, ...]:
    """The ranks whose value is not the majority's; every rank when none holds a majority."""
    common, count = Counter(values).most_common(1)[0]
    if count == len(values):
        return ()
    if 2 * count <= len(values):
        return tuple(range(len(values)))
    return tuple(r for r, v in enumerate(values) if v != common)
