"""The device timer's ring of timing events (worker_sdk/runtime/device_wait.py) on a fake device:
what is measured, that nothing waits for the device, the oldest dropped when the ring is full,
no event allocated per collective; and the CPU path untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.fake_device import FakeDevice
from worker_sdk.runtime.device_wait import EventRing, is_cuda_call, timed_on_device


def _collective(device: FakeDevice, ms: float) -> Any:
    """A collective the device spends ``ms`` on (returns its duration, as a result to pass back)."""

    def fn(*args: Any, **kwargs: Any) -> float:
        device.run(ms)
        return ms

    return fn


def _always(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _never() -> bool:
    return False


def test_collectives_are_timed_by_events_and_resolved_without_waiting() -> None:
    """Each device collective is timed by a pair of events; a resolution adds the completed
    pairs' elapsed times (oldest first, stopping at the first unfinished, never waiting) and
    leaves the rest for the next; the host total is not touched."""
    device = FakeDevice()
    ring = EventRing(device.event, size=8)
    total = [0.0]
    calls = [
        timed_on_device(_collective(device, ms), total, ring, _always, _never) for ms in (1, 2, 3)
    ]
    for call in calls + calls[:2]:  # 1, 2, 3, 1, 2 ms
        assert call(torch.zeros(1)) in (1, 2, 3)
    assert ring.pending == 5 and total == [0.0]
    assert ring.resolve() == 0.0 and ring.pending == 5  # nothing completed: nothing read, no wait
    device.done = 6  # the first three pairs (six events) completed
    assert ring.resolve() == pytest.approx(0.006) and ring.pending == 2
    device.done = 7  # the fourth pair's start only: its end is not completed
    assert ring.resolve() == 0.0 and ring.pending == 2
    device.finish()
    assert ring.resolve() == pytest.approx(0.003) and ring.pending == 0
    assert ring.measured == 5 and ring.dropped == 0 and total == [0.0] and not device.waited


def test_a_full_ring_drops_the_oldest_and_counts_it() -> None:
    """With every pair pending a new collective drops the oldest measurement (counted) and
    never waits; the next resolution scales what it measured by the drops it stands for."""
    device = FakeDevice()
    ring = EventRing(device.event, size=4)
    total = [0.0]
    for ms in (1, 2, 3, 4, 5, 6):
        timed_on_device(_collective(device, ms), total, ring, _always, _never)()
    assert ring.dropped == 2 and ring.pending == 4
    device.finish()
    assert ring.resolve() == pytest.approx((3 + 4 + 5 + 6) / 1000 * 6 / 4)  # 1 and 2 dropped
    assert ring.resolve() == 0.0 and ring.measured == 4 and ring.dropped == 2
    timed_on_device(_collective(device, 7), total, ring, _always, _never)()
    device.finish()
    assert ring.resolve() == pytest.approx(0.007)  # the drops were accounted for once
    assert not device.waited


def test_no_event_is_allocated_per_collective() -> None:
    """The ring's events are allocated once, when it is made; thousands of collectives (the
    ring wrapping around, full or resolved) allocate none."""
    device = FakeDevice()
    ring = EventRing(device.event, size=16)
    assert device.created == 32
    call = timed_on_device(_collective(device, 0.5), [0.0], ring, _always, _never)
    for i in range(5000):
        call()
        if i % 7 == 0:
            device.finish()
            ring.resolve()
    assert device.created == 32 and ring.measured + ring.dropped + ring.pending == 5000


def test_a_failing_event_never_fails_the_collective() -> None:
    """An event that cannot be recorded leaves the collective's result intact and its pair
    unused."""
    device = FakeDevice()
    ring = EventRing(device.event, size=4)
    device.fail_record = True
    assert timed_on_device(_collective(device, 2), [0.0], ring, _always, _never)() == 2
    assert ring.pending == 0 and ring.resolve() == 0.0


def test_async_and_cpu_collectives_stay_on_the_host_path() -> None:
    """A collective of CPU tensors is timed on the host clock (no event recorded, no CUDA
    state touched); one with async_op=True is not timed at all."""
    device = FakeDevice()
    ring = EventRing(device.event, size=4)
    total = [0.0]
    call = timed_on_device(_collective(device, 2), total, ring)  # the real CUDA test
    call(torch.zeros(4), torch.zeros(1), group=None)
    call([torch.zeros(1), torch.zeros(1)], torch.zeros(1))  # all_gather's output list
    assert device.recorded == 0 and ring.pending == 0 and total[0] > 0
    before = total[0]
    timed_on_device(_collective(device, 2), total, ring, _always, _never)(
        torch.zeros(1), async_op=True
    )
    assert device.recorded == 0 and total[0] == before
    assert not torch.cuda.is_initialized()


def test_a_collective_captured_into_a_cuda_graph_is_not_timed() -> None:
    """While the stream is being captured into a CUDA graph no event is recorded (it would
    invalidate the capture): the collective runs untimed."""
    device = FakeDevice()
    ring = EventRing(device.event, size=4)
    call = timed_on_device(_collective(device, 2), [0.0], ring, _always, lambda: True)
    assert call() == 2 and device.recorded == 0 and ring.pending == 0


def test_is_cuda_call_reads_the_first_tensor() -> None:
    """The first tensor argument decides (the first of a list; keyword arguments too);
    anything without ``is_cuda`` is not a device call."""

    class Cuda:
        is_cuda = True

    assert is_cuda_call((Cuda(),), {}) and is_cuda_call(([Cuda()],), {})
    assert is_cuda_call((), {"tensor": Cuda()})
    assert not is_cuda_call((torch.zeros(1),), {}) and not is_cuda_call(([torch.zeros(1)],), {})
    assert not is_cuda_call((), {}) and not is_cuda_call(([],), {}) and not is_cuda_call((1,), {})
    assert not torch.cuda.is_initialized()


def test_a_ring_needs_a_pair() -> None:
    """A ring of no pairs is refused."""
    with pytest.raises(ValueError, match="at least one pair"):
        EventRing(FakeDevice().event, size=0)
