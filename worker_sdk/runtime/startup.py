"""What a rank does once ``resume()`` has loaded, before its first step: the step it starts at,
the training checks it arms, and what it tells the supervisor (HELLO, the checkpoints passed
over, LOADED). Called once, by :meth:`~.runtime.Runtime.start`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

from .channel import Channel
from .rank_files import local_rank, output_files
from .settings import Settings

if TYPE_CHECKING:
    from worker_sdk.checkpoint.parallel import Stateful
    from worker_sdk.checkpoint.restore import LoadResult

    from .replicas import ReplicaCheck
    from .step_prints import StepPrints
    from .stragglers import WaitReader

__all__ = ["announce", "first_step", "step_prints", "training_checks"]


def first_step(loaded: LoadResult, *, supervised: bool) -> int:
    """The step to run first: the one after the step loaded (0 on a fresh start); under rvsup,
    after a rollback, past the steps it skips (their number goes to ``RVSUP_SKIPPED_STEPS``)."""
    start = 0 if loaded.step is None else loaded.step + 1
    if supervised:  # after a rollback: the skipped steps stay skipped
        skipped = max(0, int(os.environ.get(p.ENV_RESUME_AT) or 0) - start)
        os.environ[p.ENV_SKIPPED_STEPS] = str(skipped)
        if skipped:
            from worker_sdk.checkpoint.loader_generators import LEDGER

            LEDGER.rolled_back(skipped)  # the loaders' epochs it may skip into
        start += skipped
    return start


def training_checks(
    objects: Sequence[Stateful], world_size: int, start: int, channel: Channel, rank: int
) -> tuple[ReplicaCheck | None, WaitReader | None, StepPrints]:
    """Under rvsup: with several ranks, the replicas' comparison (every ``RVSUP_VERIFY_EVERY``
    steps, when asked and there are DDP replicas) and the reader of the wait for the others
    (stragglers), when the parallelism has one; the resume check's fingerprints, armed from
    ``start``. They import torch: only loaded here."""
    last_finished = start - 1
    replicas: ReplicaCheck | None = None
    every = int(os.environ.get(p.ENV_VERIFY_EVERY) or 0)
    if every > 0 and world_size > 1:
        from .replicas import ReplicaCheck, ddp_modules

        modules = ddp_modules(objects)
        if modules:
            replicas = ReplicaCheck(every, modules, last_finished)
    wait: WaitReader | None = None
    if world_size > 1:
        from .stragglers import wait_of

        wait = wait_of(objects)
    prints = step_prints(objects, channel, rank)
    prints.arm(start)
    return replicas, wait, prints


def announce(
    channel: Channel,
    settings: Settings,
    loaded: LoadResult,
    start: int,
    world_size: int,
    total_steps: int | None,
) -> None:
    """Tell the supervisor that this rank started at ``start`` (where its output goes), which
    checkpoints it passed over, and what it resumed from."""
    out, err = output_files()
    channel.send(m.Hello(start, settings.host, local_rank(), world_size, total_steps, out, err))
    for path, reason in loaded.skipped:
        channel.send(m.CheckpointSkipped(str(path), reason))
    loaded_from = str(loaded.path) if loaded.path else None
    channel.send(
        m.Loaded(
            start,
            loaded_from,
            loaded.saved_world_size,
            loaded.resharded_from,
            loaded.source if loaded.path else None,
        )
    )


def step_prints(objects: Sequence[Stateful], channel: Channel, rank: int) -> StepPrints:
    """The resume check's fingerprints of this rank (sent by the ranks below ``PRINT_RANKS``),
    of the losses ``step()`` is given and the parameters of the modules among ``objects``."""
    from torch import nn

    from .step_prints import StepPrints

    modules = [obj for obj in objects if isinstance(obj, nn.Module)]
    return StepPrints(modules, channel.send if rank < p.PRINT_RANKS else None)
