"""The supervisor's view of the checkpoint directory.

A checkpoint of mode "external" is rvsup's marker of a framework's own checkpoint (bring your own
checkpoint: ``worker_sdk.checkpointed``): rank 0 reports it with CKPT_EXTERNAL, and it is tracked,
counted and pruned as any other; its manifest names the framework's checkpoint.

Two sources say that a checkpoint was committed: rank 0's CKPT_COMMITTED message (immediate, carries
the save's duration, works on a shared file system whose changes this node's inotify never sees),
and a watchdog observer of the directory (sees the atomic rename even when the rank dies before its
message leaves). Both feed :class:`CommitTracker`, which validates the directory the same way a
resuming rank will (``worker_sdk.contract.layout``) and reports each step once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from supervisor.record.schema import (
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointLoaded,
    CheckpointSkipped,
)
from worker_sdk.contract import layout
from worker_sdk.contract import messages as m
from worker_sdk.contract.private_paths import dir_identity, directory_problem

__all__ = [
    "CheckpointsSeen",
    "Commit",
    "CommitTracker",
    "DirectoryWatch",
    "commit_event",
    "loaded_event",
    "trouble_event",
]


@dataclass(frozen=True, slots=True)
class Commit:
    step: int
    path: Path
    nbytes: int
    seconds: float | None
    source: str  # "sdk" | "watchdog" | "found"
    world_size: int
    format: int
    mode: str | None = None  # "sync" | "async", from the manifest
    blocked_s: float | None = None
    external: str | None = None  # mode "external": the framework's checkpoint it marks


@dataclass(slots=True)
class CheckpointsSeen:
    """What one attempt saw of the checkpoints."""

    started_step: int | None  # the newest committed step when the attempt began
    last_commit_t: float  # monotonic: the attempt's start, then each commit (timed saves)
    failures: list[tuple[int, int, str]] = field(default_factory=list)  # (rank, step, reason)
    loaded_logged: bool = False  # checkpoint_loaded: once, from the first rank that reports

    def progressed(self, newest: int | None) -> bool:
        """Whether a checkpoint newer than the attempt's start was committed."""
        started = self.started_step
        return newest is not None and (started is None or newest > started)

    def trouble(
        self, rank: int, body: m.CheckpointFailed | m.CheckpointSkipped
    ) -> CheckpointFailed | CheckpointSkipped:
        """The history's line for a save that failed (kept for ``rvsup status``) or a
        checkpoint passed over at load."""
        if isinstance(body, m.CheckpointFailed):
            self.failures.append((rank, body.step, body.reason))
        return trouble_event(rank, body)

    def loaded(self, body: m.Loaded) -> CheckpointLoaded | None:
        """The history's line for what the ranks resumed from: every rank loads the one
        checkpoint they all agreed on, so the first report only (None for the others)."""
        if self.loaded_logged:
            return None
        self.loaded_logged = True
        return loaded_event(body)


def commit_event(commit: Commit) -> CheckpointCommitted:
    """The history's line for a commit."""
    return CheckpointCommitted(
        step=commit.step,
        path=str(commit.path),
        seconds=commit.seconds,
        bytes=commit.nbytes,
        source=commit.source,
        world_size=commit.world_size,
        format=commit.format,
        mode=commit.mode,
        blocked_s=commit.blocked_s,
        external=commit.external,
    )


def loaded_event(body: m.Loaded) -> CheckpointLoaded:
    """The history's line for a ``LOADED`` message: what the ranks resumed from."""
    return CheckpointLoaded(
        resume_step=body.step,
        checkpoint=body.path,
        world_size=body.world_size,
        source=body.source,
    )


def trouble_event(
    rank: int, body: m.CheckpointFailed | m.CheckpointSkipped
) -> CheckpointFailed | CheckpointSkipped:
    """The history's line for a ``CKPT_FAILED`` (a background save of ``rank`` that failed) or
    ``CKPT_SKIPPED`` (a damaged checkpoint passed over at load) message."""
    if isinstance(body, m.CheckpointFailed):
        return CheckpointFailed(step=body.step, rank=rank, reason=body.reason[:2000])
    return CheckpointSkipped(path=body.path, reason=body.reason, rank=rank)


class CommitTracker:
    """Deduplicates commits by step and remembers the newest one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.identity: str | None = None
        """The directory's identity when the daemon started (after ``rvsup start`` checked it):
        the ranks refuse to load from, or save into, a directory put in its place since."""
        with contextlib.suppress(OSError):
            self.identity = dir_identity(directory)
        valid, _ = layout.scan(directory)
        latest = valid[0] if valid else None
        self.newest_step: int | None = latest.step if latest else None
        self.newest_world_size: int | None = latest.world_size if latest else None
        """How many ranks wrote the newest checkpoint."""
        self._seen: set[int] = set()
        self.committed: set[int] = {info.step for info in valid}
        """Every step committed (or found at start) and not discarded, pruned ones included."""
        self.damaged: dict[int, float] = {}
        """Checkpoints the ranks passed over as damaged (a checksum this daemon does not read):
        step -> the manifest's ``created``. Not a rollback target, not the newest, until a new
        commit of the same step replaces it."""

    def unsafe(self) -> str | None:
        """Why the checkpoint directory may no longer be used (an ancestor others can write
        now, another directory put in its place since the start), or None."""
        return directory_problem(self.directory, self.identity)

    def _valid(self) -> list[layout.CheckpointInfo]:
        """The valid committed checkpoints on disk that no rank found damaged, newest first."""
        valid, _ = layout.scan(self.directory)
        return [info for info in valid if self.damaged.get(info.step) != info.created]

    def refresh(self) -> None:
        """Take the newest valid checkpoint on disk as the newest, also when its commit has not
        been heard yet (the watcher's event still queued, or the rank's message lost with the
        rank): it is the one the ranks will load. Its ``checkpoint_committed`` is still logged
        when the commit is heard (:meth:`observe`)."""
        valid = self._valid()
        if valid and (self.newest_step is None or valid[0].step > self.newest_step):
            self.newest_step = valid[0].step
            self.newest_world_size = valid[0].world_size
            self.committed.add(valid[0].step)

    def path_of(self, step: int) -> Path:
        """Where the committed checkpoint of ``step`` lives (``worker_sdk.contract.layout`` names it)."""
        return self.directory / layout.committed_name(step)

    def steps(self) -> list[int]:
        """The steps of the valid committed checkpoints, newest first (not those found damaged)."""
        return [info.step for info in self._valid()]

    def mark_damaged(self, path: Path) -> int | None:
        """A rank passed over the checkpoint at ``path`` as damaged (``CKPT_SKIPPED``): it is
        no rollback target and not the newest any more (the ranks will not load it either);
        its step, or None for a path that is not a committed checkpoint of this directory."""
        step = self.step_of(path)
        if step is None or not _same_dir(path.parent, self.directory):
            return None
        try:
            info = layout.validate(self.directory / path.name)
        except (layout.CorruptCheckpointError, OSError):
            info = None  # gone, or damaged in what this daemon reads too: scans skip it
        if info is not None:
            self.damaged[step] = info.created
        if self.newest_step == step:
            left = self._valid()
            self.newest_step = left[0].step if left else None
            self.newest_world_size = left[0].world_size if left else None
        return step

    def discard_from(self, step: int) -> tuple[int, ...]:
        """Discard the committed checkpoints of ``step`` or later (a rollback: they may hold
        the damage); the steps discarded. The newest known becomes the newest left."""
        gone, before = layout.discard_from(self.directory, step)
        self._seen.difference_update(gone)
        self.committed = {s for s in self.committed if s < step}
        for s in gone:
            self.damaged.pop(s, None)
        left = [i for i in before if self.damaged.get(i.step) != i.created]
        self.newest_step = left[0].step if left else None
        self.newest_world_size = left[0].world_size if left else None
        return gone

    @staticmethod
    def step_of(path: Path) -> int | None:
        """The step a committed checkpoint's name says, or None for another name."""
        m = layout.COMMITTED_RE.match(path.name)
        return int(m.group(1)) if m else None

    def observe(self, path: Path, *, seconds: float | None, source: str) -> Commit | None:
        """A commit to report, or None if already reported or not a valid checkpoint."""
        m = layout.COMMITTED_RE.match(path.name)
        if m is None or path.parent != self.directory:
            return None
        step = int(m.group(1))
        if step in self._seen and step not in self.damaged:
            return None
        try:
            info = layout.validate(path)
        except (layout.CorruptCheckpointError, OSError):
            return None
        if self.damaged.get(step) == info.created:
            return None  # the damaged one, heard again
        self.damaged.pop(step, None)  # a new commit of the step replaced it
        self._seen.add(step)
        self.committed.add(step)
        if self.newest_step is None or step > self.newest_step:
            self.newest_step = step
            self.newest_world_size = info.world_size
        return Commit(
            step,
            path,
            info.nbytes,
            seconds,
            source,
            info.world_size,
            info.format,
            mode=info.mode,
            blocked_s=info.blocked_s,
            external=info.external,
        )


def _same_dir(a: Path, b: Path) -> bool:
    """Whether two paths name the same directory (a rank may name it by another path)."""
    try:
        return a == b or a.resolve() == b.resolve()
    except OSError:
        return False


class _Handler(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Path]) -> None:
        self._loop = loop
        self._queue = queue

    def _offer(self, path: str | bytes) -> None:
        p = Path(path if isinstance(path, str) else path.decode())
        if layout.COMMITTED_RE.match(p.name):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, p)

    def on_moved(self, event: FileSystemEvent) -> None:
        self._offer(event.dest_path)

    def on_created(self, event: FileSystemEvent) -> None:
        self._offer(event.src_path)


class DirectoryWatch:
    """A watchdog observer of one directory (not recursive) feeding an asyncio queue."""

    def __init__(self, directory: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[Path] = asyncio.Queue()
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(_Handler(loop, self.queue), str(directory), recursive=False)
        self._observer.start()

    def close(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
