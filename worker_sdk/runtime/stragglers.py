"""How long this rank waited for the others in its last sampled DDP step (for stragglers).

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
events at the next forward; sampling one step in many keeps that rare). Anything other than plain
DDP (FSDP, a model without DDP, a DDP without the logging interface in another torch) reads
nothing: :meth:`CommWait.of` returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CommWait"]

_NS = 1e-9


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
