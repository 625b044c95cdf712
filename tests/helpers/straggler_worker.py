"""The straggler tests' training script: a small MLP trained for DURATION_S seconds.

KIND: ``ddp`` (default), ``fsdp1`` or ``fsdp2`` (each linear layer and the root sharded, CPU).
STEP_SLEEP=seconds: every rank sleeps this long in every step, inside its forward (between the
two layers).
SLOW_RANK=r, SLOW_FROM_S=t, SLOW_S=s: from t seconds after its first step on, rank r alone
sleeps s seconds more in each step, and writes the wall-clock time it began (``time.time()``)
into ONSET_FILE.
END_FILE=path: the training also ends (at a step every rank reaches) once this file exists: a
test ends it when it has seen what it waits for.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


class Pause(nn.Module):
    """Sleeps ``seconds`` in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return x


def wrap(model: nn.Sequential, kind: str) -> nn.Module:
    """``model`` as DDP, FSDP1 or FSDP2."""
    if kind == "fsdp2":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if kind == "fsdp1":
        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    return DistributedDataParallel(model)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    duration = float(os.environ.get("DURATION_S", "20"))
    step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_from = float(os.environ.get("SLOW_FROM_S", "0"))
    slow_s = float(os.environ.get("SLOW_S", "0"))
    end_file = os.environ.get("END_FILE")
    torch.manual_seed(0)
    pause = Pause()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), pause, nn.Linear(128, 1))
    ddp = wrap(model, os.environ.get("KIND", "ddp"))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    start, _ = worker_sdk.resume(ddp, opt)
    began = time.monotonic()
    slowed = False
    step = start
    # every rank stops at the same step: rank 0 decides when the time is up
    go_on = torch.ones(1)
    while go_on.item() > 0:
        pause.seconds = step_sleep
        if rank == slow_rank and time.monotonic() - began >= slow_from:
            if not slowed:
                slowed = True
                Path(os.environ["ONSET_FILE"]).write_text(repr(time.time()))
            pause.seconds += slow_s
        x = torch.randn(32, 64)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        worker_sdk.step(step)
        step += 1
        if step % 20 == 0:
            ended = end_file is not None and os.path.exists(end_file)
            go_on.fill_(1.0 if time.monotonic() - began < duration and not ended else 0.0)
            dist.broadcast(go_on, src=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
