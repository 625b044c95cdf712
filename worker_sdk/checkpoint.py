"""Atomic, multi-rank checkpoints of any parallelism: save, find the newest complete one, load.

What goes where (``_parallel`` decides, from the objects given to ``resume()``):

- replicated state (plain modules, DDP, LR schedulers, user objects) is written once, by rank 0,
  with torch.save into ``shared.pt``;
- sharded state (FSDP1, FSDP2 and other DTensor modules, with the optimizers over their
  parameters) is written by every rank, each its own shards, through torch.distributed.checkpoint
  (``get_state_dict``/``set_state_dict``) into ``dcp/``;
- per-rank values (RNG states, ``extra``) go into each rank's own ``rank-<rank>.pt``: no key is
  ever saved by several ranks holding different values.

Save (correct under ``kill -9`` of any rank at any instant), in steps that an asynchronous save
can split between the training thread and a writer:

1. capture: references to the state (for sharded groups ``get_state_dict``, every rank);
2. stage: a copy the training loop can no longer change (today's saves are synchronous: the
   state cannot change while they run, and nothing is copied);
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
and RNGs seeded from (step, r) (:func:`worker_sdk._rng.derived_seed`); ranks >= M are dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import torch
import torch.distributed as dist

from . import _dcp, _parallel, _rng, layout
from ._collectives import all_gather_ints, broadcast_ints
from ._parallel import Stateful, StatePlan, unwrap
from .layout import (
    DCP_DIR,
    MANIFEST,
    MARKER,
    SHARED,
    STATE_DCP,
    STATE_SHARED,
    CheckpointInfo,
    committed_name,
    rank_file,
    temp_name,
)

__all__ = ["Checkpointer", "LoadResult", "SaveResult", "Stateful", "unwrap"]

_PAYLOAD_FORMAT: Final = 1  # of shared.pt and the rank files (their layout is unchanged)
_PART_WAIT_S: Final = 600.0  # without a process group: how long rank 0 waits for the parts
_READ_CHUNK: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class SaveResult:
    """What one :meth:`Checkpointer.save` did."""

    step: int
    path: Path  # the committed directory
    seconds: float  # the whole save, monotonic clock
    nbytes: int  # total bytes of the checkpoint
    committed: bool  # rank 0 only: the checkpoint of ``step`` is committed


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


class _UnloadableError(Exception):
    """This checkpoint cannot be read: skip it and try an older one."""


class _RefusedError(Exception):
    """This checkpoint must not (or cannot usefully) be loaded, and no older one either."""


@dataclass(slots=True)
class _Snapshot:
    """One rank's view of a checkpoint being written (see the module docstring's steps)."""

    plan: StatePlan
    where: tuple[str, ...]  # per object: STATE_SHARED or STATE_DCP
    shared: dict[str, Any] | None  # shared.pt's payload (rank 0), else None
    part: dict[str, Any]  # this rank's rank file
    sharded: dict[str, Any] | None  # the DCP state dict; None when nothing is sharded


@dataclass(slots=True)
class _Read:
    """What the local checks of a load produced; applied once every rank's checks passed."""

    where: tuple[str, ...]
    states: dict[int, Any]  # replicated objects' states, by object index
    part: Mapping[str, Any] | None  # None: a rank the checkpoint did not have


class Checkpointer:
    """Saves and loads this rank's view of a job's checkpoints in ``directory``."""

    def __init__(
        self, directory: Path, *, rank: int, world_size: int, attempt_tag: str, keep_last: int
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad rank {rank} for world_size {world_size}")
        temp_name(0, attempt_tag)  # rejects a tag that cannot be part of a name
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.attempt_tag = attempt_tag
        self.keep_last = keep_last
        self._unloadable: set[Path] = set()  # committed but failed to load: replace on re-save
        self._plans: tuple[tuple[int, ...], StatePlan] | None = None

    def plan(self, objects: Sequence[Stateful]) -> StatePlan:
        """How ``objects`` are saved (cached); raises TypeError/ValueError for what cannot be."""
        key = tuple(id(o) for o in objects)
        if self._plans is None or self._plans[0] != key:
            self._plans = (key, _parallel.plan(objects))
        return self._plans[1]

    # ------------------------------------------------------------------ save
    def save(self, step: int, objects: Sequence[Stateful], extra: Any) -> SaveResult:
        """Checkpoint finished step ``step``; rank 0 commits it once every part is durable."""
        began = time.monotonic()
        plan = self.plan(objects)
        final = self.directory / committed_name(step)
        tmp = self.directory / temp_name(step, self.attempt_tag)
        sharded = bool(plan.sharded)  # the same on every rank: the same script made the objects
        if sharded and self.world_size > 1 and not self._group_active():
            raise RuntimeError("sharded (FSDP/DTensor) state needs torch.distributed initialised")
        error: Exception | None = None
        snap: _Snapshot | None = None
        sums: list[int] = []
        try:
            snap = self._stage(self._capture(plan, objects, extra))
            self._prepare_directory()
            tmp.mkdir(mode=0o755, exist_ok=True)
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
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"rank(s) {failed} could not write step {step}; it is not committed")
        committed, nbytes = False, 0
        if self.rank == 0:
            assert snap is not None
            commit_error: Exception | None = None
            try:
                nbytes = self._commit(step, tmp, final, snap, tables).nbytes
                committed = True
            except Exception as e:
                commit_error = e
            self._share_commit_outcome(committed, nbytes)
            if commit_error is not None:
                raise commit_error
        else:
            ok, nbytes = self._share_commit_outcome(False, 0)
            if not ok:
                raise RuntimeError(f"rank 0 could not commit step {step} (see its error)")
        return SaveResult(step, final, time.monotonic() - began, nbytes, committed)

    def _capture(self, plan: StatePlan, objects: Sequence[Stateful], extra: Any) -> _Snapshot:
        """Step 1: references to everything a checkpoint holds, nothing written yet."""
        where = []
        for i, obj in enumerate(objects):
            # an optimizer that has not stepped yet has no state to shard: saved as it is
            # (DCP's get_state_dict would invent zero moments for it, in place)
            empty = isinstance(obj, torch.optim.Optimizer) and not obj.state
            where.append(STATE_DCP if i in plan.sharded and not empty else STATE_SHARED)
        shared = None
        if self.rank == 0:
            table = {
                str(i): {"class": plan.classes[i], "state": unwrap(obj).state_dict()}
                for i, obj in enumerate(objects)
                if where[i] == STATE_SHARED
            }
            shared = {"format": _PAYLOAD_FORMAT, "objects": table}
        part = {"format": _PAYLOAD_FORMAT, "rank": self.rank, "rng": _rng.capture(), "extra": extra}
        sharded_state = None
        if plan.sharded:
            sharded_state = _dcp.capture(_dcp_groups(plan, tuple(where)))
        return _Snapshot(plan, tuple(where), shared, part, sharded_state)

    def _stage(self, snap: _Snapshot) -> _Snapshot:
        """Step 2: the copy an asynchronous save hands to its writer. Saves are synchronous
        today (training waits until the commit), so the state cannot change and nothing is
        copied."""
        return snap

    def _write_local(self, snap: _Snapshot, tmp: Path) -> None:
        """Step 3, the files that are not DCP's: shared.pt (rank 0), this rank's part."""
        if snap.shared is not None:
            _write_durable(tmp / SHARED, snap.shared)
        _write_durable(tmp / rank_file(self.rank), snap.part)
        layout.fsync_dir(tmp)

    def _prepare_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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
        self, step: int, tmp: Path, final: Path, snap: _Snapshot, tables: Sequence[Sequence[int]]
    ) -> CheckpointInfo:
        names = [SHARED, *(rank_file(r) for r in range(self.world_size))]
        checksums: dict[str, int] = {}
        if snap.sharded is not None:
            for r, sums in enumerate(tables):
                checksums.update(_dcp.names(r, sums))
            names += sorted(checksums)
        files: dict[str, int] = {}
        for name in names:
            try:
                files[name] = os.stat(tmp / name).st_size
            except FileNotFoundError:
                raise RuntimeError(f"{tmp / name} is missing; step {step} not committed") from None
        created = time.time()
        manifest = {
            "format": layout.FORMAT,
            "step": step,
            "world_size": self.world_size,
            "created": created,
            "files": files,
            "checksums": checksums,
            "objects": [
                {"class": cls, "state": where}
                for cls, where in zip(snap.plan.classes, snap.where, strict=True)
            ],
        }
        _write_bytes_durable(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        layout.fsync_dir(tmp)
        if os.path.lexists(final):
            try:
                existing: CheckpointInfo | None = layout.validate(final)
            except layout.CorruptCheckpointError:
                existing = None
            if existing is not None and final not in self._unloadable:
                shutil.rmtree(tmp, ignore_errors=True)  # the same step is already committed
                return existing
            layout.discard(final)
            self._unloadable.discard(final)
        os.rename(tmp, final)
        layout.fsync_dir(self.directory)
        with contextlib.suppress(OSError):
            layout.prune(self.directory, self.keep_last, current_attempt_tag=self.attempt_tag)
        return CheckpointInfo(step, final, self.world_size, sum(files.values()), created)

    def _share_commit_outcome(self, committed: bool, nbytes: int) -> tuple[bool, int]:
        """Rank 0 tells the others whether the commit succeeded (and its size)."""
        if not self._group_active():
            return True, nbytes
        ok, total = broadcast_ints([int(committed), nbytes], src=0)
        return bool(ok), total

    # ------------------------------------------------------------------ load
    def load_latest(self, objects: Sequence[Stateful], extra: Any) -> LoadResult:
        """Restore the newest checkpoint every rank can read; fresh start if there is none."""
        plan = self.plan(objects)
        valid, scan_skipped = layout.scan(self.directory)
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
                self._unloadable.add(info.path)
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
        shared = self._load_file(info, SHARED)
        entries = shared.get("objects") if isinstance(shared, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise _UnloadableError(f"{SHARED} does not hold the expected objects table")
        part = None
        if self.rank < info.world_size:
            name = rank_file(self.rank)
            part = self._load_file(info, name)
            if not isinstance(part, dict) or part.get("rank") != self.rank or "extra" not in part:
                raise _UnloadableError(f"{name} is not this rank's part")
            if not isinstance(part.get("rng"), dict):
                raise _UnloadableError(f"{name} holds no RNG states")
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
            elif plan.group_of(i) is None:
                raise _RefusedError(
                    f"{info.path}: object {i} ({classes[i]}) was saved with the sharded state "
                    "of a model, and no model given to resume() owns its parameters now"
                )
        if STATE_DCP in where:
            self._check_sharded(info)
        return _Read(tuple(where), states, part)

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
        paths = [self.directory, info.path, dcp_dir, *(info.path / n for n, _ in info.checksums)]
        untrusted = _untrusted_paths(paths)
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
        groups = _dcp_groups(plan, read.where)
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
        else:
            _rng.seed_all(_rng.derived_seed(info.step, self.rank))

    def _load_file(self, info: CheckpointInfo, name: str) -> Any:
        """torch.load one file of a checkpoint, weights-only unless the files are trusted."""
        try:
            f = open(info.path / name, "rb")  # noqa: SIM115
        except OSError as e:
            raise _UnloadableError(f"cannot open {name}: {e.strerror}") from None
        with f:
            bad = _first_bad_record(f)
            if bad is not None:
                raise _UnloadableError(f"{name}: {bad}")
            f.seek(0)
            try:
                return torch.load(f, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as e:
                refused = _weights_only_reason(str(e))
            except Exception as e:
                raise _UnloadableError(f"{name}: {type(e).__name__}: {e}") from None
            untrusted = _untrusted_reason([self.directory, info.path], f)
            if untrusted is not None:
                raise _RefusedError(
                    f"{info.path / name} holds objects that weights-only loading rejects "
                    f"({refused}); it is not unpickled because {untrusted}"
                )
            f.seek(0)
            try:
                return torch.load(f, map_location="cpu", weights_only=False)
            except Exception as e:
                raise _UnloadableError(f"{name}: {type(e).__name__}: {e}") from None

    # ------------------------------------------------------------------ process group
    def _group_active(self) -> bool:
        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return False
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise RuntimeError(
                f"Checkpointer(rank={self.rank}, world_size={self.world_size}) does not match the "
                f"process group (rank {dist.get_rank()} of {dist.get_world_size()})"
            )
        return True


def _dcp_groups(plan: StatePlan, where: Sequence[str]) -> list[_parallel.Group]:
    """The groups whose module's state is in DCP, each with its optimizers that are too."""
    return [
        dataclasses.replace(
            g,
            optimizer_indices=tuple(i for i in g.optimizer_indices if where[i] == STATE_DCP),
            optimizers=tuple(
                o
                for i, o in zip(g.optimizer_indices, g.optimizers, strict=True)
                if where[i] == STATE_DCP
            ),
        )
        for g in plan.groups
        if where[g.module_index] == STATE_DCP
    ]


def _is_empty_optimizer_state(state: Any) -> bool:
    return isinstance(state, dict) and state.get("state") == {} and "param_groups" in state


def _write_durable(path: Path, payload: Any) -> None:
    """torch.save to ``path`` via a partial name: the final name appears complete and durable."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def _write_bytes_durable(path: Path, data: bytes) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _first_bad_record(f: IO[bytes]) -> str | None:
    """Check every zip record's CRC-32 (torch.load does not): the reason, or None if all good."""
    try:
        with zipfile.ZipFile(f) as archive:
            for record in archive.infolist():
                if record.CRC == 0 and record.file_size:
                    continue  # written with torch's CRC computation switched off
                with archive.open(record) as member:
                    while member.read(_READ_CHUNK):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        return f"damaged archive: {e}"
    return None


def _weights_only_reason(message: str) -> str:
    for line in message.splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return message.splitlines()[0] if message else "weights-only load failed"


def _untrusted_reason(directories: Sequence[Path], f: IO[bytes]) -> str | None:
    """Why unpickling these files would be unsafe (others own or can write them), or None."""
    checks = [(str(d), os.stat(d)) for d in directories] + [(f.name, os.fstat(f.fileno()))]
    return _first_untrusted(checks)


def _untrusted_paths(paths: Sequence[Path]) -> str | None:
    """Like :func:`_untrusted_reason`, for paths (directories and files) not opened yet."""
    try:
        checks = [(str(p), os.stat(p)) for p in paths]
    except OSError as e:
        return f"{e.filename} cannot be checked: {e.strerror}"
    return _first_untrusted(checks)


def _first_untrusted(checks: Sequence[tuple[str, os.stat_result]]) -> str | None:
    uid = os.geteuid()
    for label, st in checks:
        if st.st_uid != uid:
            return f"{label} is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if st.st_mode & 0o022:
            return f"{label} is writable by group or others"
    return None
