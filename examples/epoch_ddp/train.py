"""An epoch loop as the training guides write it, made restartable by two worker_sdk calls.

DistributedSampler with ``set_epoch``, a DataLoader with default arguments, a model with dropout,
Adam, bfloat16 autocast with a GradScaler; gloo on CPU (NCCL on GPUs). The calls are marked CALL 1
and CALL 2. A killed rank costs the steps since the last checkpoint, nothing else: the resumed run
ends with the weights an uninterrupted run ends with, bit for bit. ``RunningLoss`` is state that
differs between ranks (each averages its own shard's losses); rvsup saves it per rank.

``--loader stateful`` uses torchdata's StatefulDataLoader instead (``pip install torchdata``),
given to ``resume()`` so that it resumes mid-epoch without replaying the epoch's first batches.
``--from-epoch-0`` loops over every epoch from 0 as many scripts do: it resumes exactly too, and
rvsup warns that the epochs done are read only to be skipped.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import worker_sdk


class RunningLoss:
    """This rank's mean training loss: its own state on every rank (saved per rank)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, loss: float) -> None:
        self.total += loss
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total, self.count = state["total"], state["count"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic dataset")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--loader", choices=["default", "stateful"], default="default")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pretend steps are slower")
    parser.add_argument("--kill-at-step", type=int, default=-1, help="rank 1 SIGKILLs itself here")
    parser.add_argument("--save-final", default="", help="every rank writes its state here")
    parser.add_argument(
        "--from-epoch-0",
        action="store_true",
        help="loop over every epoch from 0, skipping the steps before the checkpoint's (as many "
        "scripts do: it resumes exactly too, and reads the epochs done for nothing)",
    )
    args = parser.parse_args()
    if args.from_epoch_0 and args.loader == "stateful":
        parser.error("--from-epoch-0 is for a DataLoader: a StatefulDataLoader resumes its epoch")

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)  # the same data and initial weights on every rank
    x = torch.randn(args.samples, 32)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(args.samples, 1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader: DataLoader[Any] = StatefulDataLoader(
            dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers
        )
    else:
        loader = DataLoader(
            dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers
        )
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 1))
    ddp = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    scaler = torch.amp.GradScaler(device, growth_interval=20)
    running = RunningLoss()

    # CALL 1: restore model, optimizer, scaler, the loss average (and a stateful loader) and the
    # RNG states from the newest checkpoint every rank completed; returns the step to run next.
    stateful = [loader] if args.loader == "stateful" else []
    start, _ = worker_sdk.resume(ddp, optimizer, scaler, running, *stateful)

    steps_per_epoch = len(loader)
    step = start
    epoch = 0 if args.from_epoch_0 else start // steps_per_epoch
    while epoch < args.epochs:
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if not stateful:  # a DataLoader starts its epoch again
                step = epoch * steps_per_epoch + i
                if step < start:
                    continue  # trained before the checkpoint
            if rank == 1 and start == 0 and step == args.kill_at_step:
                print(f"rank 1: killing itself at step {step} (--kill-at-step)", flush=True)
                time.sleep(0.5)  # torchrun relays the line above from a log file, every 0.1 s
                os.kill(os.getpid(), signal.SIGKILL)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(ddp(xb.to(device)).float(), yb.to(device))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running.add(loss.item())
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if rank == 0 and step % 50 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            # CALL 2: heartbeat, checkpoint when due, stop cleanly when asked.
            worker_sdk.step(step)
            step += 1
        # a StatefulDataLoader resumes where the checkpoint left it; restored after an epoch's
        # last batch, its first pass yields nothing, and the loop comes back to begin the next
        epoch = step // steps_per_epoch if stateful else epoch + 1

    print(f"rank {rank}: done, {step} steps, mean loss {running.total / running.count:.4f}")
    if args.save_final:
        Path(args.save_final).mkdir(parents=True, exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        state |= {"scaler": scaler.state_dict(), "running": running.state_dict()}
        torch.save(state, Path(args.save_final) / f"rank-{rank}.pt")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
