"""The writer process of asynchronous saves: one per rank, started by the rank, dies with it.

``python -m worker_sdk.checkpoint.background.writer FD PARENT_PID``: ``FD`` is this end of a
socket pair with the rank (:mod:`worker_sdk.checkpoint.background.async_save`). The rank sends
the staging arenas (their file descriptors) and, per save, a :class:`SaveJob`: the skeletons of
the files to write, whose tensors live in the arenas. The writer writes this rank's files into
the step's temporary directory, each fsynced, and then:

- rank r > 0 writes ``.written-<r>`` (where its DCP items are, the CRC of its file), durably:
  JSON with a MAC under the job's secret, never a pickle (:mod:`.markers`);
- rank 0 waits for every other rank's ``.written-<r>`` (or its ``.failed-<r>``), writes DCP's
  ``.metadata`` and commits (:func:`worker_sdk.checkpoint.commit.commit`).

A snapshot of a job on several nodes (``SaveJob.peers``) is committed on every node: each rank
also pushes its files and its marker to the writers of the same local rank on the other nodes
(:mod:`worker_sdk.checkpoint.memory.replica`), and the writer of each node's first rank
(``SaveJob.leader``) commits that node's copy as rank 0's does, DCP's metadata taken from rank
0's marker.

It answers each job with ``("done", step, committed, nbytes, monotonic_end)`` or ``("failed",
step, reason, errno)`` (``errno`` 0 when the failure was no ``OSError``). Any failure writes
``.failed-<rank>`` into the temporary directory so rank 0
stops waiting; the temporary directory is never committed then. The process asks the kernel to
kill it when the rank dies (``PR_SET_PDEATHSIG``): a save of a dead rank is abandoned, never
half-committed (the rename is the commit, and happens only once every part is durable).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker_sdk.checkpoint import dcp as _dcp
from worker_sdk.checkpoint.commit import commit, write_bytes_durable, write_durable
from worker_sdk.contract import layout
from worker_sdk.contract.layout import ARENA_DCP, ARENA_LOCAL, DCP_DIR, SHARED, rank_file
from worker_sdk.contract.private_paths import file_problem, make_private_dir
from worker_sdk.spawn.pdeathsig import die_with_parent

from . import markers
from .arena import Arena, rebuild

if TYPE_CHECKING:  # the rank imports this module for SaveJob: keep DCP out until it is needed
    from worker_sdk.checkpoint.memory.replica import Receiver

    from .dcp_async import Item

__all__ = [
    "SaveJob",
    "failed_marker",
    "main",
    "mark_failed",
    "pending_marker",
    "written_marker",
]

_POLL_S: Final = 0.02


@dataclass(frozen=True, slots=True)
class SaveJob:
    """One asynchronous save of one rank, as handed to its writer."""

    step: int
    directory: Path
    tmp: Path
    rank: int
    world_size: int
    shared: Any  # shared.pt's skeleton (rank 0), else None
    part: Any  # this rank's rank file's skeleton
    dcp_items: list[Item] | None  # None: no sharded state
    # rank 0, with sharded state: DCP's global metadata (.dcp_json.encode_metadata's form)
    dcp_metadata: dict[str, Any] | None
    objects: tuple[tuple[str, str], ...]
    keep_last: int
    attempt_tag: str
    replace: bool  # an existing checkpoint of this step was unloadable: replace it
    blocked_s: float  # how long the training loop was blocked by this save
    wait_s: float  # rank 0: how long to wait for the other ranks' parts
    # several nodes (the memory tier, .memory.replica): the writers this rank's part is also
    # pushed to (the same local rank on every other node), the key of those pushes, and the
    # rank whose writer commits this node's copy (the node's first)
    peers: tuple[str, ...] = ()
    replica_key: bytes = b""
    leader: int = 0
    marker_key: bytes = b""  # the job's secret: the markers' MAC (b"": run without rvsup)


def written_marker(tmp: Path, rank: int) -> Path:
    """Rank ``rank``'s part is durable (holds where its DCP items are)."""
    return tmp / f".written-{rank}"


def pending_marker(tmp: Path, rank: int) -> Path:
    """Created empty when the save is staged: failing needs only a rename, even on a full disk."""
    return tmp / f".pending-{rank}"


def failed_marker(tmp: Path, rank: int) -> Path:
    """Rank ``rank``'s part failed (holds the reason, when there was room to write it)."""
    return tmp / f".failed-{rank}"


def mark_failed(tmp: Path, rank: int, reason: str) -> None:
    """Tell rank 0's writer that this rank's part failed (best effort)."""
    with contextlib.suppress(OSError):
        os.rename(pending_marker(tmp, rank), failed_marker(tmp, rank))
    with contextlib.suppress(OSError):
        failed_marker(tmp, rank).write_text(reason)


Reached = Callable[[str, int], None]
"""Told each milestone of a save with its step: ``written`` (this rank's files are durable) and,
on rank 0, ``rename`` (the commit's rename is next)."""


def _no_one(milestone: str, step: int) -> None:
    """Nobody is told of milestones (the writer rvsup runs)."""


def run_job(job: SaveJob, arenas: dict[str, Arena], reached: Reached = _no_one) -> tuple[Any, ...]:
    """Write (and, on rank 0, commit) one save; the answer for the rank."""
    try:
        nbytes = _write_and_commit(job, arenas, reached)
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        reason = f"{type(e).__name__}: {e}"
        mark_failed(job.tmp, job.rank, reason)
        return ("failed", job.step, reason, (e.errno or 0) if isinstance(e, OSError) else 0)
    return ("done", job.step, job.rank == 0, nbytes, time.monotonic())


def _write_and_commit(job: SaveJob, arenas: dict[str, Arena], reached: Reached) -> int:
    local = arenas.get(ARENA_LOCAL)
    if job.shared is not None:
        assert local is not None
        write_durable(job.tmp / SHARED, rebuild(job.shared, local))
    write_durable(job.tmp / rank_file(job.rank), rebuild(job.part, local) if local else job.part)
    where: list[Any] = []
    crc = -1
    if job.dcp_items is not None:
        from . import dcp_async as _dcp_async

        where, crc = _dcp_async.write_items(
            job.dcp_items, arenas[ARENA_DCP], job.tmp / DCP_DIR, job.rank
        )
    layout.fsync_dir(job.tmp)
    reached("written", job.step)
    if job.peers:
        part = markers.Part(where, crc, job.dcp_metadata)
        _replicate(job, crc, markers.write(job.marker_key, job.tmp.name, job.rank, part))
    if job.rank != job.leader:
        # into the pending marker, then renamed: rank 0 never sees a part written half
        marker = markers.write(
            job.marker_key, job.tmp.name, job.rank, markers.Part(where, crc, None)
        )
        write_bytes_durable(pending_marker(job.tmp, job.rank), marker)
        # once the marker has its name the committing writer may rename the directory (the
        # commit) at any moment: the directory is opened before, and the marker's name made
        # durable through that descriptor wherever the directory has gone by then
        fd = os.open(job.tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.rename(pending_marker(job.tmp, job.rank), written_marker(job.tmp, job.rank))
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0
    parts = {job.rank: markers.Part(where, crc, job.dcp_metadata), **_wait_for_parts(job)}
    checksums: dict[str, int] = {}
    if job.dcp_items is not None:
        from . import dcp_async as _dcp_async

        metadata = parts[0].metadata  # rank 0's, received with its marker on the other nodes
        if metadata is None:
            raise RuntimeError("rank 0's part came without DCP's metadata")
        everywhere = [entry for r in sorted(parts) for entry in parts[r].where]
        md_crc = _dcp_async.finish_metadata(metadata, everywhere, job.tmp / DCP_DIR)
        for r in sorted(parts):
            checksums.update(_dcp.names(r, [md_crc if r == 0 else -1, parts[r].crc]))
    for r in range(job.world_size):
        if r != job.rank:
            written_marker(job.tmp, r).unlink()
    pending_marker(job.tmp, job.rank).unlink()
    info = commit(
        directory=job.directory,
        step=job.step,
        tmp=job.tmp,
        world_size=job.world_size,
        objects=job.objects,
        checksums=checksums,
        keep_last=job.keep_last,
        attempt_tag=job.attempt_tag,
        replace=job.replace,
        mode="async",
        blocked_s=job.blocked_s,
        before_rename=lambda: reached("rename", job.step),
    )
    return info.nbytes


def _wait_for_parts(job: SaveJob) -> dict[int, markers.Part]:
    """The committing rank: every other rank's ``.written-<r>``; raise if one failed or never
    came, or holds anything but that rank's marker of this save."""
    deadline = time.monotonic() + job.wait_s
    others = [r for r in range(job.world_size) if r != job.rank]
    parts: dict[int, markers.Part] = {}
    while len(parts) < len(others):
        for r in others:
            if r in parts:
                continue
            failed = failed_marker(job.tmp, r)
            if failed.exists():
                reason = failed.read_text(errors="replace") or "see its report"
                raise RuntimeError(f"rank {r} could not write its part ({reason})")
            marker = written_marker(job.tmp, r)
            if marker.exists():
                parts[r] = markers.read(job.marker_key, job.tmp.name, r, _read_marker(marker))
        if len(parts) < len(others):
            if time.monotonic() > deadline:
                missing = sorted(set(others) - set(parts))
                raise RuntimeError(f"rank(s) {missing} did not write their part in time")
            time.sleep(_POLL_S)
    return parts


def _read_marker(path: Path) -> bytes:
    """A marker's bytes, from this user's regular file (never through a link), at most
    :data:`markers.MAX_BYTES`."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        problem = file_problem(os.fstat(f.fileno()), os.geteuid())
        if problem is not None:
            raise RuntimeError(f"{path} {problem}")
        return f.read(markers.MAX_BYTES + 1)


def _replicate(job: SaveJob, crc: int, marker: bytes) -> None:
    """Push this rank's files (its DCP file's CRC ``crc``, -1: none), then its marker, to every
    peer's node (raises when one fails)."""
    from worker_sdk.checkpoint.memory.replica import push

    names = [SHARED] if job.shared is not None else []
    names.append(rank_file(job.rank))
    names += [name for name, _ in _dcp.names(job.rank, [-1, crc])]
    files: list[tuple[str, Path | bytes]] = [(name, job.tmp / name) for name in names]
    files.append((written_marker(job.tmp, job.rank).name, marker))
    for peer in job.peers:
        push(
            peer,
            job.replica_key,
            job.tmp.name,
            files,
            attempt=job.attempt_tag,
            timeout_s=job.wait_s,
        )


def serve(conn: Connection, reached: Reached = _no_one) -> None:
    """Answer the rank's jobs until it says quit or goes away."""
    arenas: dict[str, Arena] = {}
    receiver: Receiver | None = None
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message[0] == "arena":
                _, key, size = message
                fd = recv_handle(conn)
                old = arenas.pop(key, None)
                if old is not None:
                    old.close()
                arenas[key] = Arena(fd, size)
            elif message[0] == "save":
                conn.send(run_job(message[1], arenas, reached))
            elif message[0] == "listen" and receiver is None:  # several nodes (memory.replica)
                receiver, answer = _listen(*message[1:])
                conn.send(answer)
            elif message[0] == "quit":
                return
    finally:
        if receiver is not None:
            receiver.close()


def _listen(
    directory: Path, key: bytes, address: str, attempt: str
) -> tuple[Receiver | None, tuple[str, str]]:
    """Start receiving the other nodes' parts of attempt ``attempt`` into ``directory``: the
    receiver and ``("listening", endpoint)``, or None and ``("failed", reason)``."""
    from worker_sdk.checkpoint.memory.replica import Receiver

    try:
        make_private_dir(directory)  # this node's folder, made by the rank already
        receiver = Receiver(directory, key, address, attempt)
    except Exception as e:  # noqa: BLE001 - the rank turns the tier off
        return None, ("failed", f"{type(e).__name__}: {e}")
    return receiver, ("listening", receiver.endpoint)


def main(argv: list[str], reached: Reached = _no_one) -> int:
    """``FD PARENT_PID``: serve the rank at the other end of ``FD`` while it lives."""
    fd, parent = int(argv[0]), int(argv[1])
    die_with_parent(parent=parent)  # a save of a dead rank is abandoned
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    conn = Connection(fd)
    try:
        serve(conn, reached)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
