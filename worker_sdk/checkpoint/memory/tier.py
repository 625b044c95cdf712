"""The memory tier, a rank's side: snapshots into host shared memory between storage checkpoints.

A snapshot is a checkpoint of the same objects, RNG states and ``extra`` as a storage one, in
the same layout and through the same code (:class:`~worker_sdk.checkpoint.checkpointer.Checkpointer`
and its background writer), written into this node's snapshot directory of the job (tmpfs,
``/dev/shm`` by default), keeping the newest two. ``step()`` is blocked only while the state is
captured and copied into the staging arena; the writer process writes, checksums and commits
it (manifest, atomic rename) in the background. A snapshot is complete only once it is
committed.

Every snapshot starts with one small all-gather of six numbers per rank (whether its previous
snapshot worked, whether its writer is still busy with it, how long that one blocked, the
training time per step since, the time snapshots have blocked it in this attempt, and the time
since the attempt's first step): the ranks take the same decisions from the same numbers, so
they snapshot at the same steps, put a snapshot off by one step together while some writer is
busy (never waiting for it), pause together when any of them ran out of room (a full tmpfs, a
memory limit: tried again after 30 s of training, then 60 s, ... at most 10 min), and stop
together when any of them cannot go on (its directory refused, its writer lost).
``"auto"`` takes a snapshot only when the attempt's blocked time stays within its
budget, and otherwise puts it off by the steps that will make it so
(:func:`.interval.steps_to_wait`). Between snapshots nothing runs: the runtime's per-step
comparison of the step with the next step that needs its slow path covers them.

The snapshot directory is the one the supervisor made and named (``RVSUP_MEMORY_DIR``), used
only while it is this user's private directory; on the other nodes of a job the ranks make it,
exclusively (:mod:`worker_sdk.contract.private_paths`). One that fails the check turns the tier
off for the attempt, saying why.
"""

from __future__ import annotations

import errno
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker_sdk.checkpoint.background.async_save import (
    AsyncSaver,
    Outcome,
    release_forked_writer,
)
from worker_sdk.checkpoint.background.writer import mark_failed
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.collectives import all_gather_ints, group_active
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p
from worker_sdk.contract.layout import ARENA_LOCAL, temp_name
from worker_sdk.spawn.local_world import every_rank_here, ranks_here

from . import home as _home
from . import interval as _interval
from . import nodes as _nodes
from . import room as _room

if TYPE_CHECKING:
    from worker_sdk.runtime.channel import Channel

__all__ = ["KEEP", "MemoryTier", "from_environment", "on_one_node"]

KEEP: Final = 2  # snapshots kept per node (the newest complete ones)
_NEVER: Final = sys.maxsize
_REPORT_EVERY_S: Final = 1.0
_US: Final = 1_000_000
_RETRY_S: Final = 30.0  # after a tier ran out of room: training time before it tries again,
_RETRY_MAX_S: Final = 600.0  # doubled after each failed try, at most this
_OUT_OF_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM})
# a rank's word in each snapshot's all-gather
_OFF, _OK, _NO_ROOM = 0, 1, 2


class MemoryTier:
    """This rank's snapshots: when the next is due, taking it, and the summary rank 0 reports."""

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        world_size: int,
        attempt_tag: str,
        every: int | None,
        channel: Channel | None,
        nodes: _nodes.Nodes | None = None,
        refused: str | None = None,
    ) -> None:
        """``refused``: why the directory must not be used (the tier is off from the first
        snapshot on, and no writer runs)."""
        self.checkpointer = Checkpointer(
            directory, rank=rank, world_size=world_size, attempt_tag=attempt_tag, keep_last=KEEP
        )
        self.saver = AsyncSaver(self.checkpointer)
        self.saver.before_growth = self._check_room
        self.rank = rank
        self.world_size = world_size
        self.every = every  # None: "auto"
        self.interval = every or 1
        self.channel = channel
        self.next_step = _NEVER
        self.count = 0
        self.blocked_s = 0.0  # all snapshots' so far
        self.last_blocked_s = 0.0  # the newest one's
        self.nbytes = 0
        self.newest = -1
        self.failed: str | None = refused  # why this rank's last snapshot failed (or why off)
        self.no_room = False  # that failure was a full tmpfs or a memory limit: try again later
        self.retries = 0  # pauses in a row for lack of room
        self.off = False
        self._mark = (time.monotonic(), -1)  # (end of the last snapshot, its step)
        self._began = self._mark[0]  # the attempt's first step
        self._reported = -_REPORT_EVERY_S
        self._pending_s = 0.0  # tries since the last snapshot that found a writer busy
        self._check_s = 0.0  # how long the last check that put the snapshot off blocked
        self.nodes = nodes  # several nodes: every snapshot committed on each (.nodes)
        if refused is not None:
            if nodes is not None:
                nodes.failed = nodes.failed or refused  # no endpoint to wait for
            release_forked_writer()
            return
        self._start_writer()
        if nodes is not None:
            self.failed = self.failed or nodes.failed
            if self.failed is None:
                try:
                    self.saver.listen(directory, nodes.key, nodes.address)
                except OSError as e:
                    self.failed = f"cannot receive the other nodes' parts: {e}"

    def connect(self) -> None:
        """Several nodes: learn where the other nodes' writers receive (collective, once; the
        restore calls it, else the first snapshot)."""
        nodes = self.nodes
        if nodes is None or nodes.connected:
            return
        failed = _nodes.connect(nodes, self.saver)
        if failed is not None:
            self.failed = self.failed or failed
            return
        self.saver.job_fields = {
            "peers": nodes.peers(),
            "replica_key": nodes.key,
            "leader": nodes.leader(nodes.node),
        }

    def _start_writer(self) -> None:
        """The writer forked beside this rank by the zygote, else one started at once (its
        start-up, importing torch, overlaps the restore)."""
        if self.saver.adopt_forked():
            return
        try:
            self.saver.start()
        except OSError as e:
            self.failed = f"cannot start the snapshot writer: {e}"

    def start(self, last_finished: int) -> None:
        """The first snapshot is of the attempt's first step."""
        self._mark = (time.monotonic(), last_finished)
        self._began = self._mark[0]
        self.next_step = last_finished + 1

    def snapshot(self, step: int, objects: Sequence[Stateful], extra: Any) -> None:
        """Take the snapshot of finished step ``step`` (every rank at the same step)."""
        self.connect()
        began = time.monotonic()
        if self.saver.in_flight is not None:
            self._heard(self.saver.poll())
        busy = self.saver.in_flight is not None
        steps = step - self._mark[1]
        step_s = (began - self._mark[0] - self._pending_s) / steps if steps > 0 else 0.0
        mine = [
            (_NO_ROOM if self.no_room else _OFF) if self.failed else _OK,
            int(busy),
            int(self.last_blocked_s * _US),
            int(step_s * _US),
            int((self.blocked_s + self._pending_s) * _US),
            int((began - self._began) * _US),
            int(self._check_s * _US),
        ]
        rows = all_gather_ints(mine) if self._group_active() else [mine]
        bad = [r for r, row in enumerate(rows) if row[0] == _OFF]
        if bad:
            self._turn_off(bad)
            return
        if any(row[1] for row in rows):  # a writer is still at the previous one: next step
            self.next_step = step + 1
            self._pending_s += time.monotonic() - began
            return
        if any(row[0] == _NO_ROOM for row in rows):
            first = next(r for r, row in enumerate(rows) if row[0] == _NO_ROOM)
            self._pause(step, max(row[3] for row in rows) / _US, says=first == self.rank)
            return
        wait = 1
        if self.every is None:
            cost = max(row[2] for row in rows) / _US  # the next one's, estimated
            blocked = max(row[4] for row in rows) / _US
            elapsed = min(row[5] for row in rows) / _US
            step_s = max(row[3] for row in rows) / _US
            later = _interval.steps_to_wait(blocked, elapsed, cost, step_s)
            if later:  # within budget only that many steps from now, the next check's own
                # cost (its all-gather, as long as the last one's) included: one check, not a
                # chase of ever closer ones, each pushing the target further
                check = max(row[6] for row in rows) / _US
                later = _interval.steps_to_wait(blocked + check, elapsed, cost, step_s)
                self.next_step = step + later
                self._check_s = time.monotonic() - began
                self._pending_s += self._check_s
                return
            # when the one after this may come, if it costs what this one is estimated to
            wait = max(1, _interval.steps_to_wait(blocked + cost, elapsed + cost, cost, step_s))
            self.interval = step - self._mark[1]
        try:
            previous = self.saver.submit(step, objects, extra)
        except _room.NoRoomError as e:  # the room check's sentence says it all
            self._failed_at(step, str(e), no_room=True)
        except Exception as e:  # noqa: BLE001 - a full /dev/shm: paused at the next snapshot
            no_room = isinstance(e, OSError) and e.errno in _OUT_OF_ROOM
            self._failed_at(step, f"{type(e).__name__}: {e}", no_room=no_room)
        else:
            self._heard(previous)
        end = time.monotonic()
        self.last_blocked_s = end - began + self._pending_s  # the tries it waited included
        self.blocked_s += self.last_blocked_s
        self._pending_s = 0.0
        self._mark = (end, step)
        self.next_step = step + (self.every or wait)
        if end - self._reported >= _REPORT_EVERY_S:
            self._report(end)

    def heartbeat(self, now: float) -> None:
        """Rank 0, at a heartbeat: hear how the snapshot in flight ended and, when it did,
        send the summary now (else the count and newest step wait for the next snapshot,
        which "auto" may put off for many steps, and the summary of an attempt that is
        killed meanwhile misses them). One poll of the writer's socket, no more."""
        if self.rank != 0 or self.off or self.saver.in_flight is None:
            return
        count = self.count
        self._heard(self.saver.poll())
        if self.count != count:
            self._report(now)

    def close(self) -> None:
        """At the rank's end: the summary is sent and the writer stops; a snapshot still being
        written is abandoned (nothing resumes from it now)."""
        if self.saver.in_flight is not None:
            self._heard(self.saver.poll())
        if self.saver.in_flight is not None:
            self.saver.abandon()
        else:
            self.saver.close()
        self._report(time.monotonic())
        self.next_step = _NEVER

    # ------------------------------------------------------------------ internals
    def _heard(self, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        if outcome.failed is not None:
            self.failed = outcome.failed
            self.no_room = outcome.errno in _OUT_OF_ROOM
        elif outcome.committed or self.rank != 0:  # the committing rank counts its commits
            self.retries = 0  # a snapshot went through: a next lack of room waits 30 s again
            self.count += 1
            self.newest = outcome.step
            self.nbytes = outcome.nbytes or self.nbytes

    def _failed_at(self, step: int, why: str, *, no_room: bool) -> None:
        """This rank could not stage the snapshot of ``step``: paused (``no_room``) or off at
        the next snapshot."""
        self.failed = why
        self.no_room = no_room
        tmp = self.checkpointer.directory / temp_name(step, self.checkpointer.attempt_tag)
        mark_failed(tmp, self.rank, why)  # rank 0's writer stops waiting for us

    def _check_room(self, key: str, growth: int, sizes: dict[str, int]) -> None:
        """Before a staging arena is allocated or grown: raise :class:`.room.NoRoomError` when what
        the snapshots need on this node does not fit (:mod:`.room`). Rank 0's local arena holds
        the replicated state, saved once (the arena ``ARENA_LOCAL``); the others' parts, and every
        rank's DCP shards, are taken as large as this rank's."""
        here = ranks_here(os.environ, self.world_size)
        directory = self.checkpointer.directory
        once = sizes.get(ARENA_LOCAL, 0) if self.rank == 0 else 0
        needed = _room.need(
            arena_growth=growth,
            once=once,
            per_rank=sum(sizes.values()) - once,
            once_growing=self.rank == 0 and key == ARENA_LOCAL,
            ranks_here=here,
            nodes=max(1, self.world_size // here),
            held=_room.bytes_in(directory),
        )
        why = _room.shortfall(needed, _room.measure(directory), directory)
        if why is not None:
            raise _room.NoRoomError(why)

    def _turn_off(self, ranks: list[int]) -> None:
        """Storage only for the rest of the attempt (every rank decides it at the same step)."""
        self.off = True
        self.next_step = _NEVER
        why = self.failed or f"rank(s) {ranks} could not take their snapshot"
        print(
            f"rvsup: rank {self.rank}: memory snapshots are off for this attempt, storage "
            f"checkpoints go on: {why}",
            file=sys.stderr,
        )
        self.saver.abandon()
        self._report(time.monotonic())

    def _pause(self, step: int, step_s: float, *, says: bool) -> None:
        """Some rank ran out of room: every rank waits the same number of steps (from the same
        gathered numbers) before it tries again, the failed snapshots' files removed so that
        they hold no room meanwhile (no writer is busy: every rank said so). ``says``: this
        is the first rank that ran out, which says why."""
        self.retries += 1
        wait_s = min(_RETRY_MAX_S, _RETRY_S * 2 ** (self.retries - 1))
        later = math.ceil(wait_s / step_s) if step_s > 0 else _interval.CEILING
        self.next_step = step + max(1, min(_interval.CEILING, later))
        if says and self.failed is not None:
            why = f"{self.failed}; snapshots pause and are tried again later in this attempt"
            self._report(time.monotonic(), failed=why)
        directory = self.checkpointer.directory
        committing = self.rank == 0 if self.nodes is None else self.nodes.is_leader(self.rank)
        if committing:
            _home.remove_attempt_temps(directory, self.checkpointer.attempt_tag)
        self.failed, self.no_room = None, False
        self._mark = (time.monotonic(), step)

    def _report(self, now: float, failed: str | None = None) -> None:
        """Send the summary (rank 0) and why the tier is off or paused (``failed``; by
        default the reason it went off, once off)."""
        self._reported = now
        failed = failed if failed is not None else self.failed if self.off else None
        if self.channel is None or (self.rank != 0 and failed is None):
            return  # rank 0 sums up; a rank that failed says why (the daemon logs the first)
        self.channel.send(
            m.Snapshots(
                self.newest,
                self.blocked_s,
                self.count,
                self.nbytes,
                self.interval if self.count > 1 else None,  # one snapshot has no interval
                failed,  # None: it goes on (or off for another rank's failure)
            )
        )

    def _group_active(self) -> bool:
        return group_active(self.rank, self.world_size)


def from_environment(*, rank: int, world_size: int, attempt_tag: str) -> MemoryTier | None:
    """The memory tier the supervisor asked for (``RVSUP_MEMORY_DIR``, which a script run
    without rvsup may set too), or None. Its directory is checked (one node: the supervisor
    made it) or made (several nodes: this node's folder), private either way; a tier whose
    directory fails is off, saying why."""
    directory = os.environ.get(p.ENV_MEMORY_DIR)
    if not directory:
        return None
    raw = os.environ.get(p.ENV_MEMORY_EVERY, "auto")
    every = None if raw == "auto" else int(raw)
    if every is not None and every <= 0:
        return None
    nodes = None
    if not on_one_node(world_size):
        nodes = _nodes.from_environment(os.environ)
    folder, refused = _home.private_folder(Path(directory), several_nodes=nodes is not None)
    return MemoryTier(
        folder,
        rank=rank,
        world_size=world_size,
        attempt_tag=attempt_tag,
        every=every,
        channel=None,
        nodes=nodes,
        refused=refused,
    )


def on_one_node(world_size: int) -> bool:
    """Whether every rank runs on this node (torchrun's LOCAL_WORLD_SIZE); otherwise every
    node keeps a copy of every snapshot (:mod:`.nodes`)."""
    return every_rank_here(os.environ, world_size)
