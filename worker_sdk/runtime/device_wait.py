"""The wait in collectives measured on the device (CUDA events), for stragglers under FSDP on GPUs.

With NCCL a collective called without ``async_op`` returns once its kernel is enqueued: the host
does not wait, the device does (the stream that called it waits for the collective before its
next kernel). A host clock around the call sees almost nothing; the device's clock sees the
wait. So, for a collective whose tensors are CUDA tensors, the timer records a timing event on
the current stream before the call and one after it (the second completes when the collective
has, for the calling stream): their difference is what the host timer measures on CPU, the time
from the moment this rank's stream reached the collective until the collective was done, that
is its wait for the others plus the transfer.

Per collective, on the step path: two ``cudaEventRecord`` calls (no host synchronisation) on
events taken from a ring allocated once (:data:`RING` pairs), and nothing else. The ring is
resolved when a heartbeat is due (:meth:`EventRing.resolve`): from the oldest pair on, each
pair whose end event ``query()`` says is done adds ``start.elapsed_time(end)``; the first pair
not yet done stops it (it is left for the next heartbeat). Nothing ever waits for the device:
no ``synchronize()``, no ``elapsed_time`` of an unfinished event. When every pair of the ring is
still pending at a new collective (more collectives between two heartbeats than the ring holds,
or a device far behind its host), the oldest pending measurement is dropped and counted
(:attr:`EventRing.dropped`); the next resolution scales what it resolved by the measurements it
stands for (resolved + dropped) / resolved, so the wait per step stays an estimate of the whole,
from the newest collectives.

A job whose FSDP module is on the CPU keeps the host timer (:func:`timed`) alone and never touches
``torch.cuda``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "RING",
    "DeviceEvent",
    "EventRing",
    "cuda_event",
    "is_cuda_call",
    "stream_capturing",
    "timed",
    "timed_on_device",
]

RING = 512
"""Event pairs in the ring: the collectives that can be pending between two heartbeats before
the oldest is dropped (FSDP makes about three per sharded unit per step)."""


class DeviceEvent(Protocol):
    """What the ring needs of an event (``torch.cuda.Event(enable_timing=True)``)."""

    def record(self) -> None:
        """Record on the current stream (no host synchronisation)."""

    def query(self) -> bool:
        """True when the work recorded before it has completed (never waits)."""

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to ``end_event``, both completed."""


def cuda_event() -> DeviceEvent:
    """A CUDA timing event (created lazily by torch: on its first ``record()``)."""
    import torch

    event: DeviceEvent = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return event


class EventRing:
    """Pairs of timing events around collectives, pending until a heartbeat resolves them."""

    __slots__ = ("_ends", "_head", "_lost", "_pending", "_size", "_starts", "dropped", "measured")

    def __init__(
        self, new_event: Callable[[], DeviceEvent] | None = None, size: int = RING
    ) -> None:
        """``size`` pairs of events from ``new_event`` (CUDA timing events by default), all
        allocated here: none per collective."""
        if size < 1:
            raise ValueError("the ring needs at least one pair")
        new_event = new_event or cuda_event
        self._size = size
        self._starts = [new_event() for _ in range(size)]
        self._ends = [new_event() for _ in range(size)]
        self._head = 0  # the oldest pending pair
        self._pending = 0  # pairs recorded (or being recorded), not yet resolved
        self._lost = 0  # dropped since the last resolution that resolved something
        self.dropped = 0  # measurements dropped because the ring was full, over the process
        self.measured = 0  # measurements resolved, over the process

    @property
    def pending(self) -> int:
        """Pairs recorded and not yet resolved."""
        return self._pending

    def time(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` between the two events of the next free pair (the oldest
        pending pair when none is free: that measurement is dropped)."""
        size = self._size
        if self._pending == size:
            self._head = self._head + 1 if self._head + 1 < size else 0
            self._pending -= 1
            self.dropped += 1
            self._lost += 1
        i = self._head + self._pending
        if i >= size:
            i -= size
        self._pending += 1  # reserved before the call: a collective inside it takes the next
        try:
            self._starts[i].record()
        except Exception:  # noqa: BLE001 - a timer must never fail the collective
            self._abandon(i)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                self._ends[i].record()
            except Exception:  # noqa: BLE001 - as above
                self._abandon(i)

    def _abandon(self, i: int) -> None:
        """Give pair ``i`` (the newest) back unmeasured."""
        newest = self._head + self._pending - 1
        if newest >= self._size:
            newest -= self._size
        if self._pending and newest == i:
            self._pending -= 1

    def resolve(self) -> float:
        """Seconds measured by the pairs completed since the last call, oldest first, up to the
        first one not yet completed; scaled up for the measurements dropped meanwhile. Never
        waits for the device."""
        total_ms = 0.0
        n = 0
        size = self._size
        while self._pending:
            i = self._head
            end = self._ends[i]
            try:
                if not end.query():
                    break
                total_ms += self._starts[i].elapsed_time(end)
                n += 1
            except Exception:  # noqa: BLE001 - an unusable pair is dropped, not fatal
                self.dropped += 1
                self._lost += 1
            self._head = i + 1 if i + 1 < size else 0
            self._pending -= 1
        if n == 0:
            return 0.0
        self.measured += n
        if self._lost:
            total_ms *= (n + self._lost) / n
            self._lost = 0
        return total_ms / 1000.0


def stream_capturing() -> bool:
    """Whether the current CUDA stream is being captured into a CUDA graph (where recording a
    timing event would invalidate the capture)."""
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def is_cuda_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a collective's first tensor argument (or the first of its first list, as in
    ``all_gather``) is a CUDA tensor; reads an attribute, touches no CUDA state."""
    t = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return getattr(t, "is_cuda", False) is True


def timed(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    """``fn`` that adds the seconds each blocking call takes to ``total[0]`` (a call with
    ``async_op=True`` is passed through untimed)."""
    clock = time.perf_counter

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op"):
            return fn(*args, **kwargs)
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += clock() - t0

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    return call


def timed_on_device(
    fn: Callable[..., Any],
    total: list[float],
    ring: EventRing,
    on_device: Callable[[tuple[Any, ...], dict[str, Any]], bool] | None = None,
    capturing: Callable[[], bool] | None = None,
) -> Callable[..., Any]:
    """``fn`` timed on the device through ``ring`` when its tensors are on the device
    (``on_device``, by default :func:`is_cuda_call`), else on the host clock into ``total[0]``
    as :func:`timed` does; a call with ``async_op=True``, or on a stream being captured
    into a CUDA graph (``capturing``, by default :func:`stream_capturing`), is passed through
    untimed."""
    host = timed(fn, total)  # on the host clock; async_op=True passed through untimed
    device = on_device or is_cuda_call
    captured = capturing or stream_capturing

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op") or not device(args, kwargs):
            return host(*args, **kwargs)
        if captured():
            return fn(*args, **kwargs)
        return ring.time(fn, args, kwargs)

    return functools.update_wrapper(call, fn, assigned=("__name__", "__doc__"), updated=())
