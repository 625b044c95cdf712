"""One rank of the sharded-checkpoint process tests, run by torchrun: a small MLP as plain DDP,
FSDP1 or FSDP2 on a CPU mesh (gloo), Adam and a step LR schedule, the two SDK calls without rvsup.

Environment:

- ``KIND``: ``ddp`` | ``fsdp1`` | ``fsdp2``; ``TOTAL``: steps; ``EVERY``: checkpoint every N steps;
  ``CKPT``: the checkpoint directory.
- ``OUT``: where rank 0 writes the full (unsharded) model, optimizer and schedule state, and
  every rank ``OUT.rank<r>.json`` (its ``extra`` and its next random draw): at the end, or with
  ``LOAD_ONLY=1`` right after ``resume()`` (nothing is trained).
- ``FAULT``: ``kill:<rank>:<step>`` (SIGKILL itself at the start of that step) or
  ``killsave:<rank>:<step>`` (FSDP: SIGKILL itself inside that step's save, once its DCP files
  are written and before the ranks agree). With ``RVSUP_CKPT_ASYNC=1`` (asynchronous saves):
  ``killstage:<rank>:<step>`` (SIGKILL inside that step's staging, its tensors half copied),
  ``killwriting:<rank>:<step>`` (once the rank's writer process has written its part of that
  step, before it tells rank 0's writer) and ``killrename:0:<step>`` (once rank 0's writer has
  written the manifest, before the rename): the writer is frozen there, the rank kills itself.
- The memory tier (``RVSUP_MEMORY_DIR`` set): ``STEP_SLEEP`` seconds per step; the first step
  after the resume waits until the memory tier's first snapshot is complete (its writer has
  started); ``SNAPSHOT_BEFORE_KILL=s``: from step s on every step waits until no snapshot is
  being written (so that its snapshot is taken), and a ``kill`` until one of step s or later is;
  ``killwriting`` waits before its step until no snapshot is being written (so that the step's
  snapshot is taken, not put off).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.nn.parallel import DistributedDataParallel

import worker_sdk
from worker_sdk.checkpoint import collectives as _collectives
from worker_sdk.checkpoint import dcp as _dcp
from worker_sdk.checkpoint.background import arena as _arena
from worker_sdk.checkpoint.background.async_save import AsyncSaver


def fault() -> tuple[str, int, int] | None:
    spec = os.environ.get("FAULT")
    if not spec:
        return None
    kind, rank, step = spec.split(":")
    return kind, int(rank), int(step)


def kill_self(fault_kind: str, step: int) -> None:
    """SIGKILL this rank, first leaving ``OUT.rank<r>.killed`` ("<fault> <step>") as its own
    evidence: torchrun's failure summary may name another rank's end instead (gloo aborts the
    peer of a vanished rank, and torchrun reports whichever exit it saw first)."""
    rank = int(os.environ["RANK"])
    Path(f"{os.environ['OUT']}.rank{rank}.killed").write_text(f"{fault_kind} {step}")
    os.kill(os.getpid(), signal.SIGKILL)


def arm_kill_in_save(step: int) -> None:
    """SIGKILL this rank inside the save of ``step``, once DCP has written its files (and
    .metadata) and before the ranks agree: nothing of that step is committed."""
    real_write = _dcp.write

    def write(state: dict[str, Any], directory: Path, rank: int) -> list[int]:
        sums = real_write(state, directory, rank)
        if directory.parent.name.startswith(f".tmp-step-{step:010d}-"):
            kill_self("killsave", step)
        return sums

    _dcp.write = write


def arm_kill_in_staging(step: int, current: list[int]) -> None:
    """SIGKILL this rank in the middle of staging the save of ``step``: after the first
    tensor is copied into the shared-memory arena."""
    real_stage = _arena.stage

    def stage(payload: Any, arena: Any, start: int = 0) -> tuple[Any, int]:
        if current[0] == step:
            first = next(iter(_arena.tensors_in(payload)))
            arena.bytes[: first.numel() * first.element_size()].view(first.dtype).copy_(
                first.flatten()
            )
            kill_self("killstage", step)
        return real_stage(payload, arena, start)

    _arena.stage = stage


def kill_once_writer_paused(fault_kind: str, step: int) -> None:
    """Wait until this rank's writer process froze itself (tests.helpers.paused_writer), then
    SIGKILL this rank: the writer dies with it."""
    import psutil

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.status() == psutil.STATUS_STOPPED:
                    kill_self(fault_kind, step)
        time.sleep(0.01)
    raise RuntimeError("the writer never paused")


def wait_for_snapshot(lowest: int) -> None:
    """Wait (at most 40 s) until the memory tier holds a complete snapshot of ``lowest`` or later."""
    directory = os.environ.get("RVSUP_MEMORY_DIR")
    if not directory:
        return
    from worker_sdk.contract import layout

    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        info = layout.latest(Path(directory))
        if info is not None and info.step >= lowest:
            return
        time.sleep(0.02)


def wait_until_memory_idle() -> None:
    """Wait (at most 40 s) until no snapshot is being written (no temporary directory left in
    the memory tier's directory): the next snapshot is not put off."""
    directory = os.environ.get("RVSUP_MEMORY_DIR")
    if not directory:
        return
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if not any(n.startswith(".tmp-step-") for n in os.listdir(directory)):
            return
        time.sleep(0.02)


def build(kind: str, world: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The (wrapped) model to train and give to resume(), and its optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Dropout(0.1), nn.Linear(33, 5))
    wrapped: nn.Module
    if kind == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
    elif kind == "fsdp1":
        wrapped = FullyShardedDataParallel(
            model, device_id=torch.device("cpu"), use_orig_params=True
        )
    else:
        wrapped = DistributedDataParallel(model)
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-2)
    return wrapped, opt


def dump(out: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, extra: Any) -> None:
    """Rank 0: the full state to ``out``; every rank: its extra and next draw beside it."""
    # full tensors on every rank (cpu_offload=True crashes FSDP1 on CPU in torch 2.13)
    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    rank = dist.get_rank()
    if rank == 0:
        torch.save({"model": model_sd, "optim": optim_sd, "sched": sched.state_dict()}, out)
    info = {"seen": float(extra["seen"]), "draw": torch.rand(1).item()}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(info))
    # The last collective before exit: one that returns only once gloo has let go of its tensors
    # (worker_sdk/checkpoint/collectives.py), then a moment for the other gloo thread to drop the gather's
    # works; a gloo thread dropping a tensor during interpreter finalization aborts the rank.
    _collectives.all_gather_ints([rank])
    time.sleep(0.02)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    kind = os.environ["KIND"]
    total = int(os.environ.get("TOTAL", "16"))
    out = Path(os.environ["OUT"])
    model, opt = build(kind, world)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    f = fault()
    current = [-1]
    if f is not None and f[0] == "killsave" and f[1] == rank:
        arm_kill_in_save(f[2])
    if f is not None and f[0] == "killstage" and f[1] == rank:
        arm_kill_in_staging(f[2], current)
    paused_kill_step = -1
    if f is not None and f[0] in ("killwriting", "killrename") and f[1] == rank:
        phase = {"killwriting": "written", "killrename": "rename"}[f[0]]
        os.environ["RVSUP_TEST_WRITER_PAUSE"] = f"{phase}:{f[2]}"
        AsyncSaver.writer_module = "tests.helpers.paused_writer"
        paused_kill_step = f[2]
    torch.manual_seed(1000 + rank)
    extra: dict[str, Any] = {"seen": torch.zeros(1)}
    start, extra = worker_sdk.resume(
        model,
        opt,
        sched,
        extra=extra,
        checkpoint_dir=os.environ["CKPT"],
        every_steps=int(os.environ.get("EVERY", "4")),
    )
    print(f"rank {rank} of {world} resumes at {start}", flush=True)
    if os.environ.get("LOAD_ONLY") == "1":
        Path(f"{out}.rank{rank}.start").write_text(str(start))
        dump(out, model, opt, sched, extra)
        dist.destroy_process_group()
        return
    step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
    snapshot_from = int(os.environ.get("SNAPSHOT_BEFORE_KILL", "-1"))
    for step in range(start, total):
        if step == start + 1:
            wait_for_snapshot(start)
        if f is not None and f[0] == "kill" and f[1] == rank and f[2] == step:
            wait_for_snapshot(snapshot_from)
            kill_self("kill", step)
        if step == paused_kill_step or 0 <= snapshot_from <= step:
            wait_until_memory_idle()
        time.sleep(step_sleep)
        x = torch.randn(8, 16)
        loss = nn.functional.mse_loss(model(x), x[:, :5])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        extra["seen"] += 1
        current[0] = step
        worker_sdk.step(step, extra=extra)
        if step == paused_kill_step and f is not None:
            kill_once_writer_paused(f[0], step)
    dump(out, model, opt, sched, extra)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
