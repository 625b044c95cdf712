"""The one thing that keeps a resume from being bit-identical that the SDK cannot fix itself.

DDP built with ``find_unused_parameters=False`` (the default) puts every parameter in one bucket
for a process's first backward pass, then rebuilds its buckets in the order the gradients became
ready. A resumed process starts over: its first step all-reduces the first layout while the
uninterrupted run was already on the rebuilt one. With two ranks the sums are the same (``a+b``
is ``b+a``); with three or more the all-reduce adds the same numbers in another order and the
result may differ in the last bit, which training then carries on. ``find_unused_parameters=True``
keeps the buckets as first built, so every step of every run adds in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.nn.parallel import DistributedDataParallel

__all__ = ["reordered_sums_warning"]


def reordered_sums_warning(objects: Sequence[Any], world_size: int) -> str | None:
    """Why a resume of these objects will not be bit-identical (None when it will be)."""
    if world_size < 3:
        return None
    for obj in objects:
        if isinstance(obj, DistributedDataParallel) and not obj.find_unused_parameters:
            return (
                f"rvsup: DDP with {world_size} ranks rebuilds its gradient buckets after each "
                "process's first step, so the first step after a resume sums gradients in "
                "another order than an uninterrupted run (last-bit differences). For "
                "bit-identical resumes build it with find_unused_parameters=True."
            )
    return None
