"""One rank of figure 8b, run by torchrun (2 ranks, gloo, CPU): how long a save stalls training.

Environment: ``KIND`` (``ddp`` | ``fsdp2``), ``SIZE_MB`` (the model's total parameter bytes),
``REPS``, ``RSS_SAVES`` (asynchronous saves in a row for the memory measurement), ``DIR`` (where
checkpoints go), ``OUT`` (rank 0 writes the results there as JSON).

Each repetition saves the same model with every writer, in an order that rotates: rvsup's
synchronous save, rvsup's asynchronous save (the stall is the call; "durable" is until the
writer process committed it), ``torch.save`` + fsync of each rank's state to a new file (the
previous one deleted after), and ``torch.distributed.checkpoint.save`` as shipped (not atomic)
into a new directory (the previous one deleted after). The page cache is flushed (``sync``)
before every save and the ranks meet at a barrier around each.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch import nn

WRITERS = ("rvsup sync", "rvsup async", "torch.save+fsync new", "dcp.save")
_LAYER_BYTES = 1024 * 1024 * 4  # one Linear(1024, 1024) without bias


def build(kind: str, size_mb: int) -> nn.Module:
    layers = max(1, size_mb * (1 << 20) // _LAYER_BYTES)
    model = nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(layers)))
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _local_state(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}


def rss_of_tree() -> int:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kind, size_mb = os.environ["KIND"], int(os.environ["SIZE_MB"])
    reps, rss_saves = int(os.environ["REPS"]), int(os.environ["RSS_SAVES"])
    root = Path(os.environ["DIR"])
    model = build(kind, size_mb)

    from worker_sdk.checkpoint.background.async_save import AsyncSaver
    from worker_sdk.checkpoint.checkpointer import Checkpointer

    world = dist.get_world_size()
    sync_ck = Checkpointer(root / "sync", rank=rank, world_size=world, attempt_tag="b", keep_last=1)
    async_ck = Checkpointer(
        root / "async", rank=rank, world_size=world, attempt_tag="b", keep_last=1
    )
    saver = AsyncSaver(async_ck)
    saver.start()
    time.sleep(3)  # the writer imports torch: under rvsup it starts at resume(), long before

    def torch_save(rep: int) -> None:
        path = root / "plain" / f"r{rank}-{rep}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            torch.save(_local_state(model), f)
            f.flush()
            os.fsync(f.fileno())
        (root / "plain" / f"r{rank}-{rep - 1}.pt").unlink(missing_ok=True)

    def dcp_save(rep: int) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save_state

        dcp_save_state(get_model_state_dict(model), checkpoint_id=root / "dcp" / str(rep))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root / "dcp" / str(rep - 1), ignore_errors=True)

    stall: dict[str, list[float]] = {w: [] for w in WRITERS}
    durable: dict[str, list[float]] = {w: [] for w in WRITERS}
    for rep in range(reps):
        order = WRITERS[rep % len(WRITERS) :] + WRITERS[: rep % len(WRITERS)]
        for writer in order:
            if rank == 0:
                os.sync()
            dist.barrier()
            t0 = time.monotonic()
            if writer == "rvsup sync":
                sync_ck.save(rep, [model], None)
            elif writer == "rvsup async":
                saver.submit(rep, [model], None)
            elif writer == "torch.save+fsync new":
                torch_save(rep)
            else:
                dcp_save(rep)
            stalled = time.monotonic() - t0
            if writer == "rvsup async":
                outcome = saver.wait()
                assert outcome is not None
                assert outcome.failed is None, outcome.failed
                done = time.monotonic() - t0
            else:
                done = stalled
            dist.barrier()
            stall[writer].append(stalled)
            durable[writer].append(done)
    rss: list[int] = []
    for i in range(rss_saves):
        saver.submit(reps + i, [model], None)
        saver.wait()
        rss.append(rss_of_tree())
    saver.close()
    if rank == 0:
        Path(os.environ["OUT"]).write_text(
            json.dumps({"stall": stall, "durable": durable, "rss": rss, "kind": kind})
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
