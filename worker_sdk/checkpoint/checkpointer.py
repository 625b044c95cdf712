"""Atomic, multi-rank checkpoints of any parallelism: save, find the newest complete one, load.

What goes where (:mod:`.parallel` decides, from the objects given to ``resume()``):

- replicated state (plain modules, DDP, LR schedulers, user objects) is written once, by rank 0,
  with torch.save into ``shared.pt``;
- sharded state (FSDP1, FSDP2 and other DTensor modules, with the optimizers over their
  parameters) is written by every rank, each its own shards, through torch.distributed.checkpoint
  (``get_state_dict``/``set_state_dict``) into ``dcp/``;
- per-rank values (RNG states, ``extra``, and objects whose state differs between ranks, found
  by comparing digests at every save: :mod:`worker_sdk.checkpoint.per_rank`) go into each rank's own
  ``rank-<rank>.pt``: no key is ever saved once for ranks holding different values.

Save (correct under ``kill -9`` of any rank at any instant), in steps that an asynchronous save
can split between the training thread and a writer:

1. capture: references to the state (for sharded groups ``get_state_dict``, every rank);
2. stage: a copy the training loop can no longer change. A synchronous save needs none (training
   waits until the commit); an asynchronous one (:meth:`Checkpointer.stage_async`) copies every
   tensor into shared memory and hands steps 3 and 4 to the rank's writer process
   (:mod:`worker_sdk.checkpoint.background.writer`), which agrees with the other ranks' writers
   through marker files instead of collectives;
3. write, into ``.tmp-step-<step>-<attempt>/``: rank 0 ``shared.pt``, every rank its rank file,
   each fsynced and renamed into place. When some state is sharded, the ranks agree that this
   much worked, then DCP writes ``dcp/`` (each rank its own files, fsynced), and each rank takes
   the CRC-32 of its files and fsyncs ``dcp/``. The temporary directory is fsynced;
4. commit: the ranks agree that every part is durable (one all-gather, which carries the CRCs
   too); rank 0 writes ``MANIFEST.json`` (every file with its size, the CRCs, the objects),
   fsyncs it, renames the directory to ``step-<step>``, fsyncs the checkpoint directory and
   prunes old checkpoints.

Until the rename nothing is committed; the rename is atomic. Load takes the newest valid
checkpoint that every rank can read (sizes checked by every rank, the CRCs of ``dcp/`` split
between the ranks), checks that all ranks chose the same one, and skips (reporting why) any
that turns out to be unreadable.

Another world size: a checkpoint of N ranks loads on M. Sharded state is resharded by DCP,
replicated state loads anywhere. Per-rank values follow one rule: rank r < N gets rank r's RNG
states and ``extra`` back; a rank r >= N (a new one) gets the ``extra`` given to ``resume()``
and RNGs seeded from (step, r) (:func:`worker_sdk.checkpoint.rng.derived_seed`), and keeps its objects with
per-rank state as constructed; ranks >= M are dropped. ``resume()`` warns about the last two.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from worker_sdk.contract import layout
from worker_sdk.contract.layout import (
    ARENA_DCP,
    ARENA_LOCAL,
    DCP_DIR,
    MARKER,
    SHARED,
    CheckpointInfo,
    committed_name,
    rank_file,
    temp_name,
)
from worker_sdk.contract.private_paths import (
    UntrustedPathError,
    directory_problem,
    make_private_dir,
)

from . import dcp as _dcp
from . import parallel as _parallel
from .background import arena as _arena
from .background.arena import Arena
from .background.writer import SaveJob, failed_marker, pending_marker, written_marker
from .capture import Capture, capture
from .collectives import all_gather_ints, broadcast_ints, group_active
from .commit import commit, write_durable
from .grads import GradWatch, fsdp1_note
from .parallel import Stateful, StatePlan, unwrap
from .restore import LoadResult, Restorer

__all__ = ["Checkpointer", "LoadResult", "SaveError", "SaveResult", "Stateful", "unwrap"]

_PART_WAIT_S: Final = 600.0  # without a process group: how long rank 0 waits for the parts


class SaveError(RuntimeError):
    """A save every rank agreed had failed on storage (a full disk, an I/O error): nothing of it
    is committed, the previous checkpoint stays valid, and every rank raises this at the same
    point, so training may go on. Any other error of a rank's own part is raised as it is."""


@dataclass(frozen=True, slots=True)
class SaveResult:
    """What one :meth:`Checkpointer.save` did."""

    step: int
    path: Path  # the committed directory
    seconds: float  # the whole save, monotonic clock
    nbytes: int  # total bytes of the checkpoint
    committed: bool  # rank 0 only: the checkpoint of ``step`` is committed


class Checkpointer:
    """Saves and loads this rank's view of a job's checkpoints in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        world_size: int,
        attempt_tag: str,
        keep_last: int,
        identity: str | None = None,
    ) -> None:
        """``identity``: the directory's when ``rvsup start`` checked it (None: not known); a
        directory put in its place since is refused at load and save."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad rank {rank} for world_size {world_size}")
        temp_name(0, attempt_tag)  # rejects a tag that cannot be part of a name
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.attempt_tag = attempt_tag
        self.keep_last = keep_last
        self.identity = identity
        self._plans: tuple[tuple[int, ...], StatePlan] | None = None
        self.gradients: GradWatch | None = None  # None: every gradient found is kept
        self._said_fsdp1 = False
        self._restorer = Restorer(
            self.directory, rank=rank, world_size=world_size, plan=self.plan, identity=identity
        )
        # committed but failed to load: replaced when saved again
        self._unloadable = self._restorer.unloadable

    def load_latest(self, objects: Sequence[Stateful], extra: Any) -> LoadResult:
        """Restore the newest checkpoint every rank can read; fresh start if there is none."""
        return self._restorer.load_latest(objects, extra)

    def _group_active(self) -> bool:
        return group_active(self.rank, self.world_size)

    def plan(self, objects: Sequence[Stateful]) -> StatePlan:
        """How ``objects`` are saved (cached); raises TypeError/ValueError for what cannot be."""
        key = tuple(id(o) for o in objects)
        if self._plans is None or self._plans[0] != key:
            self._plans = (key, _parallel.plan(objects))
        return self._plans[1]

    # ------------------------------------------------------------------ save
    def save(
        self, step: int, objects: Sequence[Stateful], extra: Any, *, external: str | None = None
    ) -> SaveResult:
        """Checkpoint finished step ``step``; rank 0 commits it once every part is durable.

        ``external``: the framework's own checkpoint of ``step`` that this one marks durable
        (bring your own checkpoint: mode "external", its path in the manifest)."""
        began = time.monotonic()
        plan = self.plan(objects)
        final = self.directory / committed_name(step)
        tmp = self.directory / temp_name(step, self.attempt_tag)
        sharded = bool(plan.sharded)  # the same on every rank: the same script made the objects
        if sharded and self.world_size > 1 and not self._group_active():
            raise RuntimeError("sharded (FSDP/DTensor) state needs torch.distributed initialised")
        error: Exception | None = None
        snap: Capture | None = None
        sums: list[int] = []
        try:
            snap = self._capture(plan, objects, extra, began)
            self._prepare_directory()
            make_private_dir(tmp)
            self._write_local(snap, tmp)
        except Exception as e:
            error = e
        if sharded:
            # DCP's writes are collectives: enter them only if every rank got this far
            failed = self._agree_ready(error is None)
            if not failed:
                try:
                    assert snap is not None
                    assert snap.sharded is not None
                    sums = _dcp.write(snap.sharded, tmp / DCP_DIR, self.rank)
                    layout.fsync_dir(tmp)
                except Exception as e:
                    error = e
            elif error is None:
                error = RuntimeError(
                    f"rank(s) {failed} could not write step {step}; it is not committed"
                )
        failed, tables = self._agree_parts_written(
            step, error is None, sums if sharded else [], 1 + _dcp.THREADS if sharded else 0
        )
        if isinstance(error, OSError):
            raise SaveError(f"step {step} is not committed: {error}") from error
        if error is not None:
            raise error
        if failed:
            raise SaveError(f"rank(s) {failed} could not write step {step}; it is not committed")
        committed, nbytes = False, 0
        if self.rank == 0:
            assert snap is not None
            commit_error: Exception | None = None
            try:
                nbytes = self._commit(step, tmp, snap, tables, external).nbytes
                committed = True
            except Exception as e:
                commit_error = e
            self._share_commit_outcome(committed, nbytes)
            if isinstance(commit_error, OSError):
                raise SaveError(f"step {step} is not committed: {commit_error}") from commit_error
            if commit_error is not None:
                raise commit_error
        else:
            ok, nbytes = self._share_commit_outcome(False, 0)
            if not ok:
                raise SaveError(f"rank 0 could not commit step {step}; it is not committed")
        return SaveResult(step, final, time.monotonic() - began, nbytes, committed)

    def stage_async(
        self,
        step: int,
        objects: Sequence[Stateful],
        extra: Any,
        arena_for: Callable[[str, int], Arena],
        wait_s: float,
    ) -> SaveJob:
        """Steps 1 and 2 of an asynchronous save: capture, and copy everything into the staging
        arenas (``arena_for(key, nbytes)``); collective when some state is sharded. The writer
        process does steps 3 and 4 from the returned job."""
        began = time.monotonic()
        plan = self.plan(objects)
        sharded = bool(plan.sharded)
        if sharded and self.world_size > 1 and not self._group_active():
            raise RuntimeError("sharded (FSDP/DTensor) state needs torch.distributed initialised")
        tmp = self.directory / temp_name(step, self.attempt_tag)
        error: Exception | None = None
        skeletons: tuple[Any, Any] = (None, None)
        snap: Capture | None = None
        try:
            snap = self._capture(plan, objects, extra, began)
            self._prepare_directory()
            make_private_dir(tmp)  # every rank's, whoever comes first
            for stale in (written_marker(tmp, self.rank), failed_marker(tmp, self.rank)):
                stale.unlink(missing_ok=True)  # from an earlier try of this step
            pending_marker(tmp, self.rank).touch(mode=0o600)
            payloads = (snap.shared, snap.part)
            arena = arena_for(ARENA_LOCAL, _arena.needed_bytes(list(_arena.tensors_in(payloads))))
            skeletons, _ = _arena.stage(payloads, arena)
        except Exception as e:
            error = e
        items, metadata = None, None
        if sharded:
            failed = self._agree_ready(error is None)  # DCP's planning is a collective
            if not failed:
                from .background import dcp_async as _dcp_async

                assert snap is not None
                assert snap.sharded is not None
                items, metadata = _dcp_async.stage(
                    snap.sharded, lambda n: arena_for(ARENA_DCP, n), self.rank
                )
            elif error is None:
                error = RuntimeError(f"rank(s) {failed} could not stage step {step}")
        if error is not None:
            raise error
        assert snap is not None
        final = self.directory / committed_name(step)
        self._unloadable.discard(final)
        return SaveJob(
            step=step,
            directory=self.directory,
            tmp=tmp,
            rank=self.rank,
            world_size=self.world_size,
            shared=skeletons[0],
            part=skeletons[1],
            dcp_items=items,
            dcp_metadata=metadata,
            objects=tuple(zip(plan.classes, snap.where, strict=True)),
            keep_last=self.keep_last,
            attempt_tag=self.attempt_tag,
            replace=final in self._unloadable,
            blocked_s=time.monotonic() - began,
            wait_s=wait_s,
        )

    def _capture(
        self, plan: StatePlan, objects: Sequence[Stateful], extra: Any, began: float
    ) -> Capture:
        """Step 1 (:func:`.capture.capture`); the digests compared through the process group."""
        gather = all_gather_ints if self._group_active() else None
        grads = self.gradients is None or self.gradients.wanted()
        snap = capture(
            plan,
            objects,
            extra,
            began,
            rank=self.rank,
            world_size=self.world_size,
            gather=gather,
            grads=grads,
        )
        if snap.grads_not_kept and not self._said_fsdp1 and self.rank == 0:
            self._said_fsdp1 = True
            print(fsdp1_note(snap.grads_not_kept), file=sys.stderr)
        return snap

    def _write_local(self, snap: Capture, tmp: Path) -> None:
        """Step 3, the files that are not DCP's: shared.pt (rank 0), this rank's part."""
        if snap.shared is not None:
            write_durable(tmp / SHARED, snap.shared)
        write_durable(tmp / rank_file(self.rank), snap.part)
        layout.fsync_dir(tmp)

    def _prepare_directory(self) -> None:
        """The directory exists and is safe (checked at every save: nothing is written into a
        directory another user could read or replace, docs/security.md); raises OSError."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        unsafe = directory_problem(self.directory, self.identity)
        if unsafe is not None:
            # a save that fails on storage, as on a full disk: training goes on
            raise UntrustedPathError(f"nothing is saved into {self.directory}: {unsafe}")
        if self.rank == 0:
            with contextlib.suppress(FileExistsError):
                os.close(
                    os.open(self.directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                )

    def _agree_ready(self, ok: bool) -> list[int]:
        """The ranks that failed before the sharded write (which every rank must enter)."""
        if not self._group_active():
            return [] if ok else [self.rank]
        return [r for r, (flag,) in enumerate(all_gather_ints([1 if ok else 0])) if not flag]

    def _agree_parts_written(
        self, step: int, ok: bool, sums: Sequence[int], width: int
    ) -> tuple[list[int], list[list[int]]]:
        """Wait until every rank's part of ``step`` is durable: the ranks that failed, and each
        rank's ``sums`` (``width`` numbers: the CRCs of its DCP files)."""
        mine = [*sums, *[-1] * (width - len(sums))] if ok else [-1] * width
        if self._group_active():
            gathered = all_gather_ints([1 if ok else 0, *mine])
            return [r for r, row in enumerate(gathered) if not row[0]], [
                row[1:] for row in gathered
            ]
        if self.world_size > 1 and self.rank == 0 and ok:
            tmp = self.directory / temp_name(step, self.attempt_tag)
            deadline = time.monotonic() + _PART_WAIT_S
            while missing := [
                r for r in range(self.world_size) if not (tmp / rank_file(r)).exists()
            ]:
                if time.monotonic() > deadline:
                    return missing, []
                time.sleep(0.05)
        return ([] if ok else [self.rank]), [mine]

    def _commit(
        self,
        step: int,
        tmp: Path,
        snap: Capture,
        tables: Sequence[Sequence[int]],
        external: str | None = None,
    ) -> CheckpointInfo:
        checksums: dict[str, int] = {}
        if snap.sharded is not None:
            for r, sums in enumerate(tables):
                checksums.update(_dcp.names(r, sums))
        final = self.directory / committed_name(step)
        info = commit(
            directory=self.directory,
            step=step,
            tmp=tmp,
            world_size=self.world_size,
            objects=tuple(zip(snap.plan.classes, snap.where, strict=True)),
            checksums=checksums,
            keep_last=self.keep_last,
            attempt_tag=self.attempt_tag,
            replace=final in self._unloadable,
            mode="sync" if external is None else "external",
            blocked_s=time.monotonic() - snap.began,
            external=external,
        )
        self._unloadable.discard(final)
        return info

    def _share_commit_outcome(self, committed: bool, nbytes: int) -> tuple[bool, int]:
        """Rank 0 tells the others whether the commit succeeded (and its size)."""
        if not self._group_active():
            return True, nbytes
        ok, total = broadcast_ints([int(committed), nbytes], src=0)
        return bool(ok), total
