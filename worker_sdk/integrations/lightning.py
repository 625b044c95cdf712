"""Lightning's ``Trainer`` under rvsup: ``Trainer(..., callbacks=[RvsupCallback()])``, then
``trainer.fit(model)``. Works with ``lightning`` and, when only it is installed,
``pytorch_lightning``.

Lightning's own checkpoints (``trainer.save_checkpoint``: weights, optimizers, schedulers, the
loops' progress, callbacks' and data modules' state) are kept, and made atomic by rvsup:

- **when**: after every optimizer step (``on_train_batch_end``) the callback calls
  ``worker_sdk.step``; when rvsup wants a checkpoint (job.toml's ``[checkpoint]``, or a stop at
  a common step) every rank calls ``trainer.save_checkpoint`` into
  ``<default_root_dir>/rvsup/step-<N>.ckpt``;
- **durable**: rank 0 fsyncs the file, every rank calls ``worker_sdk.checkpointed``; once all
  have, rvsup commits its marker (a stop leaves the process there);
- **resume**: in ``setup`` (before Lightning restores anything) the newest file a marker names
  is loaded as if given to ``fit(ckpt_path=...)``; newer files (a save a kill interrupted) are
  removed, never resumed. A ``ckpt_path`` the script passes itself wins. A resume in the
  middle of an epoch fetches the batches the checkpoint had trained on and gives the training
  the RNG states it had (``_lightning_epoch``): exact, where Lightning would start the epoch's
  data again.

Lightning's SLURM auto-requeue (``SLURMEnvironment(auto_requeue=True)``, on by default on SLURM)
would requeue the job a second time and its SIGTERM handler would end the ranks before rvsup's
checkpoint: under rvsup it is turned off (with a warning), and the handlers Lightning set for
``fit`` are put back to what they were before (:func:`put_back_signals`). Without rvsup the
callback does nothing.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

try:
    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
    from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose
except ImportError:  # only the older package name is installed
    from lightning_fabric.plugins.environments.slurm import (  # type: ignore[assignment]
        SLURMEnvironment,
    )
    from lightning_fabric.utilities.seed import (
        _collect_rng_states,
        _set_rng_states,
    )
    from pytorch_lightning import LightningModule, Trainer  # type: ignore[assignment]
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    from pytorch_lightning.trainer.connectors.signal_connector import (  # type: ignore[assignment]
        _HandlersCompose,
    )

import worker_sdk
from worker_sdk.contract import protocol as p

from ._common import active, fsync_tree, resume_external
from ._lightning_epoch import EpochStart, ResumedEpoch

__all__ = ["REQUEUE_WARNING", "RvsupCallback", "put_back_signals"]

REQUEUE_WARNING = (
    "rvsup: Lightning's SLURM auto-requeue is turned off: rvsup stops every rank at a common "
    "step, checkpoints and requeues the job itself (Lightning's SIGUSR1 handler would requeue "
    "it a second time, its SIGTERM handler end the ranks before that checkpoint)"
)
_FILE = re.compile(r"^step-(\d{10})\.ckpt$")


class RvsupCallback(Callback):
    """Supervision by rvsup for a Lightning ``Trainer``: add it, call ``trainer.fit(model)``."""

    def __init__(self) -> None:
        self.enabled = active()
        self.resume_from: str | None = None
        """The checkpoint file ``fit`` resumed from (None: a fresh start)."""
        self._keep = max(1, int(os.environ.get(p.ENV_KEEP_LAST) or 3))
        self._last_step = -1  # the optimizer step last reported (gradient accumulation: once)
        self._validation: AbstractContextManager[None] | None = None
        self._rng: dict[str, Any] | None = None  # the training's before a validation
        self._epoch = EpochStart()
        self._loaded_start: Any = None  # the checkpoint's epoch start (load_state_dict)
        self._resumed: dict[str, Any] | None = None  # the checkpoint's RNG states, on a resume

    def folder(self, trainer: Trainer) -> Path:
        """Where the callback has Lightning save the checkpoints rvsup asks for."""
        return Path(trainer.default_root_dir) / "rvsup"

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Before Lightning restores a checkpoint (the process group is up): turn its requeue
        off, pre-load the newest checkpoint rvsup marked."""
        if not self.enabled or stage != "fit":
            return
        disable_auto_requeue(trainer)
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        # Lightning makes the loaders' iterators itself (ResumedEpoch): no SDK loader window
        path = resume_external(total, pl_module)
        self.resume_from = path
        if trainer.is_global_zero:
            self._remove_unmarked(trainer, path)
        if path is not None and trainer.ckpt_path is None:
            # what fit(ckpt_path=path) does first; Lightning restores from it next
            trainer._checkpoint_connector.resume_start(path)
            self._resumed = _collect_rng_states()  # resume() put the checkpoint's back
        self._epoch.candidate()  # Lightning makes the first epoch's iterators next

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: the state the epoch's loader iterators were made
        from (a tensor, or None where unknown)."""
        return {"epoch_start": self._epoch.state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """From the checkpoint resumed: see :meth:`state_dict`."""
        self._loaded_start = state_dict.get("epoch_start")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning has just installed its signal handlers: rvsup's own stop is the one that
        counts, so put back those the process had. On a resume, the first batch goes through
        :class:`ResumedEpoch` (in the middle of an epoch, Lightning would start its data
        again)."""
        if not self.enabled:
            return
        put_back_signals(trainer._signal_connector)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if self._resumed is not None and getattr(fetcher, "iterator", None) is not None:
            states = self._resumed
            start = self._loaded_start if isinstance(self._loaded_start, torch.Tensor) else None
            fetcher.iterator = ResumedEpoch(  # type: ignore[union-attr]
                trainer, self._epoch, start, lambda: _set_rng_states(states)
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning makes this epoch's loader iterators next (or made them already)."""
        if self.enabled:
            self._epoch.candidate()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """At an epoch's first batch its iterators are made: note which state made them."""
        if self.enabled:
            self._epoch.settle(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After every batch: heartbeat at the optimizer step, with the batch's loss (the resume
        check's fingerprint, read at the heartbeat); a checkpoint when rvsup wants one."""
        if not self.enabled:
            return
        if trainer.enable_validation:  # a validation may follow: the states it is to give back
            self._rng = _collect_rng_states()
        step = trainer.global_step - 1
        if step < 0 or step == self._last_step:
            return
        self._last_step = step
        if not worker_sdk.step(step, loss=_loss_of(outputs)):
            return
        path = self.folder(trainer) / f"step-{step:010d}.ckpt"
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            fsync_tree(path)
        worker_sdk.checkpointed(step, path)
        if trainer.is_global_zero:
            self._prune(trainer)

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The RNG states the sanity check's validation is to give back (a resumed run skips
        it)."""
        if self.enabled:
            self._rng = _collect_rng_states()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A validation between steps is a phase, not a hang; and it draws no random number
        the training sees (:meth:`on_validation_end`)."""
        if self.enabled and self._validation is None and trainer.state.fn == "fit":
            self._validation = worker_sdk.phase("validation")
            self._validation.__enter__()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Put back the RNG states of the training before the validation (taken at the batch
        or sanity check it follows: Lightning makes the loaders' iterators, which draw from
        the global generators, before ``on_validation_start``). A resumed run does not
        validate where the run it replaces did (no sanity check; the validation its checkpoint
        was saved before), so the training after it would otherwise see another stream."""
        if self._validation is not None:
            self._validation.__exit__(None, None, None)
            self._validation = None
        if self._rng is not None:
            _set_rng_states(self._rng)
            self._rng = None

    def _remove_unmarked(self, trainer: Trainer, resume_from: str | None) -> None:
        newest = -1
        if resume_from is not None and (m := _FILE.match(Path(resume_from).name)):
            newest = int(m.group(1))
        folder = self.folder(trainer)
        if not folder.is_dir():
            return
        for entry in folder.iterdir():
            m = _FILE.match(entry.name)
            if m and int(m.group(1)) > newest:
                print(f"rvsup: removing {entry}: no checkpoint marker names it", file=sys.stderr)
                entry.unlink(missing_ok=True)

    def _prune(self, trainer: Trainer) -> None:
        """Keep as many files as rvsup keeps markers ([checkpoint] keep_last), the newest."""
        files = sorted(e for e in self.folder(trainer).iterdir() if _FILE.match(e.name))
        for old in files[: -self._keep]:
            old.unlink(missing_ok=True)


def put_back_signals(connector: Any) -> None:
    """Put back the handlers Lightning's signal connector replaced for ``fit`` (SIGTERM, and
    SIGUSR1 with its requeue on), and only those: its own ``teardown()`` sets every signal's
    handler back to what it was when ``fit`` began, which undoes what was registered since,
    rvsup's stack dumps on SIGUSR2 among them (``faulthandler``: a rank would then be killed by
    the signal that asks for its stacks, and a hang named without them)."""
    originals: dict[Any, Any] = connector._original_handlers
    for signum, original in originals.items():
        if isinstance(signal.getsignal(signum), _HandlersCompose) and original is not None:
            signal.signal(signum, original)
    connector._original_handlers = {}


def disable_auto_requeue(trainer: Trainer) -> bool:
    """Turn Lightning's SLURM auto-requeue off, with a warning naming why; whether it was on."""
    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        environment.auto_requeue = False
        warnings.warn(REQUEUE_WARNING, RuntimeWarning, stacklevel=2)
        return True
    return False


def _loss_of(outputs: Any) -> Any:
    """The loss ``training_step`` returned (a tensor, or a mapping's ``"loss"``), detached from
    its graph, or None."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    detach = getattr(loss, "detach", None)
    return detach() if callable(detach) and getattr(loss, "ndim", None) == 0 else None
