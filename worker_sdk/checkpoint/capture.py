"""Step 1 of a save (the steps are in :mod:`.checkpointer`'s docstring): references to everything
a checkpoint of this rank holds, and where each object's state goes, nothing written yet."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from worker_sdk.contract.layout import STATE_DCP, STATE_RANK, STATE_SHARED

from . import dcp as _dcp
from . import grads as _grads
from . import per_rank as _per_rank
from . import rng as _rng
from .loader_generators import LEDGER
from .parallel import Stateful, StatePlan, dcp_groups, unwrap

__all__ = ["Capture", "capture"]

_PAYLOAD_FORMAT: Final = 1  # of shared.pt and the rank files (their layout is unchanged)


@dataclass(slots=True)
class Capture:
    """One rank's view of a checkpoint being written (see :mod:`.checkpointer`'s steps)."""

    plan: StatePlan
    where: tuple[str, ...]  # per object: STATE_SHARED or STATE_DCP
    shared: dict[str, Any] | None  # shared.pt's payload (rank 0), else None
    part: dict[str, Any]  # this rank's rank file
    sharded: dict[str, Any] | None  # the DCP state dict; None when nothing is sharded
    began: float  # monotonic time the save began
    grads_not_kept: tuple[int, ...] = ()  # FSDP1 modules holding gradients (.grads)


def capture(
    plan: StatePlan,
    objects: Sequence[Stateful],
    extra: Any,
    began: float,
    *,
    rank: int,
    world_size: int,
    gather: Callable[[list[int]], list[list[int]]] | None,
    grads: bool = True,
) -> Capture:
    """Step 1: references to everything a checkpoint holds, nothing written yet; ``gather``:
    the all-gather the ranks compare their objects' digests through (None: no process group);
    ``grads``: the parameters' gradients are kept (:mod:`.grads`), else the restore leaves
    none."""
    per_rank, states = _per_rank.split(plan.kinds, objects, world_size=world_size, gather=gather)
    where = []
    for i, obj in enumerate(objects):
        # an optimizer that has not stepped yet has no state to shard: saved as it is
        # (DCP's get_state_dict would invent zero moments for it, in place)
        empty = isinstance(obj, torch.optim.Optimizer) and not obj.state
        if i in per_rank:
            where.append(STATE_RANK)
        else:
            where.append(STATE_DCP if i in plan.sharded and not empty else STATE_SHARED)
    shared = None
    if rank == 0:
        table = {
            str(i): {
                "class": plan.classes[i],
                "state": states[i] if i in states else unwrap(obj).state_dict(),
            }
            for i, obj in enumerate(objects)
            if where[i] == STATE_SHARED
        }
        shared = {"format": _PAYLOAD_FORMAT, "objects": table}
    part = {"format": _PAYLOAD_FORMAT, "rank": rank, "rng": _rng.capture(), "extra": extra}
    part["grads"], fsdp1 = _grads.capture(objects, plan.kinds) if grads else ({}, [])
    loaders = LEDGER.capture()  # the loaders' own shuffling generators, per epoch
    if loaders:
        part["loaders"] = loaders
    if per_rank:
        part["objects"] = {str(i): states[i] for i in sorted(per_rank)}
    sharded_state = None
    if plan.sharded:
        sharded_state = _dcp.capture(dcp_groups(plan, tuple(where)))
    return Capture(plan, tuple(where), shared, part, sharded_state, began, tuple(fsdp1))
