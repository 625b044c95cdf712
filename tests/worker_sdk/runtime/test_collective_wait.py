"""The SDK's timing of the collectives FSDP calls (worker_sdk/runtime/stragglers.py), in a real
1-process gloo group: what it reads, what it leaves untimed, which models get which reader, and
which timer (host or device) an FSDP module gets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.fake_device import FakeDevice
from worker_sdk.runtime import device_wait, patches
from worker_sdk.runtime.stragglers import (
    TIMED,
    CollectiveWait,
    CommWait,
    on_cuda,
    wait_of,
)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.distributed's collectives as they were, and put back afterwards (the timers the
    test made undone)."""
    for name in TIMED:
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, getattr(dist, name))
    yield
    for patch in reversed(patches.active()):
        if patch.owner is dist:
            patch.undo()


@pytest.mark.usefixtures("one_process_group", "fresh")
def test_blocking_collectives_are_timed_per_step() -> None:
    """Blocking collectives add their time to the wait, read per step since the last read
    (and once only); a collective with async_op=True is not timed; no step reads None."""
    original = dist.all_reduce
    wait = CollectiveWait()
    assert dist.all_reduce is not original and dist.all_reduce.__wrapped__ is original  # type: ignore[attr-defined]
    t = torch.ones(1 << 16)
    for _ in range(20):
        dist.all_reduce(t)
    first = wait.read(10)
    assert first is not None and first > 0
    assert wait.read(10) == 0.0
    wait.close()
    wait = CollectiveWait()
    dist.all_reduce(t, async_op=True).wait()
    assert wait.read(1) == 0.0
    assert wait.read(0) is None
    assert t[0].item() == 1.0  # the collective itself is unchanged


@pytest.mark.usefixtures("one_process_group", "fresh")
def test_readers_by_parallelism() -> None:
    """FSDP1 and FSDP2 modules get the collective timer, DDP its reducer's reading, anything
    else none."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    fsdp2 = fully_shard(nn.Linear(8, 8), mesh=init_device_mesh("cpu", (1,)))
    assert isinstance(wait_of([fsdp2]), CollectiveWait)
    fsdp1 = FullyShardedDataParallel(nn.Linear(8, 8), device_id=torch.device("cpu"))
    assert isinstance(wait_of([torch.optim.SGD(fsdp1.parameters(), lr=0.1), fsdp1]), CollectiveWait)
    assert isinstance(wait_of([nn.parallel.DistributedDataParallel(nn.Linear(8, 8))]), CommWait)
    assert wait_of([nn.Linear(8, 8)]) is None and wait_of([]) is None


@pytest.mark.usefixtures("one_process_group", "fresh")
def test_an_fsdp_module_on_the_cpu_keeps_the_host_timer() -> None:
    """An FSDP2 module on the CPU gets the host timer as it was (no ring of events) and its
    training leaves torch.cuda uninitialised; its blocking collectives are read."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fsdp2 = nn.Linear(64, 64)
    fully_shard(fsdp2, mesh=init_device_mesh("cpu", (1,)))
    wait = CollectiveWait.of([fsdp2])
    assert wait is not None and wait._ring is None and not on_cuda(fsdp2)
    host = device_wait.timed(len, [0.0]).__code__
    assert all(getattr(dist, name).__code__ is host for name in TIMED if hasattr(dist, name))
    fsdp2(torch.randn(8, 64)).sum().backward()
    dist.all_reduce(torch.ones(1 << 16))
    got = wait.read(1)
    assert got is not None and got > 0
    assert not torch.cuda.is_initialized()


@pytest.mark.usefixtures("one_process_group", "fresh")
def test_on_the_device_the_ring_is_read_into_the_same_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the FSDP module on the device (the device faked: 1 ms per collective), device
    collectives are timed by events and resolved at the read into the wait per step, with the
    host-timed CPU collectives; events not yet completed wait for the next read."""
    device = FakeDevice(tick_ms=1.0)
    monkeypatch.setattr(device_wait, "cuda_event", device.event)

    def on_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return bool(getattr(args[0], "on_fake_device", False))

    monkeypatch.setattr(device_wait, "is_cuda_call", on_device)
    monkeypatch.setattr(device_wait, "stream_capturing", lambda: False)
    wait = CollectiveWait(device=True)
    ring = wait._ring
    assert ring is not None and device.created == 2 * device_wait.RING
    t = torch.ones(4)
    t.on_fake_device = True  # type: ignore[attr-defined]
    for _ in range(4):
        dist.all_reduce(t)
    assert ring.pending == 4 and t[0].item() == 1.0
    assert wait.read(2) == 0.0  # the device has completed none: nothing is read, nothing waits
    device.finish()
    assert wait.read(2) == pytest.approx(0.002)  # 4 ms over 2 steps
    dist.all_reduce(torch.ones(1 << 16))  # a CPU tensor: the host clock
    got = wait.read(1)
    assert got is not None and 0 < got < 1 and ring.pending == 0 and not device.waited


def test_on_cuda_reads_where_the_module_computes() -> None:
    """A module is on CUDA when a parameter is, when a parameter is sharded over a CUDA mesh
    (FSDP2 offloading to the CPU) or when its compute device is (FSDP1); not otherwise."""

    def module(*params: Any, **attrs: Any) -> Any:
        return SimpleNamespace(parameters=lambda: iter(params), **attrs)

    cpu, cuda = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
    assert on_cuda(module(SimpleNamespace(device=cpu), SimpleNamespace(device=cuda)))
    mesh = SimpleNamespace(device_type="cuda")
    assert on_cuda(module(SimpleNamespace(device=cpu, device_mesh=mesh)))
    assert on_cuda(module(compute_device=cuda))
    assert not on_cuda(module(SimpleNamespace(device=cpu), compute_device=cpu))
    assert not on_cuda(nn.Linear(2, 2)) and not on_cuda(nn.Linear(2, 2, device="meta"))
    assert not torch.cuda.is_initialized()


_FSDP_SOURCES = (
    "torch/distributed/fsdp/_flat_param.py",  # FSDP1: the all-gathers
    "torch/distributed/fsdp/_runtime_utils.py",  # FSDP1: the reduce-scatters, all-reduces
    "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",  # FSDP2
)
_NOT_COLLECTIVES = frozenset({"barrier", "get_debug_level", "get_rank", "get_world_size"})


@pytest.mark.parametrize("source", _FSDP_SOURCES, ids=["fsdp1-params", "fsdp1-grads", "fsdp2"])
def test_every_collective_fsdp_calls_is_one_the_timer_wraps(source: str) -> None:
    """FSDP1 and FSDP2 call their collectives as attributes of torch.distributed at call time
    (so the timer, which replaces those attributes, sees them), and each is in TIMED: what the
    end-to-end straggler test shows for FSDP2 holds for FSDP1 too, and a torch that changes
    either is caught here."""
    text = (Path(torch.__file__).parents[1] / source).read_text()
    called = set(re.findall(r"\bdist\.([a-z_]+)\(", text)) - _NOT_COLLECTIVES
    assert called, source
    assert called <= set(TIMED), sorted(called - set(TIMED))
