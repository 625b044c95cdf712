"""Loading a checkpoint: the newest one every rank can read, checked before anything changes.

Held by :class:`worker_sdk.checkpoint.checkpointer.Checkpointer`; see that module for the
layout and the save protocol. Load takes the newest valid checkpoint that every rank can read
(sizes checked by every rank, the CRCs of ``dcp/`` split between the ranks), checks that all ranks
chose the same one, and skips (reporting why) any that turns out to be unreadable; only then does
any object change.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worker_sdk.contract import layout
from worker_sdk.contract.layout import (
    DCP_DIR,
    SHARED,
    STATE_DCP,
    STATE_RANK,
    STATE_SHARED,
    CheckpointInfo,
    committed_name,
    rank_file,
)
from worker_sdk.contract.private_paths import directory_problem
from worker_sdk.contract.protocol import ENV_RESUME_BEFORE

from . import dcp as _dcp
from . import grads as _grads
from . import rng as _rng
from .collectives import all_gather_ints, group_active
from .loader_generators import LEDGER
from .parallel import Stateful, StatePlan, dcp_groups, unwrap
from .trust import entry_problem, first_bad_record, opened_file_problem

__all__ = ["LoadResult", "Restorer"]


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What :meth:`Checkpointer.load_latest` restored."""

    step: int | None  # last finished step of the loaded checkpoint; None on a fresh start
    path: Path | None
    extra: Any
    skipped: tuple[tuple[Path, str], ...]  # checkpoints passed over, with the reason
    saved_world_size: int | None = None  # ranks that wrote the loaded checkpoint
    resharded_from: int | None = None  # saved_world_size, when it is not this job's
    own_part: bool = True  # this rank got its own RNG states and extra (False: a new rank)
    notes: tuple[str, ...] = ()  # what resume() warns about (per-rank state on a new world size)
    source: str | None = None  # "memory" (a snapshot of the memory tier) | "storage"; None: fresh


class _UnloadableError(Exception):
    """This checkpoint cannot be read: skip it and try an older one."""


class _RefusedError(Exception):
    """This checkpoint must not (or cannot usefully) be loaded, and no older one either."""


@dataclass(slots=True)
class _Read:
    """What the local checks of a load produced; applied once every rank's checks passed."""

    where: tuple[str, ...]
    states: dict[int, Any]  # replicated objects' states, by object index
    part: Mapping[str, Any] | None  # None: a rank the checkpoint did not have
    notes: tuple[str, ...] = ()


class Restorer:
    """Loads the newest checkpoint in ``directory`` that every rank can read.

    Held by :class:`~worker_sdk.checkpoint.checkpointer.Checkpointer`, which hands it the rank's
    place and how objects are saved (``plan``), and reads :attr:`unloadable` when it saves.
    """

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        world_size: int,
        plan: Callable[[Sequence[Stateful]], StatePlan],
        identity: str | None = None,
    ) -> None:
        """``identity``: the directory's when ``rvsup start`` checked it (None: not known)."""
        self.directory = directory
        self.identity = identity
        self.rank = rank
        self.world_size = world_size
        self.plan = plan
        self.unloadable: set[Path] = set()  # committed but failed to load: replaced when saved

    # ------------------------------------------------------------------ load
    def load_latest(
        self,
        objects: Sequence[Stateful],
        extra: Any,
        *,
        steps: tuple[int, int] | None = None,
        source: str = "storage",
    ) -> LoadResult:
        """Restore the newest checkpoint every rank can read; fresh start if there is none.
        ``steps`` (lowest, highest): only checkpoints of those steps are candidates (the
        memory tier's snapshots newer than storage's and not newer than the one chosen)."""
        plan = self.plan(objects)
        valid, scan_skipped = layout.scan(self.directory)
        before = os.environ.get(ENV_RESUME_BEFORE)
        if before:  # rolled back: checkpoints from the anomaly's onset on may hold the damage
            valid = [info for info in valid if info.step < int(before)]
        if steps is not None:
            valid = [info for info in valid if steps[0] <= info.step <= steps[1]]
        skipped = list(scan_skipped)
        for info in [*valid, None]:
            self._agree_on_choice(info)
            if info is None:
                return LoadResult(None, None, extra, tuple(skipped))
            status, reason = 0, ""
            read: _Read | None = None
            try:
                read = self._read(info, plan, objects)
            except _UnloadableError as e:
                status, reason = 1, str(e)
            except _RefusedError as e:
                status, reason = 2, str(e)
            statuses = self._gather_statuses(status)
            if 2 in statuses:
                if status == 2:
                    raise RuntimeError(reason)
                others = [r for r, s in enumerate(statuses) if s == 2]
                raise RuntimeError(
                    f"rank(s) {others} refused to load {info.path} (see their error)"
                )
            if any(statuses):
                failed = [r for r, s in enumerate(statuses) if s]
                skipped.append((info.path, reason or f"unreadable on rank(s) {failed}"))
                self.unloadable.add(info.path)
                continue
            assert read is not None
            self._apply(info, plan, objects, read)
            own = read.part is not None
            return LoadResult(
                info.step,
                info.path,
                read.part["extra"] if read.part is not None else extra,
                tuple(skipped),
                saved_world_size=info.world_size,
                resharded_from=info.world_size if info.world_size != self.world_size else None,
                own_part=own,
                notes=read.notes,
                source=source,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _agree_on_choice(self, info: CheckpointInfo | None) -> None:
        if not self._group_active():
            return
        mine = -1 if info is None else info.step
        chosen = [step for (step,) in all_gather_ints([mine])]
        if any(step != mine for step in chosen):
            described = ", ".join(
                f"rank {r}: {'none' if s < 0 else committed_name(s)}" for r, s in enumerate(chosen)
            )
            raise RuntimeError(
                f"ranks chose different checkpoints in {self.directory} ({described}); "
                "checkpoint_dir must be one directory shared by all ranks"
            )

    def _gather_statuses(self, status: int) -> list[int]:
        if not self._group_active():
            return [status]
        return [s for (s,) in all_gather_ints([status])]

    def _read(self, info: CheckpointInfo, plan: StatePlan, objects: Sequence[Stateful]) -> _Read:
        """This rank's checks and reads of ``info``, before any rank changes any object."""
        unsafe = directory_problem(self.directory, self.identity) or entry_problem(info.path)
        if unsafe is not None:  # nothing is read from a place someone else could have written
            raise _RefusedError(f"{info.path} is not loaded: {unsafe}")
        shared = self._load_file(info, SHARED)
        entries = shared.get("objects") if isinstance(shared, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise _UnloadableError(f"{SHARED} does not hold the expected objects table")
        part = self._read_part(info) if self.rank < info.world_size else None
        if info.format == 1:
            where, classes = self._format1_objects(info, plan, entries)
        else:
            where, classes = tuple(w for _, w in info.objects), [c for c, _ in info.objects]
        if len(where) != len(objects):
            raise _RefusedError(
                f"{info.path} holds {len(where)} objects, {len(objects)} were given to restore"
            )
        states: dict[int, Any] = {}
        for i, obj in enumerate(objects):
            expected = plan.classes[i] if info.format >= 2 else type(unwrap(obj)).__qualname__
            if classes[i] != expected:
                raise _RefusedError(
                    f"{info.path}: object {i} was a {classes[i]}, now a {expected}; "
                    "pass the objects to restore in the order they were saved"
                )
            if where[i] == STATE_SHARED:
                entry = entries.get(str(i))
                if entry is None or "state" not in entry:
                    raise _UnloadableError(f"{SHARED} has no state for object {i}")
                if i in plan.sharded and not _is_empty_optimizer_state(entry["state"]):
                    raise _RefusedError(
                        f"{info.path}: object {i} ({classes[i]}) was saved replicated and is "
                        f"sharded now ({plan.kinds[i]}); rvsup does not convert a replicated "
                        "checkpoint to a sharded model"
                    )
                states[i] = entry["state"]
            elif where[i] == STATE_RANK:
                if part is not None:  # else a new rank: kept as constructed (a note below)
                    states[i] = self._own_state(part, i)
            elif plan.group_of(i) is None:
                raise _RefusedError(
                    f"{info.path}: object {i} ({classes[i]}) was saved with the sharded state "
                    "of a model, and no model given to resume() owns its parameters now"
                )
        if STATE_DCP in where:
            self._check_sharded(info)
        return _Read(tuple(where), states, part, self._per_rank_notes(info, where, classes, part))

    def _read_part(self, info: CheckpointInfo) -> Mapping[str, Any]:
        name = rank_file(self.rank)
        part = self._load_file(info, name)
        if not isinstance(part, dict) or part.get("rank") != self.rank or "extra" not in part:
            raise _UnloadableError(f"{name} is not this rank's part")
        if not isinstance(part.get("rng"), dict):
            raise _UnloadableError(f"{name} holds no RNG states")
        return part

    def _own_state(self, part: Mapping[str, Any], i: int) -> Any:
        held = part.get("objects")
        if not isinstance(held, dict) or str(i) not in held:
            raise _UnloadableError(f"{rank_file(self.rank)} has no state for object {i}")
        return held[str(i)]

    def _per_rank_notes(
        self,
        info: CheckpointInfo,
        where: Sequence[str],
        classes: Sequence[str],
        part: Mapping[str, Any] | None,
    ) -> tuple[str, ...]:
        """What happens to per-rank object state when the world size changed."""
        if info.world_size == self.world_size:
            return ()
        grads: tuple[str, ...] = ()
        if part is not None and _grads.held(part.get("grads")):
            grads = (
                (
                    f"rvsup: rank {self.rank} held gradients summed at the save (accumulated, "
                    f"or never zeroed) over the data split among {info.world_size} ranks; this "
                    f"job has {self.world_size}, so they are not restored: the resume is not exact"
                ),
            )
        mine = [f"object {i} ({classes[i]})" for i, w in enumerate(where) if w == STATE_RANK]
        if not mine:
            return grads
        saved = f"{', '.join(mine)} had per-rank state on {info.world_size} ranks"
        if part is None:
            note = (
                f"rvsup: {saved}; rank {self.rank} is new, so it keeps them as constructed "
                "(a data loader starts its epoch from the beginning of its shard)"
            )
        elif self.rank == 0 and self.world_size < info.world_size:
            note = (
                f"rvsup: {saved}; this job has {self.world_size}: each rank r < "
                f"{self.world_size} gets rank r's back, the state of ranks "
                f"{self.world_size}..{info.world_size - 1} is not used (a data loader's "
                "position in those ranks' shards is lost)"
            )
        else:
            return grads
        return (*grads, note)

    def _format1_objects(
        self,
        info: CheckpointInfo,
        plan: StatePlan,
        entries: Mapping[str, Any],
    ) -> tuple[tuple[str, ...], list[str]]:
        if plan.sharded:
            first = min(plan.sharded)
            raise _RefusedError(
                f"{info.path} was written by an earlier rvsup, which saved only rank 0's shards "
                f"of sharded state; object {first} ({plan.classes[first]}) is sharded "
                f"({plan.kinds[first]}), so it cannot be restored correctly from it. Start from "
                "a fresh checkpoint_dir"
            )
        classes = [str(entries.get(str(i), {}).get("class")) for i in range(len(entries))]
        return tuple(STATE_SHARED for _ in entries), classes

    def _check_sharded(self, info: CheckpointInfo) -> None:
        """DCP unpickles: only from trusted files; and this rank's share of the CRCs."""
        dcp_dir = info.path / DCP_DIR
        untrusted = entry_problem(dcp_dir) or _files_problem(
            [info.path / name for name, _ in info.checksums]
        )
        if untrusted is not None:
            raise _RefusedError(
                f"{dcp_dir} is not loaded: torch.distributed.checkpoint unpickles its files, "
                f"and {untrusted}"
            )
        try:
            _dcp.verify(info.path, info.checksums, self.rank, self.world_size)
        except ValueError as e:
            raise _UnloadableError(str(e)) from None

    def _apply(
        self, info: CheckpointInfo, plan: StatePlan, objects: Sequence[Stateful], read: _Read
    ) -> None:
        """Put the checked state into the objects (collective when some of it is sharded)."""
        groups = dcp_groups(plan, read.where)
        if groups:
            try:
                _dcp.load(groups, info.path / DCP_DIR)
            except Exception as e:
                raise RuntimeError(
                    f"cannot restore the sharded state of {info.path}: {type(e).__name__}: {e}"
                ) from e
        for i, state in read.states.items():
            unwrap(objects[i]).load_state_dict(state)
        if read.part is not None:
            _rng.restore(read.part["rng"])
            LEDGER.load(read.part.get("loaders", []))
            saved = read.part.get("grads")
            if isinstance(saved, dict) and info.world_size == self.world_size:
                _grads.restore(objects, saved)
        else:
            _rng.seed_all(_rng.derived_seed(info.step, self.rank))

    def _load_file(self, info: CheckpointInfo, name: str) -> Any:
        """torch.load one file of a checkpoint, weights-only unless the files are trusted."""
        try:
            f = open(info.path / name, "rb")  # noqa: SIM115
        except OSError as e:
            raise _UnloadableError(f"cannot open {name}: {e.strerror}") from None
        with f:
            untrusted = opened_file_problem(f)
            if untrusted is not None:
                raise _RefusedError(f"{info.path / name} is not loaded: {untrusted}")
            bad = first_bad_record(f)
            if bad is not None:
                raise _UnloadableError(f"{name}: {bad}")
            f.seek(0)
            try:
                return torch.load(f, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError:
                pass  # objects weights-only loading rejects (a script's own classes in extra):
                # unpickled below, the file being this user's, writable by nobody else (above)
            except Exception as e:
                raise _UnloadableError(f"{name}: {type(e).__name__}: {e}") from None
            f.seek(0)
            try:
                return torch.load(f, map_location="cpu", weights_only=False)
            except Exception as e:
                raise _UnloadableError(f"{name}: {type(e).__name__}: {e}") from None

    def _group_active(self) -> bool:
        return group_active(self.rank, self.world_size)


def _files_problem(paths: Sequence[Path]) -> str | None:
    """The first of ``paths`` that is not this user's regular file, writable by nobody else."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                problem = opened_file_problem(f)
        except OSError as e:
            return f"{path} cannot be checked: {e.strerror}"
        if problem is not None:
            return problem
    return None


def _is_empty_optimizer_state(state: Any) -> bool:
    return isinstance(state, dict) and state.get("state") == {} and "param_groups" in state
