"""Bring your own checkpoint: a DDP loop that writes its own checkpoints (torch.save to a folder
of its own), supervised by rvsup without rvsup writing any of them.

Three calls: ``resume(external=True)`` says where the newest checkpoint every rank reported
durable is, ``step()`` says when one is due (rvsup's schedule from job.toml, or a stop at a
common step on preemption), ``checkpointed()`` reports this rank's part durable. rvsup commits
only a small marker of it (RNG states and the path), which its restart budget, no-progress rule
and history count as a checkpoint. See docs/integrations.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


def save_own(folder: Path, step: int, rank: int, state: dict[str, object]) -> Path:
    """This framework's checkpoint: rank 0 writes the (replicated) state, fsynced; every rank
    names the file. A kill before the rename leaves no file, only a ``.partial``."""
    path = folder / f"own-{step:06d}.pt"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with open(partial, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--own-dir", default="own_checkpoints", help="where this loop saves")
    parser.add_argument("--save-final", default="", help="rank 0 writes the final state here")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend steps are slower")
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

    torch.manual_seed(0)  # identical initial weights on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    torch.manual_seed(1000 + rank)  # each rank draws its own data

    # CALL 1: rvsup saves nothing of ours; it says which of our checkpoints to load (the newest
    # every rank reported durable) and restores the RNG states it had.
    start, path = worker_sdk.resume(external=True)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rank == 0:
            print(f"resumed from {path} at step {start}", flush=True)

    for step in range(start, args.steps):
        if rank == 1 and start == 0 and step == args.kill_at_step:
            print(f"rank 1: killing itself at step {step} (--kill-at-step)", flush=True)
            time.sleep(0.5)  # torchrun relays the line above from a log file, every 0.1 s
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(16, 32)
        y = x[:, :4].sum(dim=1, keepdim=True)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        # CALL 2: heartbeat; True when a checkpoint is due at this step (every rank alike)
        if worker_sdk.step(step, loss=loss.detach()):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            own = save_own(Path(args.own_dir), step, rank, state)
            # CALL 3: our part of step's checkpoint is durable; a stop asked here ends here
            worker_sdk.checkpointed(step, own)

    if rank == 0 and args.save_final:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save_final
        )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
