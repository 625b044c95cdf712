"""Hugging Face ``transformers.Trainer`` under rvsup: ``Trainer(..., callbacks=[RvsupCallback()])``.

The Trainer keeps its own checkpoints (``checkpoint-N``: weights, optimizer, scheduler, each
rank's RNG states, the data position through ``TrainerState``), and its resume is exact: it
skips the batches already seen (``skip_first_batches``) and restores the RNG states. rvsup
makes them atomic instead of writing checkpoints of its own:

- **when**: after every optimizer step the callback calls ``worker_sdk.step``; when rvsup wants
  a checkpoint (``[checkpoint]`` of job.toml, or a stop at a common step on preemption or the
  time limit) it sets ``control.should_save`` and the Trainer saves ``checkpoint-N``;
- **durable**: ``on_save`` fsyncs the folder and calls ``worker_sdk.checkpointed``: once every
  rank has, rvsup commits its marker of it (a stop leaves the process there, exit 75 for rvsup);
- **resume**: ``trainer.train()`` is given the newest ``checkpoint-N`` a marker names; newer
  folders no marker names (torn by a kill during the save) are removed first, never resumed.

Without rvsup (no ``RVSUP_*`` environment) the callback does nothing.
"""

from __future__ import annotations

import functools
import inspect
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import worker_sdk

from ._common import active, fsync_tree, resume_external

__all__ = ["RvsupCallback"]

_FOLDER = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


class RvsupCallback(TrainerCallback):
    """Supervision by rvsup for a ``transformers.Trainer``: add it, call ``trainer.train()``."""

    def __init__(self) -> None:
        self.enabled = active()
        self.resume_from: str | None = None
        """The ``checkpoint-N`` folder the next ``train()`` resumes from (None: a fresh start)."""

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """At the end of ``Trainer.__init__`` (the process group is up): find the newest
        checkpoint rvsup marked and make ``train()`` resume from it."""
        if not self.enabled:
            return
        trainer = _calling_trainer()
        if trainer is None:
            raise RuntimeError("RvsupCallback: on_init_end was not called by a Trainer")
        total = args.max_steps if args.max_steps > 0 else None
        # the Trainer restores its RNG states and data position; its model's parameters are
        # the resume check's fingerprint (the callback is given no loss)
        path = resume_external(total, trainer.model)
        self.resume_from = path
        original = trainer.train

        @functools.wraps(original)
        def train(resume_from_checkpoint: str | bool | None = None, **kw: Any) -> Any:
            if resume_from_checkpoint in (None, True) and self.resume_from is not None:
                resume_from_checkpoint = self.resume_from
            elif resume_from_checkpoint is True:  # nothing marked: a fresh start
                resume_from_checkpoint = None
            if trainer.args.process_index == 0:
                _remove_unmarked(Path(str(trainer.args.output_dir)), self.resume_from)
            return original(resume_from_checkpoint=resume_from_checkpoint, **kw)

        trainer.train = train  # type: ignore[method-assign,assignment]  # this Trainer's only

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """After every optimizer step: heartbeat; a checkpoint when rvsup wants one."""
        if self.enabled and worker_sdk.step(state.global_step - 1):
            control.should_save = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The Trainer saved ``checkpoint-N`` (N finished steps): make it durable, report it."""
        if not self.enabled:
            return
        folder = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            fsync_tree(folder)
        worker_sdk.checkpointed(state.global_step - 1, folder)


def _calling_trainer() -> Trainer | None:
    """The Trainer whose ``__init__`` runs the callback (the Trainer hands callbacks no
    reference to itself)."""
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _remove_unmarked(output_dir: Path, resume_from: str | None) -> None:
    """Remove the ``checkpoint-N`` folders newer than the one resumed from: no marker names
    them (a save a kill interrupted); the Trainer's rotation must never keep one over a good
    one, nor ``resume_from_checkpoint=True`` pick one."""
    newest = -1
    if resume_from is not None and (m := _FOLDER.match(Path(resume_from).name)):
        newest = int(m.group(1))
    if not output_dir.is_dir():
        return
    for entry in output_dir.iterdir():
        m = _FOLDER.match(entry.name)
        if m and int(m.group(1)) > newest and entry.is_dir():
            print(f"rvsup: removing {entry}: no checkpoint marker names it", file=sys.stderr)
            shutil.rmtree(entry, ignore_errors=True)
