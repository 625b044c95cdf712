"""The memory tier, the daemon's side: where a job's snapshots live on this node, which are
complete, which one the next attempt resumes from, and what the ranks say of them.

The daemon never reads a snapshot's data: it reads the manifests (``worker_sdk.contract.layout``,
the same validation the ranks apply before they load) to learn which snapshots are complete for
every rank, and names the chosen one to the ranks (``RVSUP_MEMORY_RESUME``); the ranks verify
its checksums as they load it.

Ownership: the snapshot directory is the job's, on this node's tmpfs
(``[checkpoint] memory_dir``, ``/dev/shm`` by default), a private directory the daemon made
(:mod:`.snapshot_home`). The ranks' writer processes write into it; tmpfs files outlive whoever
wrote them, so a rank's death (kill -9 included) does not take its snapshots away. The daemon
removes it when the job ends (succeeded, gave up, stopped). A daemon killed before that leaves
it; the next ``rvsup start`` of the job takes it back and uses the complete snapshots in it (the
rule below), and the start of any other job of the user removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from supervisor.config.model import JobConfig
from supervisor.record.schema import MemorySnapshots, MemoryTierOff
from supervisor.rules.resume_source import ResumeChoice, choose
from worker_sdk.contract import layout
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["MemoryTier", "SnapshotBook"]


class SnapshotBook:
    """What rank 0 said of one attempt's snapshots (its newest ``SNAPSHOTS`` message)."""

    def __init__(self) -> None:
        self.last: m.Snapshots | None = None
        self.off_reason: str | None = None

    def heard(self, body: m.Snapshots) -> MemoryTierOff | None:
        """Keep the newest summary; the event to log when the tier has just gone off or paused
        (once per outage: what the ranks say of it again, before a snapshot is taken, is no
        news)."""
        before = 0 if self.last is None else self.last.count or 0
        if body.count is not None and (self.last is None or before <= body.count):
            self.last = body
            if body.count > before:
                self.off_reason = None  # a snapshot since: the next failure is news
        if body.failed is not None and self.off_reason is None:
            self.off_reason = body.failed
            return MemoryTierOff(reason=body.failed[:2000])
        return None

    def summary(self) -> MemorySnapshots | None:
        """The attempt's summary event; None when no snapshot was reported."""
        last = self.last
        if last is None:
            return None
        return MemorySnapshots(
            count=last.count or 0,
            blocked_s=last.blocked_s,
            bytes=last.nbytes,
            interval=last.interval,
            newest_step=None if last.newest < 0 else last.newest,
        )


class MemoryTier:
    """The job's memory tier on this node: on or off, its directory, the resume choice."""

    def __init__(self, cfg: JobConfig, directory: Path | None) -> None:
        """``directory``: the job's private snapshot directory on this node (None: the tier
        is off, or no directory could be made)."""
        self.every = cfg.checkpoint.memory_every_steps  # None: "auto"; 0: off
        self.directory = directory if self.every != 0 else None
        self._nodes: set[str] | None = None  # the previous attempt's (several nodes)

    def usable(self) -> bool:
        """Whether the next attempt takes snapshots: configured, and a directory made."""
        return self.directory is not None

    def node_directory(self, nnodes: int) -> Path:
        """Where this node keeps the snapshots of an attempt on ``nnodes`` nodes: on several,
        every node its own complete copy, in a folder named for its host
        (``worker_sdk.checkpoint.memory.nodes``)."""
        assert self.directory is not None, "the memory tier is off"
        return self.directory if nnodes == 1 else layout.node_folder(self.directory)

    def complete_steps(self, nnodes: int = 1) -> list[int]:
        """The steps of the snapshots complete for every rank (their manifests check out)."""
        if self.directory is None:
            return []
        return [info.step for info in layout.scan(self.node_directory(nnodes))[0]]

    def choose(
        self,
        storage: int | None,
        *,
        nnodes: int,
        resume_before: int | None,
        joining: bool = False,
    ) -> ResumeChoice:
        """Where the next attempt resumes from (:func:`supervisor.rules.resume_source.choose`)."""
        on = self.usable()
        steps = self.complete_steps(nnodes) if on else []
        return choose(storage, steps, resume_before=resume_before, memory_on=on, joining=joining)

    def gather_here(self) -> tuple[int, ...]:
        """An attempt on one node after attempts on several (``launch.min_nnodes``): this
        node's copies move to where the ranks of one node look for snapshots (a rename on the
        same tmpfs); the steps moved. Where the one node is not this one, it has none."""
        if self.directory is None:
            return ()
        moved = []
        here = layout.node_folder(self.directory)
        for info in layout.scan(here)[0]:
            final = self.directory / info.path.name
            if os.path.lexists(final):
                continue
            with contextlib.suppress(OSError):
                os.rename(info.path, final)
                moved.append(info.step)
        return tuple(sorted(moved))

    def joining(self, nodes: tuple[str, ...]) -> bool:
        """Record the nodes of the attempt about to start: whether one of them ran none of the
        previous attempt (its copies, if any, are of another time: it gets the chosen one
        from a node that has it). False for the daemon's first attempt."""
        before, self._nodes = self._nodes, set(nodes)
        return before is not None and bool(self._nodes - before)

    def environment(self, choice: ResumeChoice) -> dict[str, str]:
        """The RVSUP_MEMORY_* variables of the next attempt (none when the tier is off)."""
        if self.directory is None:
            return {}
        env = {
            p.ENV_MEMORY_DIR: str(self.directory),
            p.ENV_MEMORY_EVERY: "auto" if self.every is None else str(self.every),
        }
        if choice.source in ("memory", "replica") and choice.step is not None:
            env[p.ENV_MEMORY_RESUME] = str(choice.step)
        return env

    def discard_from(self, step: int) -> tuple[int, ...]:
        """A rollback: the complete snapshots of ``step`` (the one after the checkpoint it
        restores) or later are discarded (they may hold the damage, or steps the rollback
        skips, and a later attempt would take the newest); the steps discarded."""
        if self.directory is None:
            return ()
        directory = self.directory
        folders = [directory]
        with contextlib.suppress(OSError):
            folders += [
                entry
                for entry in directory.iterdir()
                if entry.is_dir() and not layout.is_rvsup_entry(entry.name)  # a node's folder
            ]
        discarded: set[int] = set()
        for folder in folders:  # this node's copies (each node's are discarded by its ranks)
            discarded.update(layout.discard_from(folder, step)[0])
        return tuple(sorted(discarded))

    def path_of(self, step: int, nnodes: int = 1) -> Path:
        return self.node_directory(nnodes) / layout.committed_name(step)

    @staticmethod
    def world_size_of(path: Path) -> int | None:
        """The ranks a snapshot holds (its manifest's), None when it no longer checks out."""
        try:
            return layout.validate(path).world_size
        except layout.CorruptCheckpointError:
            return None

    def remove(self) -> None:
        """The job has ended: its snapshots go (best effort)."""
        if self.directory is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.directory)
