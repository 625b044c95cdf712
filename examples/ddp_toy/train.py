"""A small DDP job made restartable by two worker_sdk calls (marked CALL 1 and CALL 2).

Synthetic regression data, a 3-layer MLP with dropout, Adam and a step LR schedule; gloo on CPU (NCCL
when run on GPUs). Run it under rvsup (``rvsup start job.toml``), under plain torchrun, or alone:
``RVSUP_CHECKPOINT_DIR=ckpt python train.py`` still checkpoints and resumes, without heartbeats.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("TOTAL_STEPS", "300")))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend steps are slower")
    parser.add_argument("--save-final", default="", help="rank 0 writes the final state here")
    parser.add_argument(
        "--kill-at-step",
        type=int,
        default=-1,
        help="a fault to recover from: rank 1 SIGKILLs itself at this step of a fresh run",
    )
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    # After an out-of-memory failure rvsup tells the next attempt; shrink the micro-batch and
    # accumulate gradients so that the effective batch, and the result, stay the same.
    ooms = int(os.environ.get("RVSUP_OOM_COUNT", "0"))
    micro = (
        max(1, args.batch >> ooms) if os.environ.get("RVSUP_LAST_FAILURE") == "oom" else args.batch
    )
    if rank == 0 and micro != args.batch:
        print(f"previous attempt ran out of memory: micro-batch {micro} instead of {args.batch}")

    torch.manual_seed(0)  # identical initial weights on every rank
    model = build_model(args.width)
    # with 3+ ranks, find_unused_parameters=True keeps DDP's gradient buckets as first built, so a
    # resumed run adds gradients in the same order as an uninterrupted one (bit-identical)
    ddp = (
        DistributedDataParallel(model, find_unused_parameters=world >= 3) if distributed else model
    )
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    torch.manual_seed(1000 + rank)  # each rank draws its own data

    # CALL 1: restore the newest checkpoint every rank completed (model, optimizer, schedule,
    # RNG states, and `extra`); returns the step to run next.
    start, extra = worker_sdk.resume(ddp, optimizer, scheduler, extra={"samples": 0})

    for step in range(start, args.steps):
        if rank == 1 and start == 0 and step == args.kill_at_step:
            print(f"rank 1: killing itself at step {step} (--kill-at-step)", flush=True)
            time.sleep(0.5)  # torchrun relays the line above from a log file, every 0.1 s
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(args.batch, 64)
        y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(args.batch, 1)
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros(())
        for i in range(0, args.batch, micro):
            xb, yb = x[i : i + micro], y[i : i + micro]
            loss = nn.functional.mse_loss(ddp(xb), yb) * (len(xb) / args.batch)
            loss.backward()
            step_loss += loss.detach()
        optimizer.step()
        scheduler.step()
        extra["samples"] += args.batch * world
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item() * args.batch / len(xb):.4f}", flush=True)
        # CALL 2: heartbeat, checkpoint when due, stop cleanly when asked. The loss (optional;
        # a tensor is read only at heartbeats) is watched: a NaN or a spike is rolled back.
        worker_sdk.step(step, extra=extra, loss=step_loss)

    if rank == 0:
        print(f"done: {args.steps} steps, {extra['samples']} samples", flush=True)
        if args.save_final:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save_final
            )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
