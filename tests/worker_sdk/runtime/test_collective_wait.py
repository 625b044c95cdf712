"""The SDK's timing of the collectives FSDP calls (worker_sdk/runtime/stragglers.py), in a real
1-process gloo group: what it reads, what it leaves untimed, and which models get which reader."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from worker_sdk.runtime.stragglers import TIMED, CollectiveWait, CommWait, wait_of


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.distributed's collectives as they were, and put back afterwards."""
    for name in TIMED:
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, getattr(dist, name))
    monkeypatch.setattr(CollectiveWait, "_installed", False)
    monkeypatch.setattr(CollectiveWait, "_total", [0.0])


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
    CollectiveWait._total[0] = 0.0
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
