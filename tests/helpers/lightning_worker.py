"""A real Lightning ``Trainer`` under rvsup: a tiny LightningModule (an MLP with dropout),
synthetic data, ``RvsupCallback`` added and ``trainer.fit(model)`` called, nothing else.
Environment: TOTAL_STEPS, OUT (default_root_dir), FINAL (rank 0 saves the final weights and
optimizer there), ACCUMULATE (Lightning's ``accumulate_grad_batches``), KILL_AT (rank 1
SIGKILLs itself after that optimizer step of the first attempt; accumulating, after the next
batch: gradients accumulated, not yet stepped), STEP_SLEEP (seconds added to every step),
LOADER ("plain": a DataLoader, the default; "stateful": torchdata's StatefulDataLoader, whose
position Lightning saves; both shuffle, with 2 worker processes that add random noise to
every sample, as an augmentation),
VALIDATE (a validation loop, as the usual Lightning script has: its DataLoader's ``iter()``
draws from the global RNG; VALIDATE=0.5 validates in the middle of every epoch too,
``val_check_interval``; 3 batches of 8 a validation, ``limit_val_batches``). The chaos
runner's switches too (its Lightning shape runs this script): FAULT (tests/helpers/trainer.py),
injected before the step it names, and TAIL_FROM / TAIL_SLEEP."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tests.helpers.trainer import faults_now, inject
from worker_sdk.integrations.lightning import RvsupCallback


class Noisy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The samples with a little noise added to the inputs at every fetch (drawn in the
    loader's worker processes, from the seeds the loader's iterator gave them)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.01 * torch.randn(self.x.shape[1]), self.y[i]


class Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.mse_loss(self.net(x), y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def val_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(48, 8, generator=g)
        return DataLoader(TensorDataset(x, x[:, :2].sum(dim=1, keepdim=True)), batch_size=8)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(96, 8, generator=g)
        data = Noisy(x, x[:, :2].sum(dim=1, keepdim=True))
        if os.environ.get("LOADER") == "stateful":
            from torchdata.stateful_dataloader import StatefulDataLoader

            return StatefulDataLoader(data, batch_size=4, shuffle=True, num_workers=2)
        return DataLoader(data, batch_size=4, shuffle=True, num_workers=2)


class Faults(Callback):
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, i: int
    ) -> None:
        attempt = int(os.environ.get("RVSUP_ATTEMPT", "0"))
        for kind in faults_now(trainer.global_rank, trainer.global_step, attempt):
            inject(kind, trainer.global_step)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        pause = float(os.environ.get("STEP_SLEEP", "0"))
        if trainer.global_step > int(os.environ.get("TAIL_FROM", str(2**31))):
            pause = float(os.environ.get("TAIL_SLEEP", str(pause)))
        if pause:
            time.sleep(pause)
        kill_at = int(os.environ.get("KILL_AT", "-1"))
        first = os.environ.get("RVSUP_ATTEMPT", "1") == "1"
        accumulate = trainer.accumulate_grad_batches
        between = accumulate == 1 or (i + 1) % accumulate != 0  # accumulating: the next batch
        if first and trainer.global_rank == 1 and trainer.global_step == kill_at and between:
            print(f"rank 1: killing itself after step {kill_at}", flush=True)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    seed_everything(0, verbose=False)
    model = Regression()
    validate = os.environ.get("VALIDATE")
    if validate:
        checks: dict[str, Any] = {"val_check_interval": float(validate), "limit_val_batches": 3}
    else:
        checks = {"limit_val_batches": 0}
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=int(os.environ["TOTAL_STEPS"]),
        default_root_dir=os.environ.get("OUT", "lightning"),
        enable_checkpointing=False,  # rvsup says when (job.toml's [checkpoint])
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RvsupCallback(), Faults()],
        accumulate_grad_batches=int(os.environ.get("ACCUMULATE", "1")),
        **checks,
    )
    trainer.fit(model)
    if trainer.global_rank == 0 and os.environ.get("FINAL"):
        optimizer = trainer.optimizers[0]
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.environ["FINAL"]
        )


if __name__ == "__main__":
    main()
