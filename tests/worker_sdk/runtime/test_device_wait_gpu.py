"""The device timer on real CUDA devices (worker_sdk/runtime/device_wait.py). NCCL refuses two
ranks on one GPU, so on one GPU a 1-rank NCCL group: the collectives of a job whose FSDP module
is on CUDA are timed by CUDA events, read without waiting for the device, and resolved once the
device has completed them; on two GPUs a 2-rank FSDP2 job whose rank 1 has a slow device: rank 0
waits for it. Skipped where there is no CUDA device (or only one, for the second)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from worker_sdk.runtime import patches
from worker_sdk.runtime.stragglers import TIMED, CollectiveWait

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.serial,  # the host's time bounded (took < 0.1 s), and the device is one for all
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def nccl_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 1-rank NCCL group on cuda:0, and torch.distributed's collectives as they were, both
    put back afterwards (the timers the test made undone)."""
    for name in TIMED:
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, getattr(dist, name))
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{tmp_path / 'store'}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    try:
        yield
    finally:
        for patch in reversed(patches.active()):
            if patch.owner is dist:
                patch.undo()
        dist.destroy_process_group()


def _sleep_cycles(seconds: float) -> int:
    """GPU clock cycles for roughly ``seconds`` of ``torch.cuda._sleep`` (a spinning kernel) on
    a GPU clocked about 1.5 GHz; the test needs only "long enough"."""
    return int(seconds * 1.5e9)


@pytest.mark.usefixtures("nccl_group")
def test_cuda_collectives_are_timed_on_the_device_without_waiting() -> None:
    """With an FSDP2 module on CUDA the SDK times collectives of CUDA tensors with CUDA events:
    a collective queued behind 0.5 s of device work is read at once (no wait, its events still
    pending) and measured once the device has done it; nothing is dropped."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = nn.Linear(256, 256).cuda()
    fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    wait = CollectiveWait.of([model])
    assert wait is not None
    ring = wait._ring
    assert ring is not None
    x = torch.randn(64, 256, device="cuda")
    for _ in range(3):
        model(x).sum().backward()
        dist.all_reduce(torch.ones(1 << 20, device="cuda"))
        dist.all_gather_into_tensor(  # all_gather_single is newer than torch 2.11
            torch.empty(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")
        )
    torch.cuda.synchronize()
    got = wait.read(3)
    assert got is not None and got > 0 and ring.pending == 0 and ring.measured >= 6

    torch.cuda._sleep(_sleep_cycles(0.5))  # the device is busy; the host goes on at once
    dist.all_reduce(torch.ones(1 << 20, device="cuda"))
    t0 = time.perf_counter()
    early = wait.read(1)
    took = time.perf_counter() - t0
    assert took < 0.1 and early == 0.0 and ring.pending == 1, (took, early, ring.pending)
    torch.cuda.synchronize()
    late = wait.read(1)
    assert late is not None and late > 0 and ring.pending == 0 and ring.dropped == 0
    wait.close()


WORKER = Path(__file__).parents[2] / "helpers" / "gpu_wait_worker.py"


@pytest.mark.process
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_rank_with_a_slow_device_waits_least(tmp_path: Path) -> None:
    """2 NCCL ranks on two GPUs (FSDP2, 4 sharded layers), rank 1's device 20 ms slower per
    step: rank 0's wait per step, from CUDA events, exceeds rank 1's by at least 10 ms; nothing
    is dropped."""
    env = {**os.environ, "OUT_DIR": str(tmp_path), "SLOW_RANK": "1", "SLOW_MS": "20"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*cmd, str(WORKER)], env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    waits = [(tmp_path / f"wait-{rank}").read_text().split() for rank in (0, 1)]
    print(f"wait per step (s), measured, dropped: {waits}", file=sys.stderr)
    (w0, m0, d0), (w1, m1, d1) = waits
    assert float(w0) - float(w1) >= 0.010, waits
    assert int(m0) > 0 and int(m1) > 0 and int(d0) == int(d1) == 0, waits
