"""Gradient accumulation as scripts write it, made restartable by two worker_sdk calls.

DDP on gloo (NCCL on GPUs): ``--accumulate K`` micro-batches per optimizer step, ``no_sync()``
for all but the last of them (no all-reduce until the gradients are summed), the loss divided
by K. The calls are marked CALL 1 and CALL 2.

Where ``step()`` goes (CALL 2): after every micro-batch (``--step-per micro``, the default) or
after every optimizer step (``--step-per optimizer``); both resume exactly. Per micro-batch, a
checkpoint, a memory snapshot or a stop can fall between two optimizer steps: the gradients
summed so far are then saved with it, by each rank (under ``no_sync()`` they differ between
ranks), and restored. Per optimizer step, a save never finds gradients being accumulated, and
saves none: smaller checkpoints, but a step of rvsup is K micro-batches (heartbeats, the hang
timeout and ``every_steps`` count them).

``--never-zero`` never calls ``zero_grad()`` (as pytorch/examples' FSDP + tensor-parallel
example does): every backward adds to the gradients of all the steps before, which are saved at
every checkpoint so that a resume is exact too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


def batch(index: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of this rank's share of a synthetic regression task."""
    g = torch.Generator().manual_seed(1000 * index + rank)
    x = torch.randn(size, 16, generator=g)
    return x, x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batches", type=int, default=64, help="micro-batches in all")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--step-per", choices=["micro", "optimizer"], default="micro")
    parser.add_argument("--never-zero", action="store_true", help="never call zero_grad()")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend steps are slower")
    parser.add_argument(
        "--kill-at", type=int, default=-1, help="rank 1 SIGKILLs itself at this step"
    )
    parser.add_argument("--save-final", default="", help="every rank writes its state here")
    args = parser.parse_args()
    k = args.accumulate
    if args.micro_batches % k:
        parser.error("--micro-batches must be a multiple of --accumulate")

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    # CALL 1: restore model, optimizer, the RNG states and any gradients held at the save
    start, _ = worker_sdk.resume(ddp, optimizer)

    per_step = 1 if args.step_per == "micro" else k  # micro-batches per step() call
    total = args.micro_batches // per_step
    for step in range(start, total):
        if rank == 1 and start == 0 and step == args.kill_at:
            print(f"rank 1: killing itself at step {step} (--kill-at)", flush=True)
            time.sleep(0.5)  # torchrun relays the line above from a log file, every 0.1 s
            os.kill(os.getpid(), signal.SIGKILL)
        for index in range(step * per_step, (step + 1) * per_step):
            last = index % k == k - 1  # the micro-batch that ends an accumulation
            sync = contextlib.nullcontext() if last or not distributed else ddp.no_sync()
            xb, yb = batch(index, rank, 8)
            with sync:
                loss = nn.functional.mse_loss(ddp(xb), yb) / k
                loss.backward()
            if last:
                optimizer.step()
                if not args.never_zero:
                    optimizer.zero_grad()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        # CALL 2: heartbeat, checkpoint when due, stop cleanly when asked
        worker_sdk.step(step, loss=loss.item())

    print(f"rank {rank}: done, {total} steps, last loss {loss.item():.5f}", flush=True)
    if args.save_final:
        Path(args.save_final).mkdir(parents=True, exist_ok=True)
        grads = {n: p.grad for n, p in model.named_parameters()}
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "grads": grads}
        torch.save(state, Path(args.save_final) / f"rank-{rank}.pt")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
