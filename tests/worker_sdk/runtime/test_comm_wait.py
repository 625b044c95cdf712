"""The SDK's reading of DDP's all-reduce wait (worker_sdk/runtime/stragglers.py), in a real 1-process
gloo group: what it reads, when it reads nothing, and what it leaves alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worker_sdk.runtime.stragglers import CommWait


def _train(ddp: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(steps):
        ddp(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.usefixtures("one_process_group")
def test_reads_the_newest_sampled_wait_once() -> None:
    """After DDP steps a wait (seconds, >= 0, well under a second here) is read; read again
    without a new sampled step it is None; the sampling rate follows the steps per read."""
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    wait = CommWait.of([torch.optim.SGD(ddp.parameters(), lr=0.1), ddp])
    assert wait is not None
    _train(ddp, 12)
    first = wait.read(12)
    assert first is not None and 0.0 <= first < 1.0
    assert wait.read(12) is None
    _train(ddp, 12)  # sampled every 6th step now
    assert wait.read(12) is not None
    sampled = ddp._get_ddp_logging_data()["iteration"]
    _train(ddp, 6)  # one step in six is sampled
    assert ddp._get_ddp_logging_data()["iteration"] == sampled + 6


@pytest.mark.usefixtures("one_process_group")
def test_nothing_but_plain_ddp_is_read() -> None:
    """A plain module, an optimizer, or nothing: no reader (FSDP and friends are not DDP)."""
    model = nn.Linear(8, 8)
    assert CommWait.of([model, torch.optim.SGD(model.parameters(), lr=0.1)]) is None
    assert CommWait.of([]) is None


@pytest.mark.usefixtures("one_process_group")
def test_a_failing_private_interface_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP's logging interface is private: when it raises, the reader says None and the
    training is not disturbed."""
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    wait = CommWait.of([ddp])
    assert wait is not None

    def broken() -> dict[str, int]:
        raise RuntimeError("changed in another torch")

    monkeypatch.setattr(ddp, "_get_ddp_logging_data", broken)
    _train(ddp, 3)
    assert wait.read(3) is None
