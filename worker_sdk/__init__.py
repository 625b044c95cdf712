"""rvsup's worker SDK: two calls make a training script restartable.

.. code-block:: python

    import worker_sdk

    start, extra = worker_sdk.resume(model, optimizer, scheduler, extra=(x, y))
    for step in range(start, total_steps):
        ...  # forward, backward, optimizer.step()
        worker_sdk.step(step, extra=(x, y))

Under ``rvsup start`` the settings come from job.toml; without rvsup pass ``checkpoint_dir=`` (or set
``RVSUP_CHECKPOINT_DIR``) and ``every_steps=`` to keep the checkpointing, without heartbeats.
"""

from __future__ import annotations

import atexit
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .contract import protocol
from .contract.protocol import UsageError

# the supervisor imports worker_sdk.contract: keep torch out of this module
if TYPE_CHECKING:
    from worker_sdk.checkpoint.parallel import Stateful

    from .runtime.runtime import Runtime

__all__ = ["UsageError", "checkpointed", "phase", "protocol", "resume", "step"]

_current: Runtime | None = None
_monotonic = time.monotonic
_INF = float("inf")
_NEG_INF = -_INF


def resume(
    *objects: Stateful,
    extra: Any = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    every_steps: int | None = None,
    every: float | None = None,
    keep_last: int | None = None,
    async_save: bool | None = None,
    total_steps: int | None = None,
    external: bool = False,
    fingerprint: Sequence[Any] = (),
) -> tuple[int, Any]:
    """Register what to checkpoint, restore the newest complete checkpoint; return (start_step, extra).

    Call once, after the model is wrapped (DDP/FSDP) and the optimizer built, and after
    ``torch.distributed.init_process_group`` when the job is distributed. ``start_step`` is 0 on a
    fresh start; ``extra`` is the saved one, or the given one on a fresh start. The keyword
    arguments apply only when the script runs without rvsup (job.toml wins under rvsup);
    ``async_save=True`` (job.toml: ``[checkpoint] async = true``) makes ``step()`` block only
    while the state is copied to shared memory, a background process writing it.
    ``total_steps``, optional, is the number of steps the script runs to: ``rvsup status``
    shows how long the rest will take from it.

    Any parallelism, nothing to configure: plain modules and DDP are saved once (replicated);
    FSDP1, FSDP2 (``fully_shard``) and other DTensor models, with their optimizers, are saved by
    every rank, each its own shards (torch.distributed.checkpoint). Objects rvsup cannot save
    correctly (ZeroRedundancyOptimizer, DeepSpeed engines, anything without
    ``state_dict``/``load_state_dict``) raise TypeError/ValueError naming the object.

    A checkpoint written by N ranks resumes on M ranks: sharded state is resharded, replicated
    state loads as it is. Per rank: rank r < N gets rank r's RNG states and ``extra`` back; a
    new rank r >= N gets the ``extra`` given here and its RNGs (Python, NumPy, torch CPU and
    CUDA) seeded from the step and its rank (``worker_sdk.checkpoint.rng.derived_seed(step,
    r)``); the parts of ranks >= M are not used. Objects whose state differs between ranks (a stateful
    data loader, a per-rank sampler) are saved by every rank: rank r < N gets its own back, a new
    rank keeps the object as constructed, and ``resume()`` warns about both on another world size.

    An epoch loop that makes its DataLoader iterators again after ``resume()`` (skipping the
    batches before ``start_step``) resumes bit-exactly: until the first ``step()``, every
    iterator made and every batch fetched sees the RNG states the uninterrupted run had there.
    Where that cannot be made exact, the first ``step()`` warns and says what to change.

    ``external=True``: bring your own checkpoint (a framework that saves its own, see
    docs/integrations.md). Pass no objects: rvsup saves none of yours. ``step()`` returns True
    when a checkpoint is due (its schedule, a stop at a common step); the script saves its
    own and calls :func:`checkpointed`. Returns ``(start_step, path)``: ``path`` is what this
    rank gave ``checkpointed()`` for the newest checkpoint every rank reported durable (load
    it; ``start_step`` is its step + 1), or None on a fresh start. ``fingerprint``: the
    framework's model (modules), whose sampled parameters the resume check compares (rvsup
    saves none of them); without it only the losses given to ``step()`` are compared.
    """
    global _current
    if _current is not None:
        raise RuntimeError("worker_sdk.resume() was already called in this process")
    if total_steps is not None and (
        not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 1
    ):
        raise ValueError(
            f"total_steps must be a whole number of steps above 0, not {total_steps!r}"
        )
    watched = _watched(objects, external=external, fingerprint=fingerprint)
    from worker_sdk.checkpoint.restore import LoadResult

    from .checkpoint.checkpointer import Checkpointer
    from .runtime.exit_hooks import install_excepthook
    from .runtime.runtime import Runtime
    from .runtime.settings import resolve

    settings = resolve(
        checkpoint_dir=checkpoint_dir,
        every_steps=every_steps,
        every_s=every,
        keep_last=keep_last,
        async_save=async_save,
    )
    try:
        rank, world_size = _rank_and_world()
    except UsageError:
        if settings.supervised:
            from .runtime.exit_hooks import exit_on_usage_error

            exit_on_usage_error()
        raise
    if rank == 0:
        from .runtime.determinism import resume_warnings

        for warning in resume_warnings(objects, world_size):
            warnings.warn(warning, RuntimeWarning, stacklevel=2)
    from .checkpoint.loader_generators import LEDGER
    from .runtime.loader_rng import WATCH

    LEDGER.reset()  # the loaders' own shuffling generators: rvsup's checkpoints keep them
    if not external:
        WATCH.install()
    checkpointer = None
    memory = None
    if settings.checkpoint_dir is not None:
        checkpointer = Checkpointer(
            settings.checkpoint_dir,
            rank=rank,
            world_size=world_size,
            attempt_tag=settings.attempt_tag,
            keep_last=settings.keep_last,
            identity=settings.checkpoint_dir_id,
        )
        from .checkpoint.memory.load import load
        from .checkpoint.memory.tier import from_environment

        # the memory tier's writer starts now: its start-up overlaps the restore. None for a
        # framework that saves its own checkpoints: rvsup holds none of its state, and a
        # snapshot would name a step the framework cannot load
        if not external:
            memory = from_environment(
                rank=rank, world_size=world_size, attempt_tag=settings.attempt_tag
            )
        loaded = load(checkpointer, objects, extra, memory)  # a snapshot, else storage
    else:
        loaded = LoadResult(step=None, path=None, extra=extra, skipped=())
    if memory is None:  # a writer forked for the tier beside this rank: nothing adopts it
        from .checkpoint.background.async_save import release_forked_writer

        release_forked_writer()
    channel = None
    if settings.supervised:
        from .runtime.channel import Channel

        assert settings.endpoint is not None
        assert settings.secret_file is not None
        channel = Channel(
            settings.endpoint,
            protocol.read_secret(settings.secret_file),
            rank=rank,
            attempt=settings.attempt,
        )
    for note in loaded.notes:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    rt = Runtime(settings, watched, checkpointer, channel, rank=rank, world_size=world_size)
    rt.total_steps = total_steps
    rt.external = external
    if memory is not None:
        memory.channel = channel
        rt.memory = memory
    if loaded.step is not None:
        from .checkpoint import rng as _rng
        from .runtime.loader_rng import LoaderWindow

        # the DataLoader iterators the script makes until the first step() (an epoch loop)
        rt.window = LoaderWindow(_rng.capture(), objects)
        rt.window.install()
    start = rt.start(loaded)
    rt.excepthook = install_excepthook(rt)
    atexit.register(rt.leaving)
    _current = rt
    return start, loaded.extra


def _watched(
    objects: Sequence[Any], *, external: bool, fingerprint: Sequence[Any]
) -> Sequence[Any]:
    """What the runtime is given: the objects to save, or under ``external`` the modules whose
    parameters the resume check fingerprints (saved by the framework, never by rvsup)."""
    if external and objects:
        raise UsageError(
            "worker_sdk.resume(external=True) registers nothing: the framework saves its own "
            "checkpoints; pass no objects (or drop external=True for rvsup to save them)"
        )
    if fingerprint and not external:
        raise UsageError(
            "worker_sdk.resume(fingerprint=...) is for external=True: the modules given to "
            "resume() to be saved are fingerprinted already"
        )
    from torch import nn

    if not all(isinstance(m, nn.Module) for m in fingerprint):
        raise TypeError("worker_sdk.resume(fingerprint=...) takes torch modules (the model)")
    return objects or tuple(fingerprint)


def step(step: int, extra: Any = None, loss: Any = None) -> bool:
    """Mark iteration ``step`` (0-based) finished: heartbeat, save or stop when one is due.

    Returns True only under ``resume(external=True)``, when the script is to checkpoint
    ``step`` itself now and then call :func:`checkpointed`.

    ``loss``, optional, is the step's loss: a Python float or a 0-d tensor. Under rvsup it is
    watched for anomalies (a loss that is not finite, a spike): a float is checked at every
    step, a tensor only when a heartbeat is due (its value is read then, so that no step
    waits for the device otherwise). The value a heartbeat carries is the loss of the step it
    is sent at. The losses of the steps after each resume and save are the resume check's
    fingerprints (docs/resume-check.md): a restarted attempt's are compared with the failed
    attempt's at the same steps.
    """
    rt = _current
    if rt is None:
        raise RuntimeError("call worker_sdk.resume() before worker_sdk.step()")
    now = _monotonic()
    dt = now - rt.t_last
    rt.t_last = now
    rt.last_step = step
    rt.step_slot[0] = step  # a store into shared memory: the supervisor reads it exactly
    if dt > rt.max_dt:
        rt.max_dt = dt
    if loss is not None:
        rt.loss = loss  # a reference: read at heartbeat time
        prints = rt.prints  # the resume check keeps the losses of armed steps (references)
        if prints.base <= step < prints.until:
            prints.values[step - prints.base] = loss
        # NaN or infinite, caught here; a chained comparison allocates nothing
        if loss.__class__ is float and not _NEG_INF < loss < _INF:
            rt.loss_not_finite(step, loss, step)
    if step >= rt.next_save_step or now >= rt.next_due:
        return rt.slow_path(step, extra, now)
    return False


def checkpointed(step: int, path: str | os.PathLike[str]) -> None:
    """Bring your own checkpoint: this rank's part of the framework's checkpoint of ``step``
    (finished step, resumed at ``step + 1``) at ``path`` is durable (written and fsynced).

    Every rank calls it at the same step (it is a collective, like a save). Once every rank
    has, rvsup commits a small marker of it (the ranks' RNG states and paths, atomically):
    the restart budget, the no-progress rule and the history count it as a checkpoint, and
    the next attempt's ``resume(external=True)`` returns ``(step + 1, path)``. A stop asked
    at ``step`` (preemption, time limit, ``rvsup stop``) leaves the process here, after the
    marker. Without rvsup and without a checkpoint directory it does nothing.
    """
    rt = _current
    if rt is None:
        raise RuntimeError("call worker_sdk.resume(external=True) before worker_sdk.checkpointed()")
    if not rt.external:
        raise UsageError(
            "worker_sdk.checkpointed() marks the framework's own checkpoints: call "
            "worker_sdk.resume(external=True) instead of registering objects"
        )
    rt.checkpointed(step, os.fspath(path))


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Declare a long phase (evaluation, a big save) so that it is not taken for a hang."""
    rt = _current
    if rt is None:
        yield
        return
    began = _monotonic()
    rt.phase_changed(name, True)
    try:
        yield
    finally:
        rt.phase_changed(name, False)
        rt.t_last += _monotonic() - began  # the phase is not part of a step's duration


def _rank_and_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a requirement of the SDK
        dist = None  # type: ignore[assignment]
    distributed = dist is not None and dist.is_available()
    if distributed and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if distributed and world_size > 1:
        raise UsageError(
            f"worker_sdk.resume() was called before torch.distributed.init_process_group(), "
            f"in a job of {world_size} processes (WORLD_SIZE={world_size}, this is rank {rank}): "
            "without a process group the ranks cannot agree on the checkpoint to restore. "
            "Call init_process_group() first, then wrap the model (DDP/FSDP), build the "
            "optimizer, and call resume()"
        )
    return rank, world_size


def _reset_for_tests() -> None:
    """Forget the runtime (tests that call resume() twice in one process)."""
    global _current
    if _current is not None:
        _current.shutdown()
    _current = None
