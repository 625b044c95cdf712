"""One rank's runtime: the state behind ``resume()`` and ``step()``.

The per-step path (inlined in ``worker_sdk.step``) reads the monotonic clock (vDSO, no syscall),
updates a few slots and compares two numbers (and, with a loss, keeps it: the resume check's
:mod:`.step_prints`); everything else happens in :meth:`Runtime.slow_path` when a heartbeat, a
save or a coordinated stop is due. Coordinated saves (a stop, or a time-based save the
supervisor schedules) happen at one step on every rank: the handshake is in :mod:`.coordinated`.
"""

from __future__ import annotations

import math
import mmap
import sys
import time
import warnings
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.checkpoint.restore import LoadResult
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

from . import save_reports
from .channel import Channel
from .coordinated import await_answer
from .loader_rng import WATCH, LoaderWindow
from .rank_files import arm_stack_dumps, disarm_stack_dumps, map_step_slot
from .settings import Settings
from .startup import announce, first_step, training_checks
from .step_prints import StepPrints, loss_value

if TYPE_CHECKING:
    from worker_sdk.checkpoint.background.async_save import AsyncSaver
    from worker_sdk.checkpoint.memory.tier import MemoryTier

    from .patches import Patch
    from .replicas import ReplicaCheck
    from .stragglers import WaitReader

_NEVER = sys.maxsize
FINAL_SAVE_PHASE = "final checkpoint"  # the phase a rank is in while it waits at exit for its save


class Runtime:
    """State of one rank. Created by ``worker_sdk.resume()``."""

    __slots__ = (
        "_dump_file",
        "_slot_map",
        "channel",
        "checkpointer",
        "comm_wait",
        "excepthook",
        "external",
        "hb_due",
        "hb_step",
        "last_step",
        "loss",
        "loss_reported",
        "max_dt",
        "memory",
        "next_due",
        "next_save_step",
        "objects",
        "periodic_next",
        "prints",
        "rank",
        "replicas",
        "requested",
        "save_due_t",
        "saver",
        "settings",
        "step_slot",
        "stop_after_save",
        "sync_mode",
        "sync_save_at",
        "t_last",
        "total_steps",
        "verify_next",
        "window",
        "world_size",
    )

    def __init__(
        self,
        settings: Settings,
        objects: Sequence[Stateful],
        checkpointer: Checkpointer | None,
        channel: Channel | None,
        *,
        rank: int,
        world_size: int,
    ) -> None:
        self.settings = settings
        self.objects = objects
        self.checkpointer = checkpointer
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.external = False  # resume(external=True): step() asks the script to save
        self.requested = -1  # the step step() last asked the script to checkpoint
        self.total_steps: int | None = None  # resume(total_steps=): for ``rvsup status``
        self.window: LoaderWindow | None = None  # until the first step() after a resume
        self.saver: AsyncSaver | None = None
        self.memory: MemoryTier | None = None  # snapshots in host memory (checkpoint/memory)
        if checkpointer is not None and settings.async_save:
            from worker_sdk.checkpoint.background.async_save import AsyncSaver

            self.saver = AsyncSaver(checkpointer)
        now = time.monotonic()
        self.t_last = now
        self.max_dt = 0.0
        self.last_step = -1
        self.loss: Any = None  # the last loss step() was given (a float or a tensor)
        self.hb_step = -1  # the step of the last heartbeat
        self.loss_reported = False  # a loss that is not finite was reported (once)
        self.sync_mode = False
        self.stop_after_save = False
        self.periodic_next = _NEVER
        self.sync_save_at = _NEVER
        self.next_save_step = _NEVER  # the next step that needs the slow path: save or verify
        self.replicas: ReplicaCheck | None = None  # plain DDP compared (.replicas)
        self.verify_next = _NEVER
        self.comm_wait: WaitReader | None = None  # the wait for the others, for stragglers
        self.prints = StepPrints((), None)  # the resume check's fingerprints (from start())
        self.excepthook: Patch | None = None  # ours, from resume() to the shutdown (exit_hooks)
        # the first finished step is reported at once: until then only the startup timeout
        # can catch a hang
        self.hb_due = now if channel else math.inf
        every_s = settings.every_s if world_size == 1 and checkpointer else None
        self.save_due_t = now + every_s if every_s else math.inf
        self.next_due = min(self.hb_due, self.save_due_t)
        self._dump_file: IO[str] | None = None
        self._slot_map: mmap.mmap | None = None  # held: step_slot is a view of it
        # the last finished step, stored by every step() (see protocol.step_slot_file)
        self.step_slot: memoryview = memoryview(bytearray(8)).cast("q")

    # ------------------------------------------------------------------ start-up
    def start(self, loaded: LoadResult) -> int:
        """Announce the rank, report what was loaded; return the first step to run."""
        start = first_step(loaded, supervised=self.channel is not None)
        self.last_step = start - 1
        self.hb_step = start - 1  # what a failure before the first step() names
        if self.settings.diagnostics_dir is not None:
            self._slot_map, self.step_slot = map_step_slot(self.settings.diagnostics_dir, self.rank)
        self.step_slot[0] = start - 1
        if self.channel is not None:
            checks = training_checks(self.objects, self.world_size, start, self.channel, self.rank)
            self.replicas, self.comm_wait, self.prints = checks
            if self.replicas is not None:
                self.verify_next = self.replicas.next_step
        self._set_periodic(start - 1)
        if self.channel is not None:
            announce(self.channel, self.settings, loaded, start, self.world_size, self.total_steps)
        self._dump_file = arm_stack_dumps(self.settings, self.rank)
        if self.saver is not None:
            self.saver.start()
        if self.memory is not None:
            self.memory.start(start - 1)
            self.next_save_step = self._next_slow_step()
        self.t_last = time.monotonic()
        if self.window is not None:
            self.next_due = 0.0  # the first step() closes the window
        return start

    def _set_periodic(self, last_finished: int) -> None:
        n = self.settings.every_steps
        if n <= 0 or self.checkpointer is None:
            self.periodic_next = _NEVER
        else:
            # save after step s when (s + 1) % n == 0: the checkpoint resumes at a multiple of n
            self.periodic_next = ((last_finished + 1) // n + 1) * n - 1
        self.next_save_step = self._next_slow_step()

    def _next_slow_step(self) -> int:
        """The next step whose step() takes the slow path: a save, a check or a snapshot."""
        snapshot = _NEVER if self.memory is None else self.memory.next_step
        checks = min(self.verify_next, self.prints.params_at)
        return min(self.periodic_next, self.sync_save_at, checks, snapshot)

    # ------------------------------------------------------------------ the slow path
    def slow_path(self, step: int, extra: Any, now: float) -> bool:
        """Heartbeat, coordinated-save handshake and saves; called only when one is due.

        True when the script is asked to checkpoint ``step`` itself (external mode)."""
        if self.window is not None:  # the first step() after a resume
            advice = self.window.close()
            self.window = None
            if advice is not None:
                warnings.warn(advice, RuntimeWarning, stacklevel=3)
        saver = self.saver
        if saver is not None and saver.in_flight is not None:
            outcome = saver.poll()
            if outcome is not None:
                save_reports.outcome(self.channel, self.rank, outcome)
        if now >= self.hb_due:
            self._heartbeat(step, now)
            if self.memory is not None:
                self.memory.heartbeat(now)
        if self.sync_mode:
            self._sync_round(step)
        if step >= self.verify_next:
            self._verify(step)
        if step >= self.prints.params_at:
            self.prints.take_params(step)
            self.next_save_step = self._next_slow_step()
        if step >= min(self.periodic_next, self.sync_save_at) or now >= self.save_due_t:
            self._save(step, extra)
        if self.memory is not None and step >= self.memory.next_step:
            self.memory.snapshot(step, self.objects, extra)
            self.prints.arm(step + 1)
            self.next_save_step = self._next_slow_step()
            self.t_last = time.monotonic()  # the snapshot is not a training step
        in_flight = saver is not None and saver.in_flight is not None
        self.next_due = 0.0 if self.sync_mode or in_flight else min(self.hb_due, self.save_due_t)
        return self.requested == step

    def end_loader_window(self) -> None:
        """Put DataLoader.__iter__ back now, without the window's advice: at shutdown when no
        step() came, and where a framework's own checkpoint restores its RNG states and data
        position (the Hugging Face Trainer: the window would put the marker's states back)."""
        if self.window is not None:
            self.window.close()
            self.window = None

    def _heartbeat(self, step: int, now: float) -> None:
        ch = self.channel
        assert ch is not None
        finite: float | None = None
        loss = self.loss
        if loss is not None:
            self.loss = None
            value = loss_value(loss)  # a tensor is read here
            if value is not None and math.isfinite(value):
                finite = value
            elif value is not None and loss.__class__ is not float:  # a float: step() said
                self.loss_not_finite(step, value, self.hb_step + 1)
        wait = None if self.comm_wait is None else self.comm_wait.read(step - self.hb_step)
        ch.send(m.Heartbeat(step, self.max_dt, finite, wait))
        self.prints.flush()
        self.hb_step = step
        self.max_dt = 0.0
        self.hb_due = now + self.settings.heartbeat_interval_s
        while (body := ch.receive()) is not None:
            if isinstance(body, m.SyncRequest):
                self.sync_mode = True

    def _verify(self, step: int) -> None:
        """Compare the replicas (a collective); rank 0 reports those that differ, if any."""
        assert self.replicas is not None
        report = self.replicas.run(step)
        if report is not None and self.rank == 0 and self.channel is not None:
            self.channel.send(report)
        self.verify_next = self.replicas.next_step
        self.next_save_step = self._next_slow_step()

    def loss_not_finite(self, step: int, value: float, since: int) -> None:
        """Report a loss that is not finite at once (the first only: the attempt ends)."""
        if self.channel is None or self.loss_reported:
            return
        self.loss_reported = True
        self.channel.send(m.LossNonFinite(step, value, since))

    def _sync_round(self, step: int) -> None:
        assert self.channel is not None
        match await_answer(self.channel, self.rank, step):
            case m.SyncCancel():
                self.sync_mode = False
            case m.SaveAt(at, stop):
                if at < step:
                    raise RuntimeError(f"rvsup: asked to save at step {at}, already at {step}")
                self.sync_mode = False
                self.stop_after_save = self.stop_after_save or stop
                if self.checkpointer is None:  # nothing to save: stop now or go on
                    self._leave_if_stopping(step)
                    return
                self.sync_save_at = at
                self.next_save_step = self._next_slow_step()

    def _save(self, step: int, extra: Any) -> None:
        if self.external:
            self._ask(step)
            return
        ck = self.checkpointer
        if ck is not None:
            if self.channel is not None:
                self.channel.send(m.CheckpointBegin(step))
            stopping = self.stop_after_save and step >= self.sync_save_at
            if self.saver is not None and not stopping:
                previous = self.saver.submit(step, self.objects, extra)
                if previous is not None:
                    save_reports.outcome(self.channel, self.rank, previous)
            else:
                self._finish_async(close=False)  # a stop's save waits for the one in flight
                save_reports.save_sync(
                    ck, self.channel, self.rank, step, self.objects, extra, stopping=stopping
                )
        coordinated = step >= self.sync_save_at
        if coordinated:
            self.sync_save_at = _NEVER
        self._next_saves(step)
        self.t_last = time.monotonic()  # the save is not a training step
        if coordinated:
            self._leave_if_stopping(step)

    # ------------------------------------------------------------------ external checkpoints
    def _ask(self, step: int) -> None:
        """External mode: a save is due at ``step``; the script makes it (step() returns True)."""
        if self.sync_save_at < step:  # the script did not checkpoint the coordinated step
            self.sync_save_at = _NEVER
            self._leave_if_stopping(step)  # a stop leaves on the previous checkpoint
        if self.channel is not None:
            self.channel.send(m.CheckpointBegin(step))  # its save is not taken for a hang
        self.requested = step
        self._next_saves(step)  # a coordinated step not checkpointed is caught at the next

    def _next_saves(self, step: int) -> None:
        """After a save of ``step`` (made or asked for): the next ones; the steps after it armed."""
        if self.save_due_t != math.inf and self.settings.every_s:
            self.save_due_t = time.monotonic() + self.settings.every_s
        self.prints.arm(step + 1)
        self._set_periodic(step)

    def checkpointed(self, step: int, path: str) -> None:
        """Every rank calls it once its own part of the framework's checkpoint of ``step`` is
        durable: rvsup commits its marker (RNG states and ``path``), rank 0 reports it, and a
        stop asked at ``step`` leaves here."""
        ck = self.checkpointer
        self.t_last = time.monotonic()  # the save is not a training step
        if ck is None:
            return
        save_reports.save_external(ck, self.channel, self.rank, step, path)
        self.t_last = time.monotonic()
        if step >= self.sync_save_at:
            self.sync_save_at = _NEVER
            self._set_periodic(step)
            self._leave_if_stopping(step)

    def _finish_async(self, *, close: bool) -> None:
        """Wait for the asynchronous save in flight and report it; ``close``: stop the writer."""
        saver = self.saver
        if saver is None:
            return
        outcome = saver.wait()
        if outcome is not None:
            save_reports.outcome(self.channel, self.rank, outcome)
        if close:
            saver.close()
            self.saver = None

    def _leave_if_stopping(self, step: int) -> None:
        if not self.stop_after_save:
            return
        self._finish_async(close=True)
        if self.channel is not None:
            self.channel.send(m.Exiting(step, p.ExitingReason.STOP.value))
        self.shutdown()
        # SystemExit rather than os._exit: the script's finally blocks and atexit handlers run
        # (destroy_process_group included); the checkpoint is already committed
        sys.exit(0)

    # ------------------------------------------------------------------ phases and the end
    def phase_changed(self, name: str, begin: bool) -> None:
        if self.channel is not None:
            self.channel.send(m.Phase(self.last_step, name, begin))

    def leaving(self) -> None:
        """At interpreter exit: finish the save in flight, then tell the supervisor that the
        silence to come is the end."""
        if self.channel is None or not self.channel.closed:
            if self.saver is not None and self.saver.in_flight is not None:
                # no step() heartbeats while the last save is waited for: not to look hung
                self.phase_changed(FINAL_SAVE_PHASE, True)
            self._finish_async(close=True)
        if self.channel is not None and not self.channel.closed:
            self.prints.flush()
            self.channel.send(m.Exiting(self.last_step, p.ExitingReason.END.value))
        self.shutdown()

    def shutdown(self) -> None:
        if self.memory is not None:
            self.memory.close()
            self.memory = None
        self.end_loader_window()  # no step() came
        WATCH.undo()  # the loaders' own generators (loader_rng)
        if self.comm_wait is not None:
            self.comm_wait.close()
            self.comm_wait = None
        if self.excepthook is not None:
            self.excepthook.undo()
            self.excepthook = None
        if self.channel is not None:
            self.channel.close()
        if self._dump_file is not None:
            disarm_stack_dumps(self.settings, self._dump_file)
            self._dump_file = None
