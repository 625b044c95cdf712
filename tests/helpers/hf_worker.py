"""A real ``transformers.Trainer`` under rvsup: a tiny GPT-2 built from a config (nothing is
downloaded), synthetic token sequences, ``RvsupCallback`` added and ``trainer.train()`` called,
nothing else. Environment: TOTAL_STEPS, OUT (the Trainer's output_dir), FINAL (rank 0 saves
the final weights and optimizer there), KILL_AT (rank 1 SIGKILLs itself after that optimizer
step of the first attempt), STEP_SLEEP (seconds added to every step)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from worker_sdk.integrations.transformers import RvsupCallback


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.data = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class Faults(TrainerCallback):
    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if float(os.environ.get("STEP_SLEEP", "0")):
            time.sleep(float(os.environ["STEP_SLEEP"]))
        kill_at = int(os.environ.get("KILL_AT", "-1"))
        first = os.environ.get("RVSUP_ATTEMPT", "1") == "1"
        if first and args.process_index == 1 and state.global_step == kill_at:
            print(f"rank 1: killing itself after step {kill_at}", flush=True)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1
    )
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=os.environ["OUT"],
        max_steps=int(os.environ["TOTAL_STEPS"]),
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",  # rvsup says when (job.toml's [checkpoint])
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(96, 16, 128),  # 12 steps an epoch on 2 ranks
        callbacks=[RvsupCallback(), Faults()],
    )
    trainer.train()
    assert trainer.optimizer is not None
    if args.process_index == 0 and os.environ.get("FINAL"):
        state = {"model": model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
        torch.save(state, os.environ["FINAL"])


if __name__ == "__main__":
    main()
