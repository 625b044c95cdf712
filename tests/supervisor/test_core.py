"""The stateful core (Supervisor + Attempt) driven by fakes in virtual time: races and errors in
milliseconds. The process tests prove the same wiring with real torchrun."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from supervisor.loops import LoopFailedError
from supervisor.process import native
from supervisor.ranks.checkpoints import CommitTracker
from supervisor.ranks.exits import EXIT_GRACE_S
from supervisor.record.events import EventLog
from supervisor.rules.budget import Budget
from supervisor.rules.observation import StopReason
from supervisor.rules.states import ExitCode, JobState
from supervisor.supervisor import Supervisor
from tests.helpers.checkpoint_dirs import make_checkpoint, make_checkpoint_v2
from tests.helpers.core_fakes import (
    FakeChannel,
    FakeClock,
    FakeLaunches,
    FakeNotifier,
    FakeTree,
    Scenario,
    job_config,
)
from worker_sdk.contract import layout
from worker_sdk.contract import protocol as p

REAL_TIME_LIMIT_S = 5.0  # every test here runs in virtual time (a real 5 s hang would not fit)


class Rig:
    """A Supervisor wired to fakes, and what the fakes saw."""

    def __init__(
        self,
        tmp: Path,
        scenarios: list[Scenario],
        extra: str = "",
        memory_dir: Path | None = None,
    ) -> None:
        self.cfg = job_config(tmp, extra)
        self.memory_dir = memory_dir  # the snapshot directory the daemon would have made
        self.clock = FakeClock()
        self.channel = FakeChannel()
        self.launches = FakeLaunches(tmp, self.channel, self.clock, scenarios)
        self.events = EventLog(self.cfg.job.run_dir, self.cfg.job.name, console=None)
        self.requeued: list[StopReason] = []
        self.sup: Supervisor | None = None

    async def requeue(self, reason: StopReason) -> bool:
        self.requeued.append(reason)
        return True

    def build(self) -> Supervisor:
        self.sup = Supervisor(
            self.cfg,
            events=self.events,
            channel=self.channel,
            tracker=CommitTracker(self.cfg.job.checkpoint_dir),
            commits=None,
            launches=self.launches,
            budget=Budget(),
            secret_file=self.cfg.job.run_dir / "secret",
            requeue=self.requeue,
            notifier=FakeNotifier(),
            clock=self.clock,
            jitter=lambda: 0.0,
            memory_dir=self.memory_dir,
        )
        self.events.on_log = self.sup.fold
        return self.sup

    def run(self, body: Callable[[Supervisor], Coroutine[Any, Any, ExitCode]] | None = None) -> Any:
        async def main() -> Any:
            sup = self.build()
            try:
                return await (sup.run() if body is None else body(sup))
            finally:
                for task in self.launches.tasks:
                    task.cancel()
                ended = await asyncio.gather(*self.launches.tasks, return_exceptions=True)
                for outcome in ended:  # a scenario that broke proves nothing
                    if isinstance(outcome, Exception):
                        raise outcome

        t0 = time.monotonic()
        try:
            return asyncio.run(main())
        finally:
            self.events.close()
            assert time.monotonic() - t0 < REAL_TIME_LIMIT_S

    def history(self) -> list[dict[str, Any]]:
        lines = self.events.path.read_text().splitlines()
        return [json.loads(line) for line in lines]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.history() if e["event"] == name]


async def train(ch: FakeChannel, clock: FakeClock, steps: range) -> None:
    """Both ranks say hello, then finish ``steps`` at 0.1 s a step."""
    ch.hello_all(resume_step=steps.start)
    for step in steps:
        await clock.sleep(0.1)
        ch.steps(step)
    await clock.sleep(0.1)


async def succeeds(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    await train(ch, clock, range(5))
    tree.all_succeed()


async def rank1_killed(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    await train(ch, clock, range(3))
    tree.rank_killed(1)


async def falls_silent(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    await train(ch, clock, range(4))
    await asyncio.Event().wait()  # the ranks live on without another step


def test_crash_then_success(tmp_path: Path) -> None:
    """A killed rank is a crash naming it; one charged restart later the job succeeds (exit 0),
    and both attempts' trees are torn down."""
    rig = Rig(tmp_path, [rank1_killed, succeeds])
    assert rig.run() == ExitCode.OK
    (failure,) = rig.named("failure_detected")
    assert (failure["kind"], failure["ranks"], failure["signals"]) == ("crash", [1], ["SIGKILL"])
    assert failure["last_step"] == 2
    (restart,) = rig.named("restart_scheduled")
    assert restart["charged"] is True
    assert rig.named("job_succeeded")
    assert [t.torn_down for t in rig.launches.trees] == [True, True]


async def rank1_raises(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    await train(ch, clock, range(3))
    tree.rank_ends(1, code=1)
    tree.launcher_ends(1)


def test_a_rank_killed_by_a_signal_stops_the_launcher_at_once(tmp_path: Path) -> None:
    """A rank killed by a signal ends the attempt: its launcher is stopped when the death is
    seen (torchrun must not race the teardown); after a rank's error exit, and when the job
    succeeds, it is left to run (it relays the rank's last words)."""
    (tmp_path / "killed").mkdir()
    (tmp_path / "raised").mkdir()
    killed = Rig(tmp_path / "killed", [rank1_killed, succeeds])
    assert killed.run() == ExitCode.OK
    assert [t.held for t in killed.launches.trees] == [1, 0]
    raised = Rig(tmp_path / "raised", [rank1_raises, succeeds])
    assert raised.run() == ExitCode.OK
    assert [t.held for t in raised.launches.trees] == [0, 0]
    assert all(t.torn_down for t in killed.launches.trees + raised.launches.trees)


def test_hang_found_in_virtual_time(tmp_path: Path) -> None:
    """Ranks that stop finishing steps are a hang after the automatic 5 s timeout; stacks are
    collected before the teardown, and the next attempt runs."""
    rig = Rig(tmp_path, [falls_silent, succeeds])
    assert rig.run() == ExitCode.OK
    (failure,) = rig.named("failure_detected")
    assert failure["kind"] == "hang"
    assert failure["hang_timeout_s"] == 5.0
    assert 5.0 <= failure["detect_s"] <= 5.2
    tree = rig.launches.trees[0]
    assert tree.stacks_collected and tree.torn_down
    assert tree.native_stacks is True


def test_native_stacks_are_asked_for_while_the_hang_is_confirmed(tmp_path: Path) -> None:
    """Ranks silent for all but native.LEAD_S of the timeout: their native stacks are asked for
    then (py-spy needs about a second a rank), not once the hang is declared, and the
    declaration itself comes no earlier."""
    rig = Rig(tmp_path, [falls_silent, succeeds])
    last_step_t = rig.clock.monotonic() + 0.1 * 4  # train(): hello, then four steps of 0.1 s
    assert rig.run() == ExitCode.OK
    (failure,) = rig.named("failure_detected")
    assert failure["kind"] == "hang" and 5.0 <= failure["detect_s"] <= 5.2
    tree = rig.launches.trees[0]
    (foreseen,) = tree.foreseen
    assert 5.0 - native.LEAD_S <= foreseen - last_step_t <= 5.0 - native.LEAD_S + 0.2
    assert tree.averted == [] and tree.stacks_collected


def test_early_native_stacks_are_dropped_when_the_ranks_go_on(tmp_path: Path) -> None:
    """A silence that comes within native.LEAD_S of the timeout, then ends: the early native
    stacks are dropped and the attempt goes on to succeed (no hang)."""

    async def pauses_then_succeeds(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(4))
        await clock.sleep(5.0 - native.LEAD_S / 2)  # silent, but not for the whole timeout
        await train(ch, clock, range(4, 8))
        tree.all_succeed()

    rig = Rig(tmp_path, [pauses_then_succeeds])
    assert rig.run() == ExitCode.OK
    assert not rig.named("failure_detected")
    tree = rig.launches.trees[0]
    assert len(tree.foreseen) == 1 and len(tree.averted) == 1
    assert tree.foreseen[0] < tree.averted[0] and not tree.stacks_collected


def test_native_stacks_false_asks_for_no_native_stacks(tmp_path: Path) -> None:
    """``heartbeat.native_stacks = false`` reaches the hang's diagnostics: Python stacks only."""
    rig = Rig(tmp_path, [falls_silent, succeeds], "[heartbeat]\nnative_stacks = false\n")
    assert rig.run() == ExitCode.OK
    tree = rig.launches.trees[0]
    assert tree.stacks_collected and tree.native_stacks is False
    assert tree.foreseen == []  # nor early ones


def test_a_hang_names_the_steps_seen_when_it_was_caught(tmp_path: Path) -> None:
    """Steps the ranks finish while their stacks are collected (a stopped rank is continued to
    dump, and trains on) are not the hang's: ``last_step`` is the step when it was caught."""

    async def silent_then_trains_while_dumping(
        tree: FakeTree, ch: FakeChannel, clock: FakeClock
    ) -> None:
        tree.steps_while_dumping = 40
        await falls_silent(tree, ch, clock)

    rig = Rig(tmp_path, [silent_then_trains_while_dumping, succeeds])
    assert rig.run() == ExitCode.OK
    (failure,) = rig.named("failure_detected")
    assert (failure["kind"], failure["last_step"]) == ("hang", 3)


@pytest.mark.parametrize(("nnodes", "culprit"), [(2, 1), (1, 0)])
def test_a_death_reported_from_another_node_is_awaited(
    tmp_path: Path, nnodes: int, culprit: int
) -> None:
    """On several nodes a rank's death is reported over the network: one 0.2 s behind its
    peer's exception (the broken connection) is still taken into account, and the crash names
    the killed rank first; on one node, where deaths are seen as they happen, the attempt ends
    after 0.05 s of such evidence."""

    async def killed_elsewhere(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(3))
        reset = {"type": "RuntimeError", "message": "Connection reset by peer"}
        ch.put(0, p.Kind.FAILURE, step=3, payload=reset)
        await clock.sleep(0.2)
        exit_report = {"pid": 101, "code": None, "signal": 9, "host": "node2"}
        ch.put(1, p.Kind.RANK_EXIT, payload=exit_report)
        await asyncio.Event().wait()

    rig = Rig(tmp_path, [killed_elsewhere, succeeds])
    rig.launches.nnodes = nnodes
    assert rig.run() == ExitCode.OK
    (failure,) = rig.named("failure_detected")
    assert failure["kind"] == "crash" and failure["ranks"][0] == culprit, failure


def test_a_loop_raising_ends_the_run_and_tears_down(tmp_path: Path) -> None:
    """An exception in the receive loop does not leave the attempt waiting: run() raises
    LoopFailedError naming the loop, after the attempt's tree was torn down."""

    async def poisoned(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        ch.fail_with = RuntimeError("bug in a handler")
        ch.hello_all()
        await asyncio.Event().wait()

    rig = Rig(tmp_path, [poisoned])
    with pytest.raises(LoopFailedError, match="receive loop raised") as info:
        rig.run()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert rig.launches.trees[0].torn_down


def test_teardown_finishes_even_when_cancelled(tmp_path: Path) -> None:
    """Cancelling the supervisor while an attempt's tree is being torn down waits for the
    teardown to finish before the cancellation takes effect (no orphaned ranks)."""
    gate: dict[str, asyncio.Event] = {}

    async def killed_slow_teardown(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        gate["teardown"] = tree.teardown_gate = asyncio.Event()
        await rank1_killed(tree, ch, clock)

    rig = Rig(tmp_path, [killed_slow_teardown])

    async def body(sup: Supervisor) -> ExitCode:
        task = asyncio.ensure_future(sup.run())
        while sup.current is None or sup.current.state is not JobState.TEARING_DOWN:
            await asyncio.sleep(0.001)
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done() and not rig.launches.trees[0].torn_down
        gate["teardown"].set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert rig.launches.trees[0].torn_down
        return ExitCode.OK

    rig.run(body)


def test_stop_racing_a_crash_stops(tmp_path: Path) -> None:
    """A stop requested in the instant a rank dies wins: exit 75, nothing charged, no restart."""
    rig = Rig(tmp_path, [])

    async def crash_and_stop(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(3))
        tree.rank_killed(1)
        assert rig.sup is not None
        rig.sup.request_stop(StopReason.STOPPED, "test")

    rig.launches.scenarios.append(crash_and_stop)
    assert rig.run() == ExitCode.TEMPFAIL
    assert not rig.named("restart_scheduled")
    (stopped,) = rig.named("job_stopped")
    assert (stopped["reason"], stopped["requeued"]) == ("stopped", False)


def test_stop_requested_before_the_first_attempt(tmp_path: Path) -> None:
    """A stop that came while the daemon was starting (kept by its signal handler, handed over
    before the supervisor runs) stops the job before any launch: exit 75, requeued."""
    rig = Rig(tmp_path, [])

    async def stopped_first(sup: Supervisor) -> ExitCode:
        sup.request_stop(StopReason.PREEMPTED, "signal SIGTERM")
        return await sup.run()

    assert rig.run(stopped_first) == ExitCode.TEMPFAIL
    assert not rig.launches.trees
    (stopped,) = rig.named("job_stopped")
    assert (stopped["reason"], stopped["step"]) == ("preempted", None)
    assert rig.requeued == [StopReason.PREEMPTED]


def test_rank_dying_during_a_preemption_stop(tmp_path: Path) -> None:
    """A rank that dies while the preemption's save round runs ends the stop without a
    checkpoint: exit 75, requeued, and the history says the previous checkpoint stays."""
    rig = Rig(tmp_path, [])

    async def preempted_then_dies(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(3))
        assert rig.sup is not None
        rig.sup.request_stop(StopReason.PREEMPTED, "signal SIGTERM")
        await clock.sleep(0.3)
        tree.rank_killed(0)

    rig.launches.scenarios.append(preempted_then_dies)
    assert rig.run() == ExitCode.TEMPFAIL
    assert any(kind is p.Kind.SYNC_REQUEST for _, kind, _, _ in rig.channel.sent)
    (stopped,) = rig.named("job_stopped")
    assert stopped["reason"] == "preempted" and stopped["step"] is None
    assert "previous one" in stopped["note"]
    assert rig.requeued == [StopReason.PREEMPTED]


def test_commit_arriving_after_the_exit_counts(tmp_path: Path) -> None:
    """A commit announced just after a rank died (inside the settle window) is recorded, so the
    next attempt resumes after it and the attempt counts as progress."""
    rig = Rig(tmp_path, [])

    async def killed_then_commit(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(3))
        tree.rank_killed(1)
        path = make_checkpoint(rig.cfg.job.checkpoint_dir, 2)
        ch.put(0, p.Kind.CKPT_COMMITTED, step=2, value=0.1, payload={"path": str(path)})

    rig.launches.scenarios += [killed_then_commit, succeeds]
    assert rig.run() == ExitCode.OK
    (commit,) = rig.named("checkpoint_committed")
    assert commit["step"] == 2
    second = [e for e in rig.named("attempt_started") if e["attempt"] == 2]
    assert second[0]["resume_step"] == 3
    assert second[0]["checkpoint"].endswith(layout.committed_name(2))


def test_a_commit_not_yet_heard_is_where_the_next_attempt_resumes(tmp_path: Path) -> None:
    """A checkpoint committed on disk whose commit the daemon has not heard (its watcher's event
    still queued, the rank's message lost with the rank): the next attempt's attempt_started
    names it and the step after it, as the ranks will load it, not an older one."""
    rig = Rig(tmp_path, [])

    async def commits_unheard_then_killed(
        tree: FakeTree, ch: FakeChannel, clock: FakeClock
    ) -> None:
        await train(ch, clock, range(3))
        make_checkpoint(rig.cfg.job.checkpoint_dir, 2)
        tree.rank_killed(1)

    rig.launches.scenarios += [commits_unheard_then_killed, succeeds]
    assert rig.run() == ExitCode.OK
    second = [e for e in rig.named("attempt_started") if e["attempt"] == 2]
    assert second[0]["resume_step"] == 3
    assert second[0]["checkpoint"].endswith(layout.committed_name(2))


def test_gives_up_when_no_attempt_progresses(tmp_path: Path) -> None:
    """Ranks that crash at the same step every time: exit 3 after max_no_progress restarts,
    named deterministic."""
    rig = Rig(tmp_path, [rank1_killed])
    assert rig.run() == ExitCode.GAVE_UP
    (gave_up,) = rig.named("job_gave_up")
    assert "no progress" in gave_up["reason"]
    assert "deterministic" in gave_up["reason"]
    assert len(rig.named("attempt_started")) == 2


def test_dropped_messages_are_recorded_per_attempt(tmp_path: Path) -> None:
    """Messages the channel dropped during an attempt show in the history as messages_dropped,
    with the counts by reason; an attempt that dropped nothing adds no such line."""

    async def spoofed(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        ch.dropped["bad mac"] += 3
        await succeeds(tree, ch, clock)

    rig = Rig(tmp_path, [rank1_killed, spoofed])
    assert rig.run() == ExitCode.OK
    (dropped,) = rig.named("messages_dropped")
    assert (dropped["attempt"], dropped["counts"]) == (2, {"bad mac": 3})


def test_resume_on_another_world_size_is_recorded(tmp_path: Path) -> None:
    """A job whose newest checkpoint was written by 3 ranks and that now runs on 2 records
    resharded_from = 3 on attempt_started; commits carry their world size and format."""
    rig = Rig(tmp_path, [])
    make_checkpoint(rig.cfg.job.checkpoint_dir, 4, world_size=3)

    async def resumed_and_saves(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(5, 8))
        path = make_checkpoint(rig.cfg.job.checkpoint_dir, 7, world_size=2)
        ch.put(0, p.Kind.CKPT_COMMITTED, step=7, value=0.1, payload={"path": str(path)})
        await clock.sleep(0.2)
        tree.all_succeed()

    rig.launches.scenarios.append(resumed_and_saves)
    assert rig.run() == ExitCode.OK
    (started,) = rig.named("attempt_started")
    assert (started["resume_step"], started["resharded_from"]) == (5, 3)
    (commit,) = rig.named("checkpoint_committed")
    assert (commit["step"], commit["world_size"], commit["format"]) == (7, 2, 1)


def test_a_failed_background_save_is_recorded_and_shown_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    """CKPT_FAILED from a rank: a checkpoint_failed event (step, rank, reason), the failure in
    ``rvsup status``, no failure of the attempt, and the job still succeeds."""
    rig = Rig(tmp_path, [])
    seen: list[dict[str, Any]] = []

    async def save_fails(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(4))
        ch.put(1, p.Kind.CKPT_FAILED, step=3, payload={"reason": "OSError: [Errno 28] No space"})
        await clock.sleep(0.2)
        assert rig.sup is not None
        seen.extend(rig.sup.status()["checkpoint_failures"])
        await train(ch, clock, range(4, 6))
        tree.all_succeed()

    rig.launches.scenarios.append(save_fails)
    assert rig.run() == ExitCode.OK
    (failed,) = rig.named("checkpoint_failed")
    assert (failed["step"], failed["rank"], failed["level"]) == (3, 1, "warning")
    assert "No space" in failed["reason"]
    assert seen == [{"rank": 1, "step": 3, "reason": "OSError: [Errno 28] No space"}]
    assert not rig.named("failure_detected")


async def one_stuck_at_exit(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    """Both scripts end (EXITING "exit"); rank 0's process exits, rank 1's never does."""
    await train(ch, clock, range(5))
    for rank in range(2):
        ch.put(rank, p.Kind.EXITING, step=4, payload={"reason": p.ExitingReason.END.value})
    await clock.sleep(0.5)
    tree.rank_ends(0, code=0)
    await asyncio.Event().wait()


async def ends_then_fails(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    """Both scripts end, then rank 1's interpreter exits with code 3."""
    await train(ch, clock, range(5))
    for rank in range(2):
        ch.put(rank, p.Kind.EXITING, step=4, payload={"reason": p.ExitingReason.END.value})
    await clock.sleep(1.0)
    tree.rank_ends(1, code=3)
    tree.launcher_ends(1)
    await asyncio.Event().wait()


def test_a_rank_stuck_at_interpreter_exit_does_not_fail_a_finished_job(tmp_path: Path) -> None:
    """Every script ended but rank 1's interpreter never exits: after the exit grace the
    attempt succeeds, ``exit_stalled`` names rank 1, and the tree is torn down (no restart);
    an interpreter that exits with an error before the grace still fails the attempt."""
    rig = Rig(tmp_path, [one_stuck_at_exit])
    assert rig.run() == ExitCode.OK
    (stalled,) = rig.named("exit_stalled")
    assert stalled["ranks"] == [1]
    assert stalled["waited_s"] >= EXIT_GRACE_S
    assert rig.named("job_succeeded") and not rig.named("restart_scheduled")
    assert [t.torn_down for t in rig.launches.trees] == [True]
    (tmp_path / "b").mkdir()
    failing = Rig(tmp_path / "b", [ends_then_fails, succeeds])
    assert failing.run() == ExitCode.OK
    assert [f["kind"] for f in failing.named("failure_detected")] == ["crash"]
    assert failing.named("exit_stalled") == []


async def ends_then_aborts(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    """Both scripts end; rank 0's interpreter then dies of SIGABRT, torchrun reports it."""
    await train(ch, clock, range(5))
    for rank in range(2):
        ch.put(rank, p.Kind.EXITING, step=4, payload={"reason": p.ExitingReason.END.value})
    await clock.sleep(0.5)
    tree.stderr[0] = "step 4 done\nAssertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)\n"
    tree.rank_ends(0, sig=signal.SIGABRT)
    tree.rank_ends(1, code=0)
    tree.launcher_ends(1)
    await asyncio.Event().wait()


async def one_ends_then_aborts(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    """Rank 0's script ends and its interpreter aborts while rank 1 still trains."""
    await train(ch, clock, range(5))
    ch.put(0, p.Kind.EXITING, step=4, payload={"reason": p.ExitingReason.END.value})
    await clock.sleep(0.5)
    tree.rank_ends(0, sig=signal.SIGABRT)
    await asyncio.Event().wait()


def test_an_abort_after_every_script_ended_is_not_a_crash(tmp_path: Path) -> None:
    """Every rank's script ended, then rank 0 died of SIGABRT in interpreter teardown: the job
    succeeds at once (no restart), and ``exit_aborted`` names rank 0, its signal, its last step
    and what it printed; a rank that aborts while another has not finished fails the attempt,
    and ``exit_aborted`` still says what happened."""
    rig = Rig(tmp_path, [ends_then_aborts])
    assert rig.run() == ExitCode.OK
    (aborted,) = rig.named("exit_aborted")
    assert aborted["rank"] == 0
    assert aborted["signal"] == "SIGABRT"
    assert aborted["last_step"] == 4
    assert aborted["stderr_tail"].endswith(
        "Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)"
    )
    assert rig.named("job_succeeded") and not rig.named("failure_detected")
    (tmp_path / "b").mkdir()
    partial = Rig(tmp_path / "b", [one_ends_then_aborts, succeeds])
    assert partial.run() == ExitCode.OK
    assert [f["kind"] for f in partial.named("failure_detected")] == ["crash"]
    assert [a["rank"] for a in partial.named("exit_aborted")] == [0]


def test_a_checkpoint_the_ranks_found_damaged_is_no_rollback_target(tmp_path: Path) -> None:
    """The newest checkpoint (step 23) is damaged in a checksum the daemon does not read: the
    ranks pass it over (CKPT_SKIPPED) and load step 19. A non-finite loss at step 26 rolls back
    to step 19, the checkpoint they can load, and ``rolled_back`` counts the steps from there."""
    rig = Rig(tmp_path, [])
    ckpt = rig.cfg.job.checkpoint_dir
    make_checkpoint(ckpt, 19)
    damaged = make_checkpoint(ckpt, 23)

    async def skips_23_then_nan(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        for rank in range(2):
            ch.put(rank, p.Kind.CKPT_SKIPPED, payload={"path": str(damaged), "reason": "crc"})
        ch.put(0, p.Kind.LOADED, step=20, payload={"path": str(ckpt / layout.committed_name(19))})
        await train(ch, clock, range(20, 26))
        ch.put(0, p.Kind.LOSS_NONFINITE, step=26, value=float("nan"))
        await asyncio.Event().wait()

    rig.launches.scenarios += [skips_23_then_nan, succeeds]
    assert rig.run() == ExitCode.OK
    (skipped, _) = rig.named("checkpoint_skipped")
    assert skipped["path"] == str(damaged)
    (rolled,) = rig.named("rolled_back")
    assert (rolled["to_step"], rolled["resume_step"], rolled["skipped_steps"]) == (19, 27, 7)
    second = [e for e in rig.named("attempt_started") if e["attempt"] == 2]
    assert second[0]["checkpoint"].endswith(layout.committed_name(19))


def test_a_rollback_discards_the_snapshots_newer_than_the_checkpoint_it_restores(
    tmp_path: Path,
) -> None:
    """Snapshots of steps 21 and 22 (before the NaN's onset at 23, after the checkpoint of
    step 19 the rollback restores) go with the rollback: a later attempt resumes from step 19
    at step 24, as ``rolled_back`` says, never from snapshot 22 (which would keep steps 20-22,
    which the rollback skipped). Found by the chaos campaign with the memory tier on."""
    shm = tmp_path / "shm"
    snapshots = shm / "rvsup-snapshots"
    extra = f'[checkpoint]\nmemory_every_steps = 1\nmemory_dir = "{shm}"'
    rig = Rig(tmp_path, [], extra=extra, memory_dir=snapshots)
    ckpt = rig.cfg.job.checkpoint_dir
    make_checkpoint(ckpt, 19)

    async def snapshots_then_nan(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
        await train(ch, clock, range(20, 23))
        for step in (21, 22):
            make_checkpoint_v2(snapshots, step)
        ch.put(0, p.Kind.LOSS_NONFINITE, step=23, value=float("nan"))
        await asyncio.Event().wait()

    rig.launches.scenarios += [snapshots_then_nan, rank1_killed, succeeds]
    assert rig.run() == ExitCode.OK
    (rolled,) = rig.named("rolled_back")
    assert (rolled["to_step"], rolled["resume_step"]) == (19, 24)
    for later in (2, 3):
        (started,) = [e for e in rig.named("attempt_started") if e["attempt"] == later]
        assert started["source"] == "storage", started
        assert started["checkpoint"].endswith(layout.committed_name(19))
    assert not layout.scan(snapshots)[0]


async def rank1_straggles_then_dies(tree: FakeTree, ch: FakeChannel, clock: FakeClock) -> None:
    """Rank 1 (on node n1) makes rank 0 (on n0) wait 50 ms of every 100 ms step for 40 s,
    then is killed."""
    for rank in range(2):
        ch.put(rank, p.Kind.HELLO, payload={"host": f"n{rank}"})
    for step in range(400):
        await clock.sleep(0.1)
        for rank, wait in ((0, 0.05), (1, 0.0)):
            ch.put(rank, p.Kind.HEARTBEAT, step=step, value=0.01, payload={"comm_wait_s": wait})
    tree.rank_killed(1)


@pytest.mark.parametrize("exclude_after", [2, 0])
def test_a_stragglers_node_is_excluded_at_the_next_restart(
    tmp_path: Path, exclude_after: int
) -> None:
    """With exclude_stragglers, the node of the rank named a straggler is excluded when the
    job restarts for another reason (a crash), with the straggler's reason; with exclusion
    off (exclude_after = 0) it is named but not excluded."""
    health = (
        f"[health]\nenabled = false\nexclude_stragglers = true\nexclude_after = {exclude_after}\n"
    )
    rig = Rig(tmp_path, [rank1_straggles_then_dies, succeeds], extra=health)
    rig.launches.usable_nodes = lambda: ("n0", "n1")  # type: ignore[method-assign]
    assert rig.run() == ExitCode.OK
    (named,) = rig.named("straggler_detected")
    assert (named["rank"], named["node"], named["exclude_node"]) == (1, "n1", exclude_after > 0)
    excluded = rig.named("node_excluded")
    if exclude_after:
        assert [(e["node"], "straggler" in e["reason"]) for e in excluded] == [("n1", True)]
        assert "n1" in rig.launches.lost
    else:
        assert not excluded and not rig.launches.lost
