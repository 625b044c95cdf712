"""Where a job's memory snapshots live on the daemon's node: a private directory of its own.

The snapshots hold the job's weights and are loaded by its ranks, and they live in a place every
user of the node can write (``[checkpoint] memory_dir``, ``/dev/shm``). So the daemon makes the
directory itself, exclusively, mode 0700, under a name nobody can predict
(``rvsup-<uid>-<32 hex digits>``), and records that name in the job's private run directory
(``<run_dir>/memory-dir``). The ranks use only the directory the daemon names, and check it
again (:mod:`worker_sdk.checkpoint.memory.home`).

A later daemon of the same job (after one was killed) takes the recorded directory back, with
the snapshots in it, only when it is still this user's private directory; otherwise it is
refused (``memory_dir_refused`` names it and says why) and a fresh one is made.

While a daemon lives it holds a lock (``flock``) on the directory's ``.owner`` file, which says
which daemon made it. A daemon killed with SIGKILL cannot remove its directory, and tmpfs files
are host memory: every ``rvsup start`` of any job of the user removes the directories whose
owner's lock is free and whose owner ran on this node (``snapshots_swept``), as it ends the
processes dead daemons left. Directories without an ``.owner`` (the copies other nodes keep of a
job on several nodes, or those of an earlier rvsup) are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.record.schema import Event, MemoryDirRefused, SnapshotsSwept
from worker_sdk.contract.private_paths import (
    UntrustedPathError,
    make_private_dir,
    verify_private_dir,
)

__all__ = [
    "OWNER_FILE",
    "RECORD_FILE",
    "SnapshotHome",
    "UntrustedPathError",
    "claim",
    "recorded",
    "sweep",
]

RECORD_FILE: Final = "memory-dir"  # in the run directory: the snapshot directory's path
OWNER_FILE: Final = ".owner"  # in the snapshot directory: the daemon that made it, locked
_TOKEN_BYTES: Final = 16
_MAX_RECORD: Final = 4096
_REMOVING: Final = ".removing"  # the name a directory being swept has


def _name_re(uid: int) -> re.Pattern[str]:
    return re.compile(rf"^rvsup-{uid}-[0-9a-f]{{{2 * _TOKEN_BYTES}}}$")


@dataclass(slots=True)
class SnapshotHome:
    """The job's snapshot directory on this node, locked by this daemon while it lives."""

    path: Path
    lock_fd: int

    def close(self, *, remove: bool) -> None:
        """Give the directory up; with ``remove`` (the job has ended) it goes, and its record."""
        if remove:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.path)
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)


def claim(base: Path, run_dir: Path) -> tuple[SnapshotHome, list[Event]]:
    """This job's snapshot directory under ``base``: the recorded one when it is still this
    user's private directory (its snapshots kept), else a new one; and the events to log (the
    recorded one refused). Raises OSError when none can be made (``base`` full or gone)."""
    events: list[Event] = []
    recorded = _read_record(run_dir)
    if recorded is not None and os.path.lexists(recorded):
        try:
            return SnapshotHome(recorded, _take_back(recorded, run_dir)), events
        except UntrustedPathError as e:
            events.append(MemoryDirRefused(path=str(recorded), reason=str(e)))
    path = base / f"rvsup-{os.getuid()}-{secrets.token_hex(_TOKEN_BYTES)}"
    make_private_dir(path)
    try:
        fd = _own(path, run_dir)
        _write_record(run_dir, path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return SnapshotHome(path, fd), events


def sweep(base: Path, *, keep: Path | None) -> list[Event]:
    """Remove the snapshot directories of this user under ``base`` that daemons of this node
    left when they died (their ``.owner`` lock is free); ``keep`` is this daemon's own. The
    event naming them, if any was removed."""
    pattern = _name_re(os.getuid())
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    removed = []
    for name in names:
        path = base / name
        if name.startswith(".") and pattern.match(name[1:].removesuffix(_REMOVING)):
            with contextlib.suppress(UntrustedPathError):  # a sweep cut short: finish it
                verify_private_dir(path)
                shutil.rmtree(path, ignore_errors=True)
            continue
        if not pattern.match(name) or path == keep:
            continue
        try:
            verify_private_dir(path)  # never another user's, never through a link
        except UntrustedPathError:
            continue
        if _remove_if_abandoned(path):
            removed.append(str(path))
    return [SnapshotsSwept(paths=tuple(removed))] if removed else []


# ---------------------------------------------------------------------------- internals
def recorded(run_dir: Path) -> Path | None:
    """The snapshot directory the job's daemon recorded in ``run_dir`` (None: none)."""
    return _read_record(run_dir)


def _read_record(run_dir: Path) -> Path | None:
    try:
        with open(run_dir / RECORD_FILE, "rb") as f:
            text = f.read(_MAX_RECORD)
        path = json.loads(text)["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(path) if isinstance(path, str) and os.path.isabs(path) else None


def _write_record(run_dir: Path, path: Path) -> None:
    partial = run_dir / f"{RECORD_FILE}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"path": str(path)}, f)
    os.replace(partial, run_dir / RECORD_FILE)


def _own(path: Path, run_dir: Path) -> int:
    """Write the ``.owner`` file of the new directory ``path`` and hold its lock; the lock's
    descriptor. The file gets its name only once locked: a sweep that finds it finds it held."""
    partial = path / f"{OWNER_FILE}.partial"
    fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, _owner(run_dir))
        os.rename(partial, path / OWNER_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _owner(run_dir: Path) -> bytes:
    """What ``.owner`` says: the daemon that holds the directory, and its job."""
    return json.dumps(
        {"host": socket.gethostname(), "pid": os.getpid(), "run_dir": str(run_dir)}
    ).encode()


def _take_back(path: Path, run_dir: Path) -> int:
    """The recorded directory of this job, checked private and its owner's lock taken; raises
    :class:`UntrustedPathError` (with why) when it cannot be used."""
    verify_private_dir(path)
    try:
        fd = os.open(path / OWNER_FILE, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as e:
        raise UntrustedPathError(f"{path / OWNER_FILE} cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UntrustedPathError(f"{path / OWNER_FILE} is not this user's private file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _owner(run_dir), 0)
    except BlockingIOError:
        os.close(fd)
        raise UntrustedPathError(f"{path} is held by another process (a sweep)") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_if_abandoned(path: Path) -> bool:
    """Remove ``path`` when its owner's lock is free and the owner ran on this host."""
    try:
        fd = os.open(path / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # no owner here: another node's copy, or an earlier rvsup's
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its daemon lives
        try:
            owner = json.loads(os.read(fd, _MAX_RECORD))
        except (OSError, ValueError):
            return False
        if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
            return False  # made by a daemon elsewhere: its liveness cannot be seen from here
        aside = path.with_name(f".{path.name}{_REMOVING}")
        os.rename(path, aside)  # the name is gone at once; a claim that comes now makes anew
    except OSError:
        return False
    finally:
        os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)
    return True
