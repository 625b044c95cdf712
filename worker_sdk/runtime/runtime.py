"""One rank's runtime: the state behind ``resume()`` and ``step()``.

The per-step path (:meth:`Runtime.step` inlined in ``worker_sdk.step``) reads the monotonic clock
(vDSO, no syscall), updates three slots and compares two numbers; everything else happens in
:meth:`Runtime.slow_path` when a heartbeat, a save or a coordinated stop is due.

Coordinated saves (a stop, or a time-based save the supervisor schedules) must happen at one step on
every rank, or a rank would block in a collective the others skip. The supervisor sends
SYNC_REQUEST; each rank notices it at its next heartbeat and from then on reports every finished step
with SYNC and waits for the answer: CONTINUE, or SAVE_AT S once every rank has reported. Because each
rank waits after every reported step, no rank can be past S = (highest reported step) + 1.
"""

from __future__ import annotations

import faulthandler
import math
import mmap
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from worker_sdk.checkpoint.checkpointer import Checkpointer, LoadResult, SaveError, Stateful
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

from . import save_reports
from .channel import Channel
from .exit_hooks import is_oom
from .rank_files import arm_stack_dumps, local_rank, map_step_slot, output_files
from .settings import Settings

if TYPE_CHECKING:
    from worker_sdk.checkpoint.background.async_save import AsyncSaver

    from .loader_rng import LoaderWindow
    from .replicas import ReplicaCheck
    from .stragglers import CommWait

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
        "extra_default",
        "hb_due",
        "hb_step",
        "last_step",
        "loss",
        "loss_reported",
        "max_dt",
        "next_due",
        "next_save_step",
        "objects",
        "periodic_next",
        "rank",
        "replicas",
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
        self.extra_default: Any = None
        self.total_steps: int | None = None  # resume(total_steps=): for ``rvsup status``
        self.window: LoaderWindow | None = None  # until the first step() after a resume
        self.saver: AsyncSaver | None = None
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
        self.replicas: ReplicaCheck | None = (
            None  # plain DDP compared (worker_sdk.runtime.replicas)
        )
        self.verify_next = _NEVER
        self.comm_wait: CommWait | None = None  # DDP's all-reduce wait, for stragglers
        # the first finished step is reported at once: until the supervisor has seen it, only
        # the (long) startup timeout can catch a hang
        self.hb_due = now if channel else math.inf
        every_s = settings.every_s if world_size == 1 and checkpointer else None
        self.save_due_t = now + every_s if every_s else math.inf
        self.next_due = min(self.hb_due, self.save_due_t)
        self._dump_file: IO[str] | None = None
        self._slot_map: mmap.mmap | None = None
        # the last finished step, stored by every step() (see protocol.step_slot_file)
        self.step_slot: memoryview = memoryview(bytearray(8)).cast("q")

    # ------------------------------------------------------------------ start-up
    def start(self, loaded: LoadResult) -> int:
        """Announce the rank, report what was loaded; return the first step to run."""
        start = 0 if loaded.step is None else loaded.step + 1
        if self.channel is not None:  # after a rollback: the skipped steps stay skipped
            skipped = max(0, int(os.environ.get(p.ENV_RESUME_AT) or 0) - start)
            os.environ[p.ENV_SKIPPED_STEPS] = str(skipped)
            start += skipped
        self.last_step = start - 1
        self.hb_step = start - 1  # what a failure before the first step() names
        if self.settings.diagnostics_dir is not None:
            self._slot_map, self.step_slot = map_step_slot(self.settings.diagnostics_dir, self.rank)
        self.step_slot[0] = start - 1
        every = int(os.environ.get(p.ENV_VERIFY_EVERY) or 0) if self.channel else 0
        if every > 0 and self.world_size > 1:
            from .replicas import ReplicaCheck, ddp_modules

            modules = ddp_modules(self.objects)
            if modules:
                self.replicas = ReplicaCheck(every, modules, start - 1)
                self.verify_next = self.replicas.next_step
        if self.channel is not None and self.world_size > 1:
            from .stragglers import CommWait

            self.comm_wait = CommWait.of(self.objects)
        self._set_periodic(start - 1)
        if self.channel is not None:
            out, err = output_files()
            hello = m.Hello(
                start,
                self.settings.host,
                local_rank(),
                self.world_size,
                self.total_steps,
                out,
                err,
            )
            self.channel.send(hello)
            for path, reason in loaded.skipped:
                self.channel.send(m.CheckpointSkipped(str(path), reason))
            loaded_from = str(loaded.path) if loaded.path else None
            self.channel.send(
                m.Loaded(start, loaded_from, loaded.saved_world_size, loaded.resharded_from)
            )
        self._dump_file = arm_stack_dumps(self.settings, self.rank)
        if self.saver is not None:
            self.saver.start()
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
        self.next_save_step = min(self.periodic_next, self.sync_save_at, self.verify_next)

    # ------------------------------------------------------------------ the slow path
    def slow_path(self, step: int, extra: Any, now: float) -> None:
        """Heartbeat, coordinated-save handshake and saves; called only when one is due."""
        if self.window is not None:
            self._close_window()
        saver = self.saver
        if saver is not None and saver.in_flight is not None:
            outcome = saver.poll()
            if outcome is not None:
                save_reports.outcome(self.channel, self.rank, outcome)
        if now >= self.hb_due:
            self._heartbeat(step, now)
        if self.sync_mode:
            self._sync_round(step)
        if step >= self.verify_next:
            self._verify(step)
        if step >= min(self.periodic_next, self.sync_save_at) or now >= self.save_due_t:
            self._save(step, extra)
        in_flight = saver is not None and saver.in_flight is not None
        self.next_due = 0.0 if self.sync_mode or in_flight else min(self.hb_due, self.save_due_t)

    def _close_window(self) -> None:
        assert self.window is not None
        advice = self.window.close()
        self.window = None
        if advice is not None:
            warnings.warn(advice, RuntimeWarning, stacklevel=4)

    def _heartbeat(self, step: int, now: float) -> None:
        ch = self.channel
        assert ch is not None
        finite: float | None = None
        loss = self.loss
        if loss is not None:
            self.loss = None
            value = loss if loss.__class__ is float else float(loss)  # a tensor is read here
            if math.isfinite(value):
                finite = value
            elif loss.__class__ is not float:  # a float was reported by step() already
                self.loss_not_finite(step, value, self.hb_step + 1)
        wait = None if self.comm_wait is None else self.comm_wait.read(step - self.hb_step)
        ch.send(m.Heartbeat(step, self.max_dt, finite, wait))
        self.hb_step = step
        self.max_dt = 0.0
        self.hb_due = now + self.settings.heartbeat_interval_s
        while (body := ch.receive()) is not None:
            if isinstance(body, m.SyncRequest):
                self.sync_mode = True

    def _verify(self, step: int) -> None:
        """Compare the replicas (a collective at a step every rank reaches); rank 0 reports
        the ranks that differ from the majority."""
        assert self.replicas is not None
        report = self.replicas.run(step)
        if report is not None and self.rank == 0 and self.channel is not None:
            self.channel.send(report)
        self.verify_next = self.replicas.next_step
        self.next_save_step = min(self.periodic_next, self.sync_save_at, self.verify_next)

    def loss_not_finite(self, step: int, value: float, since: int) -> None:
        """Report a loss that is not finite at once (the first only: the attempt ends)."""
        if self.channel is None or self.loss_reported:
            return
        self.loss_reported = True
        self.channel.send(m.LossNonFinite(step, value, since))

    def _sync_round(self, step: int) -> None:
        ch = self.channel
        assert ch is not None
        ch.send(m.Sync(step))
        deadline = time.monotonic() + 600.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"rvsup: rank {self.rank}: no answer to a coordinated save", file=sys.stderr)
                os._exit(p.EXIT_SYNC_TIMEOUT)
            match ch.receive(timeout_s=min(left, 1.0)):
                case m.Continue():
                    return
                case m.SyncCancel():
                    self.sync_mode = False
                    return
                case m.SaveAt(at, stop):
                    if at < step:
                        raise RuntimeError(f"rvsup: asked to save at step {at}, already at {step}")
                    self.sync_mode = False
                    self.stop_after_save = self.stop_after_save or stop
                    if self.checkpointer is None:  # nothing to save: stop now or go on
                        self._leave_if_stopping(step)
                        return
                    self.sync_save_at = at
                    self.next_save_step = min(self.periodic_next, at, self.verify_next)
                    return

    def _save(self, step: int, extra: Any) -> None:
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
                try:
                    result = ck.save(step, self.objects, extra)
                except SaveError as e:
                    if stopping:  # the stop has no checkpoint to leave on: a failure
                        raise
                    save_reports.save_failed(self.channel, self.rank, step, str(e))
                else:
                    if result.committed:
                        save_reports.committed(
                            self.channel, step, result.seconds, result.path, result.nbytes, "sync"
                        )
        now = time.monotonic()
        if self.save_due_t != math.inf and self.settings.every_s:
            self.save_due_t = now + self.settings.every_s
        coordinated = step >= self.sync_save_at
        if coordinated:
            self.sync_save_at = _NEVER
        self._set_periodic(step)
        self.t_last = now  # the save is not a training step
        if coordinated:
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

    # ------------------------------------------------------------------ phases and failures
    def phase_changed(self, name: str, begin: bool) -> None:
        if self.channel is not None:
            self.channel.send(m.Phase(self.last_step, name, begin))

    def report_exception(self, exc: BaseException) -> bool:
        """Tell the supervisor why this rank dies; True when it is an out-of-memory error."""
        oom = is_oom(exc)
        if self.channel is not None:
            kind = "oom" if oom else "exception"
            failure = m.Failure(self.last_step + 1, kind, type(exc).__name__, str(exc)[:2000])
            self.channel.send(failure)
        return oom

    def leaving(self) -> None:
        """At interpreter exit: finish the save in flight, then tell the supervisor that the
        silence to come is the end."""
        if self.channel is None or not self.channel.closed:
            if self.saver is not None and self.saver.in_flight is not None:
                # no step() comes to heartbeat while the last save is waited for: a long one
                # would look like a hang of a rank whose script has ended
                self.phase_changed(FINAL_SAVE_PHASE, True)
            self._finish_async(close=True)
        if self.channel is not None and not self.channel.closed:
            self.channel.send(m.Exiting(self.last_step, p.ExitingReason.END.value))
        self.shutdown()

    def shutdown(self) -> None:
        if self.window is not None:  # no step() came: put DataLoader.__iter__ back
            self.window.close()
            self.window = None
        if self.channel is not None:
            self.channel.close()
        if self._dump_file is not None:
            faulthandler.unregister(self.settings.dump_signal)
            self._dump_file.close()
            self._dump_file = None
