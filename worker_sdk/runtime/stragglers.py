"""How long this rank waits for the others per step (for stragglers): DDP, FSDP1, FSDP2.

Under DDP the ranks meet in the gradient all-reduce at the end of every backward pass; the rank
the others wait for waits (almost) not at all. DDP's reducer already times each step's backward
pass for its own statistics (``DistributedDataParallel._get_ddp_logging_data()``): the time its
all-reduce ran (``backward_comm_time``) and the part of it that overlapped the backward
computation (``backward_compute_comm_overlap_time``). Their difference is what the rank waited
after its own backward was done: the all-reduce's exposed time, mostly waiting for the last
rank to arrive. On CUDA modules the reducer takes these times from CUDA events (the device's
time, not the host's); on CPU from the host's clock. Durations only: nodes' clocks need not
agree.

Nothing is added to the step: the reducer times the steps it samples in C++ (five clock reads, or
five CUDA events), and this module reads the newest sample only when a heartbeat is due (about
20 µs for the dictionary DDP returns). The sampling rate is set at each read so that about two
steps per heartbeat interval are sampled (on CUDA a sampled step's statistics synchronise on its
events at the next forward; sampling one step in many keeps that rare).

FSDP (FSDP1's ``FullyShardedDataParallel``, FSDP2's ``fully_shard``) has no reducer: its ranks
meet in the all-gather before each unit's forward and backward and in the reduce-scatter after
each unit's backward, collectives FSDP calls from Python through ``torch.distributed``
(``all_gather_single``, ``reduce_scatter_single``; FSDP1 on CPU ``all_gather``).
:class:`CollectiveWait` wraps those module functions, from ``resume()`` to the runtime's shutdown
(:mod:`.patches`), with a timer: two reads
of the monotonic clock (vDSO, no syscall) and an addition around each blocking call; nothing
in ``step()``. The time a rank spends blocked in them, per step, is what it waits for the
others plus the transfer itself, which is the same on every rank; the rank the others wait for
waits least. Calls with ``async_op=True`` return at once and are not timed (their wait is in
``Work.wait()``; FSDP makes none unless asked to, see docs/stragglers.md). On GPUs a collective
does not block the host: when the FSDP module is on CUDA the wrappers time the collectives
whose tensors are CUDA tensors on the device instead, with CUDA events
(:mod:`worker_sdk.runtime.device_wait`), resolved when a heartbeat is due; a module on the CPU
gets the host timer alone and never touches ``torch.cuda``.

Anything else (a model without DDP or FSDP, a DDP without the logging interface in another
torch) reads nothing: :func:`wait_of` returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

from .device_wait import timed
from .patches import Patch, undo_all

__all__ = ["TIMED", "CollectiveWait", "CommWait", "WaitReader", "on_cuda", "wait_of"]

_NS = 1e-9
TIMED = (
    "all_gather_single",
    "all_gather_into_tensor",
    "all_gather",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_reduce",
)
"""The ``torch.distributed`` collectives :class:`CollectiveWait` times (what FSDP1 and FSDP2
call, and the all-reduce of gradient clipping)."""
_WHY: Final = "the time waited in collectives, for stragglers (FSDP)"


class WaitReader(Protocol):
    """Reads this rank's wait per step when a heartbeat is due."""

    def read(self, steps: int) -> float | None:
        """Seconds waited per step lately; None when there is nothing new."""

    def close(self) -> None:
        """The end of the reader's scope (the runtime's shutdown): undo what it patched."""


class CommWait:
    """Reads the newest sampled wait of one DDP module."""

    __slots__ = ("_ddp", "_iteration", "_rate")

    def __init__(self, ddp: Any) -> None:
        self._ddp = ddp
        self._iteration = -1
        self._rate = 1
        ddp._set_ddp_runtime_logging_sample_rate(1)  # noqa: SLF001 - DDP's own statistics

    @classmethod
    def of(cls, objects: Sequence[object]) -> CommWait | None:
        """For the first DDP module among ``objects``; None when there is none (or this torch
        lacks DDP's logging interface)."""
        from torch.nn.parallel import DistributedDataParallel

        for obj in objects:
            if isinstance(obj, DistributedDataParallel) and hasattr(obj, "_get_ddp_logging_data"):
                try:
                    return cls(obj)
                except Exception:  # noqa: BLE001 - a private interface: never fail the rank for it
                    return None
        return None

    def close(self) -> None:
        """Nothing to undo: DDP's own statistics are read, nothing is patched."""

    def read(self, steps: int) -> float | None:
        """Seconds the newest sampled step waited in the all-reduce after its backward; None
        when no step was sampled since the last read. ``steps``: the steps since then, which
        sets how often the next ones are sampled."""
        try:
            data = self._ddp._get_ddp_logging_data()  # noqa: SLF001 - DDP's own statistics
            rate = max(1, steps // 2)
            if rate != self._rate:
                self._ddp._set_ddp_runtime_logging_sample_rate(rate)  # noqa: SLF001
                self._rate = rate
        except Exception:  # noqa: BLE001 - a private interface: never fail the rank for it
            return None
        iteration = data.get("iteration")
        comm = data.get("backward_comm_time")
        overlap = data.get("backward_compute_comm_overlap_time")
        if not isinstance(iteration, int) or iteration == self._iteration:
            return None
        if not isinstance(comm, int) or not isinstance(overlap, int) or comm <= 0:
            return None
        self._iteration = iteration
        return max(0, comm - overlap) * _NS


class CollectiveWait:
    """The time this process waits in ``torch.distributed``'s collectives (:data:`TIMED`), per
    step since the last read: blocked on the host, or (FSDP on CUDA) on the device.

    The collectives are wrapped from its making to :meth:`close` (:mod:`.patches`), each
    instance with its own total and timer: a second one (``resume()`` called again in one
    process) wraps the first's wrappers, and closing them in turn undoes both.
    """

    __slots__ = ("_patches", "_read_total", "_ring", "_total")

    def __init__(self, device: bool = False) -> None:
        """Wrap the collectives: with the host timer, or (``device``: the FSDP module is on
        CUDA) with the device timer, which keeps the host timer for collectives of CPU
        tensors."""
        import torch.distributed as dist

        from .device_wait import EventRing, timed_on_device

        self._total = [0.0]  # seconds waited, over this reader's scope (the wrappers')
        self._ring = EventRing() if device else None  # the device's timing events (FSDP on CUDA)
        self._read_total = 0.0
        self._patches: list[Patch] = []
        for name in TIMED:
            fn = getattr(dist, name, None)
            if fn is not None:
                ring = self._ring
                wrapped = (
                    timed(fn, self._total)
                    if ring is None
                    else timed_on_device(fn, self._total, ring)
                )
                self._patches.append(Patch(dist, name, wrapped, _WHY).apply())

    def close(self) -> None:
        """Put the collectives back (those still ours: see :mod:`.patches`)."""
        undo_all(self._patches)

    @classmethod
    def of(cls, objects: Sequence[object]) -> CollectiveWait | None:
        """When an FSDP1 or FSDP2 module is among ``objects``; None otherwise."""
        from torch import nn

        from worker_sdk.checkpoint import parallel

        kinds = (parallel.KIND_FSDP1, parallel.KIND_FSDP2)
        found = [
            o for o in objects if isinstance(o, nn.Module) and parallel.module_kind(o) in kinds
        ]
        if found:
            return cls(device=any(on_cuda(m) for m in found))
        return None

    def read(self, steps: int) -> float | None:
        """Seconds waited in the collectives per step over the last ``steps`` steps (on the
        device: the collectives completed since the last read); None when no step was made."""
        if self._ring is not None:
            self._total[0] += self._ring.resolve()
        now = self._total[0]
        blocked, self._read_total = now - self._read_total, now
        return blocked / steps if steps > 0 else None


def on_cuda(module: Any) -> bool:
    """Whether an FSDP module computes on CUDA: a parameter on CUDA, or (FSDP2 offloading its
    shards to the CPU) a parameter sharded over a CUDA mesh, or (FSDP1) its compute device.
    Reads attributes only: ``torch.cuda`` is not initialised by it."""
    device = getattr(module, "compute_device", None)  # FSDP1
    if getattr(device, "type", None) == "cuda":
        return True
    for p in module.parameters():
        if p.device.type == "cuda":
            return True
        mesh = getattr(p, "device_mesh", None)  # an FSDP2 DTensor
        if getattr(mesh, "device_type", None) == "cuda":
            return True
    return False


def wait_of(objects: Sequence[object]) -> WaitReader | None:
    """The wait reader for the parallelism among ``objects``: DDP's reducer, else FSDP's
    collectives; None when there is neither."""
    return CommWait.of(objects) or CollectiveWait.of(objects)
