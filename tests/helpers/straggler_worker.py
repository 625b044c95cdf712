"""The straggler tests' training script: a small DDP MLP trained for DURATION_S seconds.

STEP_SLEEP=seconds: every rank sleeps this long in every step (between forward and backward).
SLOW_RANK=r, SLOW_FROM_S=t, SLOW_S=s: from t seconds after its first step on, rank r alone
sleeps s seconds more in each step, and writes the wall-clock time it began (``time.time()``)
into ONSET_FILE.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    duration = float(os.environ.get("DURATION_S", "20"))
    step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_from = float(os.environ.get("SLOW_FROM_S", "0"))
    slow_s = float(os.environ.get("SLOW_S", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    start, _ = worker_sdk.resume(ddp, opt)
    began = time.monotonic()
    slowed = False
    step = start
    # every rank stops at the same step: rank 0 decides when the time is up
    go_on = torch.ones(1)
    while go_on.item() > 0:
        x = torch.randn(32, 64)
        loss = ddp(x).pow(2).mean()
        pause = step_sleep
        if rank == slow_rank and time.monotonic() - began >= slow_from:
            if not slowed:
                slowed = True
                Path(os.environ["ONSET_FILE"]).write_text(repr(time.time()))
            pause += slow_s
        if pause:
            time.sleep(pause)
        loss.backward()
        opt.step()
        opt.zero_grad()
        worker_sdk.step(step)
        step += 1
        if step % 20 == 0:
            go_on.fill_(1.0 if time.monotonic() - began < duration else 0.0)
            dist.broadcast(go_on, src=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
