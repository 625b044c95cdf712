"""What keeps a resume from being bit-identical that the SDK cannot fix itself, said by
``resume()`` before it matters.

A global generator never seeded: torch starts every process with a random seed (its
``initial_seed()`` then is a random 64-bit number; older releases started every process with
the same seed, 67280421310721). Whatever the script builds from it before ``resume()`` and
outside the checkpoint (a synthetic dataset, a random projection) differs after a restart.
Scripts seed with small numbers (0, 42, 1234 + rank): a seed of 2**32 or more that is not the
old fixed one is taken for torch's random start. (A script that seeds with a random 64-bit
number is warned too: its data is not reproducible either, unless it saves that seed.)

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

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["reordered_sums_warning", "resume_warnings", "unseeded_warning"]

_OLD_DEFAULT_SEED = 67280421310721  # torch's fixed start seed before it started random ones


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


def resume_warnings(objects: Sequence[Any], world_size: int) -> list[str]:
    """What ``resume()`` warns about (on rank 0): each reason its resumes will not be exact."""
    found = (reordered_sums_warning(objects, world_size), unseeded_warning())
    return [warning for warning in found if warning is not None]


def unseeded_warning() -> str | None:
    """Why a resume will not be exact because torch's global generator was never seeded in this
    process (None when it was)."""
    seed = torch.initial_seed()
    if seed < 2**32 or seed == _OLD_DEFAULT_SEED:
        return None
    return (
        "rvsup: torch's global random generator was never seeded in this process (torch starts "
        f"every process with a random seed; this one's is {seed}): what the script built from "
        "it before resume() and outside the checkpoint (a synthetic dataset, a random "
        "projection) is built otherwise after a restart, and the resumed run will not be exact. "
        "Seed torch (and random, numpy) at the script's start: torch.manual_seed(0). The "
        "resume check will tell (docs/resume-check.md)."
    )
