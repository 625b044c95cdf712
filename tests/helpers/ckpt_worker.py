"""One rank of the multi-process checkpoint tests: trains a tiny replicated model and saves,
or restores the newest checkpoint, printing one JSON line per save or load.

Usage::

    python ckpt_worker.py save|load DIR STORE_FILE RANK WORLD_SIZE ATTEMPT_TAG [STEP,STEP,...]
    python ckpt_worker.py release DIR STORE_FILE RANK WORLD_SIZE TAG ROUNDS

``release`` runs ROUNDS all_gathers straight through torch.distributed and ROUNDS through the
checkpoint rounds' wrapper, and prints how many of each returned while the backend still held
their tensors.

Fault switch (environment): ``CKPT_WORKER_HANG_AT=<step>`` and ``CKPT_WORKER_HANG_FILE=<path>``
make this rank, once its part of that step is written, create the file and sleep until it is
killed instead of joining the other ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from worker_sdk.checkpoint import collectives as _collectives
from worker_sdk.checkpoint.checkpointer import Checkpointer


class FaultyCheckpointer(Checkpointer):
    """A Checkpointer that can stall between writing its part and the agreement."""

    def _agree_parts_written(
        self, step: int, ok: bool, sums: Sequence[int], width: int
    ) -> tuple[list[int], list[list[int]]]:
        if os.environ.get("CKPT_WORKER_HANG_AT") == str(step):
            Path(os.environ["CKPT_WORKER_HANG_FILE"]).write_text(str(os.getpid()))
            while True:
                time.sleep(60)
        return super()._agree_parts_written(step, ok, sums, width)


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def held_after_return(rounds: int, through_wrapper: bool) -> int:
    """How many all_gathers returned while the backend still referenced their tensors."""
    return sum(held_after_one(i, through_wrapper) for i in range(rounds))


def held_after_one(i: int, through_wrapper: bool) -> bool:
    mine = torch.tensor([i, dist.get_rank()])
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    tensors = [mine, *gathered]
    before = [sys.getrefcount(t) for t in tensors]
    if through_wrapper:
        _collectives._run_and_wait_release(lambda: dist.all_gather(gathered, mine), tensors)
    else:
        dist.all_gather(gathered, mine)
    return [sys.getrefcount(t) for t in tensors] != before


def main() -> None:
    mode, directory, store, rank_s, world_s, tag = sys.argv[1:7]
    steps = [int(s) for s in sys.argv[7].split(",")] if len(sys.argv) > 7 else []
    rank, world_size = int(rank_s), int(world_s)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        if mode == "release":
            rounds = steps[0]
            emit(raw=held_after_return(rounds, False), wrapped=held_after_return(rounds, True))
            return
        torch.manual_seed(0 if mode == "save" else 99)
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ck = FaultyCheckpointer(
            Path(directory), rank=rank, world_size=world_size, attempt_tag=tag, keep_last=2
        )
        if mode == "load":
            got = ck.load_latest([model, opt], extra=None)
            skipped = [[str(p), why] for p, why in got.skipped]
            draw = torch.rand(1).item()
            emit(
                event="loaded",
                step=got.step,
                extra=got.extra,
                digest=digest(model),
                next_draw=draw,
                skipped=skipped,
            )
            return
        for step in range(max(steps, default=-1) + 1):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step in steps:
                result = ck.save(step, [model, opt], extra={"rank": rank, "step": step})
                draw = torch.rand(1).item()
                emit(
                    event="saved",
                    step=step,
                    committed=result.committed,
                    digest=digest(model),
                    next_draw=draw,
                )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
