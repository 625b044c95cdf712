"""A 2-rank NCCL FSDP2 job on two GPUs for the device timer's test: rank SLOW_RANK keeps its
device busy for SLOW_MS more before every step's forward (``torch.cuda._sleep``, a spinning
kernel: the device is slow, the host is not); each rank writes its wait per step, as the SDK
reads it from CUDA events, into OUT_DIR/wait-<rank>. Run with torchrun --nproc-per-node 2."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from worker_sdk.runtime.stragglers import CollectiveWait

CYCLES_PER_MS = 1_500_000  # about a GPU's clock (1.5 GHz); the figure need not be exact


def main() -> None:
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    slow_rank = int(os.environ.get("SLOW_RANK", "1"))
    slow_ms = float(os.environ.get("SLOW_MS", "20"))
    steps = int(os.environ.get("STEPS", "40"))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(4))).cuda()
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    wait = CollectiveWait.of([model])
    assert isinstance(wait, CollectiveWait) and wait._ring is not None
    x = torch.randn(256, 1024, device="cuda")
    waits: list[float] = []
    for step in range(1, steps + 1):
        if rank == slow_rank:
            torch.cuda._sleep(int(slow_ms * CYCLES_PER_MS))
        model(x).sum().backward()
        if step % 10 == 0:
            torch.cuda.synchronize()  # the test's own choice: every measurement resolved
            got = wait.read(10)
            if step > 10 and got is not None:  # the first ten steps warm up
                waits.append(got)
    ring = wait._ring
    assert ring is not None and waits
    line = f"{sum(waits) / len(waits)} {ring.measured} {ring.dropped}\n"
    Path(os.environ["OUT_DIR"], f"wait-{rank}").write_text(line)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
