"""An Accelerate training script as its guides write it, with the SDK's two calls: 2 ranks
(torchrun, gloo), ``accelerator.prepare(model, optimizer, loader)`` with an ordinary
``DataLoader(shuffle=True)`` (Accelerate's default sampler: a generator of its own, seeded once
and handed from rank 0 to every rank at each epoch), the epoch loop starting at the
checkpoint's epoch and skipping the batches done with ``accelerator.skip_first_batches``, as
Accelerate's examples do. A checkpoint every ``EVERY`` steps.

Environment: ``CKPT`` (checkpoint directory), ``OUT`` (rank 0 saves the final state there),
``KILL_AT`` (batches at which rank 1 SIGKILLs itself in a fresh run: "a,b" for the first and
the second start), ``EPOCHS``, ``EVERY`` (optimizer steps), ``ACCUMULATE`` (K: Accelerate's
``gradient_accumulation_steps`` and ``accelerator.accumulate(model)``, ``step()`` at each
optimizer step, as docs/integrations.md says; 1 by default), ``SPLIT_UNEVEN`` ("1": ``DataLoaderConfiguration(
split_batches=True, even_batches=False)``, the loader's batch size the global one, 46 samples:
each global batch split between the ranks, the last one short on rank 1 instead of padded).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import worker_sdk

BATCH = 4
SAMPLES = 48  # 6 steps an epoch on each of 2 ranks


def main() -> None:
    torch.manual_seed(0)
    split_uneven = os.environ.get("SPLIT_UNEVEN") == "1"
    config = DataLoaderConfiguration(split_batches=split_uneven, even_batches=not split_uneven)
    accumulate = int(os.environ.get("ACCUMULATE", "1"))
    accelerator = Accelerator(
        cpu=True, dataloader_config=config, gradient_accumulation_steps=accumulate
    )
    samples = SAMPLES - 2 if split_uneven else SAMPLES
    data = TensorDataset(torch.randn(samples, 4), torch.randn(samples, 1))
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batch = BATCH * accelerator.num_processes if split_uneven else BATCH
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    ckpt = Path(os.environ["CKPT"])
    start, _ = worker_sdk.resume(
        model, opt, checkpoint_dir=ckpt, every_steps=int(os.environ["EVERY"])
    )
    starts = ckpt.with_name(f"{ckpt.name}.starts.{accelerator.process_index}")
    n_start = len(starts.read_text()) if starts.exists() else 0
    starts.write_text("x" * (n_start + 1))
    kills = [int(k) for k in os.environ.get("KILL_AT", "").split(",") if k]
    kill_at = kills[n_start] if n_start < len(kills) else -1
    per_epoch = len(loader)
    first = start * accumulate  # the batch after the optimizer step resumed from
    for epoch in range(first // per_epoch, int(os.environ["EPOCHS"])):
        skip = first - epoch * per_epoch
        batches = accelerator.skip_first_batches(loader, skip) if skip > 0 else loader
        for i, (x, y) in enumerate(batches, start=max(skip, 0)):
            batch = epoch * per_epoch + i
            if batch == kill_at and accelerator.process_index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:  # an optimizer step: rvsup's step
                worker_sdk.step(batch // accumulate)
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), os.environ["OUT"])
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
