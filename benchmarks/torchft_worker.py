"""The benchmark workload as one torchft replica group of one rank (figure 12, ``live``).

Run by ``torchrun --nproc-per-node=1`` from the torchft virtualenv (``benchmarks/setup_torchft.sh``),
once per replica group, with ``REPLICA_GROUP_ID`` (0 or 1) and ``TORCHFT_LIGHTHOUSE`` set by the
torchft column (:class:`benchmarks.torchft_tool.TorchFT`). The training is the workload's
(:mod:`benchmarks.workload`): the same MLP from the same seed, SGD with momentum, each group one
batch of ``BENCH_BATCH`` per step drawn from its own stream (seed 1000 + group, as rank r's is
1000 + r), gradients averaged over the groups that take part in the step, ``BENCH_STEPS`` steps,
paced by ``BENCH_STEP_MS``. What torchft adds: a ``Manager`` per group (quorum from the
lighthouse at every step, ``min_replica_size = 1``), its DDP wrapper whose gradient all-reduce
goes through the Manager over its reconfigurable ``ProcessGroupGloo``, and its commit protocol
(the optimizer steps only when the step's all-reduce succeeded). A group that joins while the
other trains heals: it fetches the other's model and optimizer state and its step over torchft's
checkpoint transport (HTTP by default), and goes on from that step. No checkpoint is written.

Records (``BENCH_RECORD_DIR/rank-<group>.jsonl``, the workload's format, the group as the rank):
``boot``, ``start`` (once the first quorum is known: the step this process runs first; a healed
group's is the other's), ``step`` (a committed step), ``unused`` (after ``step``: this group's
batch was not in that step, its gradient counted as zeros: the step in which it healed),
``discarded`` (a step computed and not committed: its all-reduce failed), ``fault`` and
``done``.
The data of step s is the s-th batch of the group's stream whichever process computes it (a group
that heals to step s skips the batches of the steps it missed), so that a group's batches do not
depend on when it was restarted.
"""

from __future__ import annotations

import time

BOOT_T = time.time()

import datetime  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.workload import (  # noqa: E402
    IN_FEATURES,
    Pacer,
    Recorder,
    build_model,
    inject,
    parse_faults,
    should_fire,
    write_final,
)

PG_TIMEOUT = datetime.timedelta(seconds=5)  # as torchft's train_ddp.py example on CPU
MANAGER_TIMEOUT = datetime.timedelta(seconds=30)
GROUPS = 2  # replica groups of one rank: the workload's two ranks


class Batches:
    """The group's stream of batches, indexed by step: batch s is the s-th draw from the seed."""

    def __init__(self, seed: int, batch: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = batch
        self.drawn = 0

    def at(self, step: int) -> torch.Tensor:
        while self.drawn < step:  # steps this process never computed (before a heal)
            torch.randn(self.batch, IN_FEATURES, generator=self.gen)
            self.drawn += 1
        self.drawn += 1
        return torch.randn(self.batch, IN_FEATURES, generator=self.gen)


def first_start(record_dir: Path, group: int) -> None:
    """At the job's start, wait until every group's Manager is up (their lighthouse heartbeats
    running) before the first quorum, so that both groups train from step 0 as the workload's
    ranks do: with ``min_replicas = 1`` the lighthouse would otherwise start the first group alone
    and make the second heal. A restarted group finds every mark already there and goes on."""
    (record_dir / f"ready-{group}").touch()
    marks = [record_dir / f"ready-{g}" for g in range(GROUPS)]
    if all(m.exists() for m in marks):
        return
    deadline = time.monotonic() + 300.0
    while not all(m.exists() for m in marks) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # a few of the Managers' 100 ms heartbeats


def main() -> None:
    ft: Any = importlib.import_module("torchft")
    group = int(os.environ["REPLICA_GROUP_ID"])
    record_dir = Path(os.environ["BENCH_RECORD_DIR"])
    total = int(os.environ.get("BENCH_STEPS", "200"))
    width = int(os.environ.get("BENCH_WIDTH", "512"))
    batches = Batches(1000 + group, int(os.environ.get("BENCH_BATCH", "200")))
    faults = parse_faults(os.environ.get("BENCH_FAULT", ""))
    rec = Recorder(record_dir, group)
    rec.write("boot", -1, t=BOOT_T)
    torch.manual_seed(0)
    model = build_model(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def load_state(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    manager = ft.Manager(
        pg=ft.ProcessGroupGloo(timeout=PG_TIMEOUT),
        min_replica_size=1,
        load_state_dict=load_state,
        state_dict=state,
        replica_id=f"bench_{group}",
        timeout=MANAGER_TIMEOUT,
        init_sync=False,  # every group builds the same model from the same seed
    )
    ddp = ft.DistributedDataParallel(manager, model)
    first_start(record_dir, group)
    pacer = Pacer.from_env()
    started = False
    while manager.current_step() < total:
        step = manager.current_step()
        for kind, r, s, every in faults:
            if r == group and s == step and should_fire(record_dir, kind, r, s, every):
                rec.write("fault", step, kind=kind)
                inject(kind, step)
        manager.start_quorum()
        if not started:  # the step this process starts at is known once its first quorum is
            manager.wait_quorum()
            step = manager.current_step()
            rec.write("start", step)
            started = True
        optimizer.zero_grad(set_to_none=True)
        x = batches.at(step)
        y = x[:, :8].sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        used = manager.is_participating()  # False: a healing group's gradient counted as zeros
        if manager.should_commit():
            optimizer.step()
            rec.write("step", manager.current_step() - 1)
            if not used:
                rec.write("unused", manager.current_step() - 1)
        else:
            rec.write("discarded", step)
        pacer.wait()
    write_final(record_dir, group, model)
    rec.write("done", total - 1)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
