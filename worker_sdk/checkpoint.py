"""Atomic, multi-rank checkpoints: save, find the newest complete one, load it.

Save (correct under ``kill -9`` of any rank at any instant):

1. every rank writes its part into ``.tmp-step-<step>-<attempt>/`` (rank 0 also writes the
   replicated ``shared.pt``), each file fsynced and renamed into place, the directory fsynced;
2. the ranks agree that every part is durable (a collective when torch.distributed is up);
3. rank 0 writes ``MANIFEST.json``, fsyncs it, renames the directory to ``step-<step>``,
   fsyncs the checkpoint directory and prunes old checkpoints.

Until the rename nothing is committed; the rename is atomic. Load takes the newest valid
checkpoint that every rank can read, checks that all ranks chose the same one, and skips
(reporting why) any that turns out to be unreadable.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DataParallel, DistributedDataParallel

from . import _rng, layout
from ._collectives import all_gather_ints, broadcast_ints
from .layout import MANIFEST, MARKER, SHARED, CheckpointInfo, committed_name, rank_file, temp_name

__all__ = ["Checkpointer", "LoadResult", "SaveResult", "Stateful", "unwrap"]

_PAYLOAD_FORMAT: Final = 1
_PART_WAIT_S: Final = 600.0  # without a process group: how long rank 0 waits for the parts
_READ_CHUNK: Final = 4 << 20


class Stateful(Protocol):
    """Anything checkpointable: modules, optimizers, LR schedulers, user objects."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


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


class _UnloadableError(Exception):
    """This checkpoint cannot be read: skip it and try an older one."""


class _RefusedError(Exception):
    """This checkpoint must not (or cannot usefully) be loaded, and no older one either."""


def unwrap(obj: Any) -> Any:
    """The module inside DDP/DataParallel wrappers and ``torch.compile``; others unchanged."""
    while True:
        if isinstance(obj, (DistributedDataParallel, DataParallel)):
            obj = obj.module
            continue
        inner = getattr(obj, "_orig_mod", None)
        if isinstance(obj, torch.nn.Module) and isinstance(inner, torch.nn.Module):
            obj = inner
            continue
        return obj


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

    # ------------------------------------------------------------------ save
    def save(self, step: int, objects: Sequence[Stateful], extra: Any) -> SaveResult:
        """Checkpoint finished step ``step``; rank 0 commits it once every part is durable."""
        began = time.monotonic()
        final = self.directory / committed_name(step)
        tmp = self.directory / temp_name(step, self.attempt_tag)
        error: Exception | None = None
        try:
            self._prepare_directory()
            tmp.mkdir(mode=0o755, exist_ok=True)
            if self.rank == 0:
                _write_durable(tmp / SHARED, _shared_payload(objects))
            part: dict[str, Any] = {
                "format": _PAYLOAD_FORMAT,
                "rank": self.rank,
                "rng": _rng.capture(),
                "extra": extra,
            }
            _write_durable(tmp / rank_file(self.rank), part)
            layout.fsync_dir(tmp)
        except Exception as e:
            error = e
        failed = self._agree_parts_written(step, error is None)
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"rank(s) {failed} could not write step {step}; it is not committed")
        committed, nbytes = False, 0
        if self.rank == 0:
            commit_error: Exception | None = None
            try:
                nbytes = self._commit(step, tmp, final).nbytes
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

    def _prepare_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.rank == 0:
            with contextlib.suppress(FileExistsError):
                os.close(
                    os.open(self.directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                )

    def _agree_parts_written(self, step: int, ok: bool) -> list[int]:
        """Wait until every rank's part of ``step`` is durable; return the ranks that failed."""
        if self._group_active():
            flags = all_gather_ints([1 if ok else 0])
            return [r for r, (flag,) in enumerate(flags) if not flag]
        if self.world_size > 1 and self.rank == 0 and ok:
            tmp = self.directory / temp_name(step, self.attempt_tag)
            deadline = time.monotonic() + _PART_WAIT_S
            while missing := [
                r for r in range(self.world_size) if not (tmp / rank_file(r)).exists()
            ]:
                if time.monotonic() > deadline:
                    return missing
                time.sleep(0.05)
        return []

    def _commit(self, step: int, tmp: Path, final: Path) -> CheckpointInfo:
        files: dict[str, int] = {}
        for name in [SHARED, *(rank_file(r) for r in range(self.world_size))]:
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
        valid, scan_skipped = layout.scan(self.directory)
        skipped = list(scan_skipped)
        for info in [*valid, None]:
            self._agree_on_choice(info)
            if info is None:
                return LoadResult(None, None, extra, tuple(skipped))
            if info.world_size != self.world_size:
                raise RuntimeError(
                    f"checkpoint {info.path} was written by {info.world_size} ranks, this job has "
                    f"{self.world_size}; resharding is not supported (run with the old world size, "
                    "or start from a fresh checkpoint_dir)"
                )
            status, reason = 0, ""
            states: list[Any] = []
            part: Mapping[str, Any] = {}
            try:
                states, part = self._read(info, objects)
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
            for obj, state in zip(objects, states, strict=True):
                unwrap(obj).load_state_dict(state)
            _rng.restore(part["rng"])
            return LoadResult(info.step, info.path, part["extra"], tuple(skipped))
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

    def _read(
        self, info: CheckpointInfo, objects: Sequence[Stateful]
    ) -> tuple[list[Any], Mapping[str, Any]]:
        shared = self._load_file(info, SHARED)
        part = self._load_file(info, rank_file(self.rank))
        entries = shared.get("objects") if isinstance(shared, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise _UnloadableError(f"{SHARED} does not hold the expected objects table")
        if not isinstance(part, dict) or part.get("rank") != self.rank or "extra" not in part:
            raise _UnloadableError(f"{rank_file(self.rank)} is not this rank's part")
        if not isinstance(part.get("rng"), dict):
            raise _UnloadableError(f"{rank_file(self.rank)} holds no RNG states")
        if len(entries) != len(objects):
            raise _RefusedError(
                f"{info.path} holds {len(entries)} objects, {len(objects)} were given to restore"
            )
        states = []
        for i, obj in enumerate(objects):
            entry = entries.get(str(i))
            if entry is None or "state" not in entry:
                raise _UnloadableError(f"{SHARED} has no state for object {i}")
            expected = type(unwrap(obj)).__qualname__
            if entry.get("class") != expected:
                raise _RefusedError(
                    f"{info.path}: object {i} was a {entry.get('class')}, now a {expected}; "
                    "pass the objects to restore in the order they were saved"
                )
            states.append(entry["state"])
        return states, part

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


def _shared_payload(objects: Sequence[Stateful]) -> dict[str, Any]:
    table = {
        str(i): {"class": type(unwrap(obj)).__qualname__, "state": unwrap(obj).state_dict()}
        for i, obj in enumerate(objects)
    }
    return {"format": _PAYLOAD_FORMAT, "objects": table}


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
    uid = os.geteuid()
    checks = [(str(d), os.stat(d)) for d in directories] + [(f.name, os.fstat(f.fileno()))]
    for label, st in checks:
        if st.st_uid != uid:
            return f"{label} is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if st.st_mode & 0o022:
            return f"{label} is writable by group or others"
    return None
