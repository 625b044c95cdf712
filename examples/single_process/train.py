"""The simplest job rvsup supervises: one process, no torch.distributed, two worker_sdk calls
(marked CALL 1 and CALL 2). One GPU's worth of training as the guides begin it: a model, Adam, a
learning-rate schedule, dropout; on the CPU here, on ``cuda`` when there is one.

Run it under rvsup (``rvsup start job.toml``) or alone: ``RVSUP_CHECKPOINT_DIR=ckpt python
train.py`` still checkpoints and resumes, without heartbeats.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
from torch import nn

import worker_sdk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend steps are slower")
    parser.add_argument("--save-final", default="", help="write the final state here")
    parser.add_argument(
        "--kill-at-step",
        type=int,
        default=-1,
        help="a fault to recover from: the process SIGKILLs itself at this step of a fresh run",
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 1)).to(
        device
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)

    # CALL 1: restore the newest checkpoint (model, optimizer, schedule, RNG states, `extra`);
    # total_steps (optional) lets `rvsup status` say how long the rest will take
    start, extra = worker_sdk.resume(
        model, optimizer, scheduler, extra={"samples": 0}, total_steps=args.steps
    )

    for step in range(start, args.steps):
        if start == 0 and step == args.kill_at_step:
            print(f"killing itself at step {step} (--kill-at-step)", flush=True)
            time.sleep(0.5)  # torchrun relays the line above from a log file, every 0.1 s
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(args.batch, 64, device=device)
        y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(args.batch, 1, device=device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        extra["samples"] += args.batch
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        # CALL 2: heartbeat, checkpoint when due, stop cleanly when asked
        worker_sdk.step(step, extra=extra)

    print(f"done: {args.steps} steps, {extra['samples']} samples", flush=True)
    if args.save_final:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **extra}
        torch.save(state, args.save_final)


if __name__ == "__main__":
    main()
