"""The checkpoint rounds' small collectives, safe to run right before the interpreter exits.

Gloo runs a collective on a worker thread and wakes the caller as soon as the result is in; the
worker thread drops its reference to the finished work a little later (measured on a 2-core
machine: after a quarter of all_gathers, up to 3 ms later). Dropping the last C++ reference to a
tensor created in Python takes the GIL. If the script has returned and the interpreter is
finalizing by then, CPython ends that thread with a forced unwind through a ``noexcept`` frame
and the whole process aborts: "terminate called without an active exception", SIGABRT, after a
successful run. ``destroy_process_group()`` does not prevent it once ``torch._dynamo`` has been
imported (any optimizer step imports it): the group outlives the call and its threads run on.

So every collective here returns only once the backend has let go of its tensors, which is
visible from Python: while C++ holds a tensor, the tensor holds one extra reference to its
Python object.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

import torch
import torch.distributed as dist

__all__ = ["all_gather_ints", "broadcast_ints", "collective_device", "group_active"]

_RELEASE_WAIT_S: Final = 1.0  # the longest wait for the backend to let go (never an error)
_RELEASE_POLL_S: Final = 0.0002


def collective_device() -> torch.device:
    """Where the tensors of a collective live: the current GPU under NCCL, else the CPU."""
    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_ints(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (the same length on every rank), in rank order."""
    mine = torch.tensor(values, dtype=torch.int64, device=collective_device())
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    _run_and_wait_release(lambda: dist.all_gather(gathered, mine), [mine, *gathered])
    return [[int(v) for v in t.tolist()] for t in gathered]


def broadcast_ints(values: list[int], src: int) -> list[int]:
    """Rank ``src``'s ``values`` on every rank (``values`` has the same length everywhere)."""
    tensor = torch.tensor(values, dtype=torch.int64, device=collective_device())
    _run_and_wait_release(lambda: dist.broadcast(tensor, src=src), [tensor])
    return [int(v) for v in tensor.tolist()]


def _run_and_wait_release(
    collective: Callable[[], object], tensors: Sequence[torch.Tensor]
) -> None:
    """Run a blocking collective, then wait (bounded) until the backend holds none of ``tensors``.

    Only CPU tensors are waited for: NCCL's watchdog releases its works on its own schedule and
    joins its threads when the group is shut down.
    """
    before = _refcounts(tensors)
    collective()
    if any(t.device.type != "cpu" for t in tensors):
        return
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while _refcounts(tensors) != before and time.monotonic() < deadline:
        time.sleep(_RELEASE_POLL_S)  # releases the GIL the worker thread needs


def _refcounts(tensors: Sequence[torch.Tensor]) -> list[int]:
    return [sys.getrefcount(t) for t in tensors]


def group_active(rank: int, world_size: int) -> bool:
    """Whether this rank (``rank`` of ``world_size``) takes part in a process group: False for
    a single rank or without torch.distributed; raises if the group does not match."""
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return False
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise RuntimeError(
            f"Checkpointer(rank={rank}, world_size={world_size}) does not match the "
            f"process group (rank {dist.get_rank()} of {dist.get_world_size()})"
        )
    return True
