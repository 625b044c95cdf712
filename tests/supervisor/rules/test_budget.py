"""The budget fold: restarts, no-progress streak, OOMs, the deterministic signature, attempts;
and that folding during the run equals folding the file at start-up."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.events import EventLog
from supervisor.record.history_file import read
from supervisor.record.schema import (
    AttemptStarted,
    Event,
    FailureDetected,
    JobGaveUp,
    JobStopped,
    JobSucceeded,
    MemorySnapshots,
    NodeExcluded,
    RestartScheduled,
    RolledBack,
    StopRequested,
)
from supervisor.rules.budget import Budget, budget_of, fold, signature_of
from supervisor.rules.failures import deterministic_signature
from supervisor.rules.observation import Failure, FailureKind
from supervisor.rules.policy import GiveUp, Requeue, Restart, RestartPolicy, decide
from tests.helpers.events import attempt_started, commit, failure_event, job_started

K = FailureKind


def failed(kind: str, ranks: tuple[int, ...] = (1,), step: int | None = 30) -> FailureDetected:
    return failure_event(Failure(K(kind), ranks, (), (), step, f"{kind} at {step}"))


def on_nodes(kind: str, *nodes: str) -> FailureDetected:
    return failure_event(Failure(K(kind), (1,), (), (), 30, kind, nodes))


def restarted(charged: bool = True) -> RestartScheduled:
    return RestartScheduled(
        backoff_s=1.0, restarts_left=3, charged=charged, deterministic=False, note=""
    )


def stopped(reason: str = "preempted") -> JobStopped:
    return JobStopped(reason=reason, requeued=True, step=None, note="")


CRASH_30 = ("crash", (1,), 30)


def snapshots(newest: int | None) -> MemorySnapshots:
    """An attempt's memory tier summary, its newest complete snapshot of step ``newest``."""
    count = 0 if newest is None else 3
    return MemorySnapshots(count=count, blocked_s=0.1, bytes=None, interval=5, newest_step=newest)


def crash_loop(n: int, *, commits: bool = False) -> list[Event]:
    """``n`` attempts that each crash the same way and are restarted (charged)."""
    events: list[Event] = []
    for i in range(n):
        events += [attempt_started(), *([commit(10 * (i + 1))] if commits else []), failed("crash")]
        events.append(restarted())
    return events


# (events, the Budget fields expected after folding them all)
FOLDS: dict[str, tuple[list[Event], dict[str, Any]]] = {
    "nothing-yet": ([], {"attempts": 0, "restarts_used": 0, "failure": None, "progressed": False}),
    "charged-restarts-without-progress": (
        crash_loop(2),
        {"attempts": 2, "restarts_used": 2, "no_progress_streak": 2, "charged_failure": CRASH_30},
    ),
    "uncharged-restart-spends-nothing": (
        [attempt_started(), failed("crash"), restarted(charged=False)],
        {"restarts_used": 0, "no_progress_streak": 0, "charged_failure": None},
    ),
    "preemption-never-charged": (
        [
            *crash_loop(1),
            attempt_started(),
            StopRequested(reason="preempted", source="SIGTERM"),
            failed("preempted", (), 31),
            stopped(),
        ],
        {
            "restarts_used": 1,
            "no_progress_streak": 1,
            "failure": ("preempted", (), 31),
            "charged_failure": CRASH_30,
            "last_failure": "preempted",
        },
    ),
    "progress-resets-the-streak": (
        [*crash_loop(2), attempt_started(), commit(5)],
        {"no_progress_streak": 0, "progressed": True, "newest_step": 5},
    ),
    "a-charged-attempt-that-progressed-keeps-it-at-zero": (
        crash_loop(3, commits=True),
        {"restarts_used": 3, "no_progress_streak": 0, "progressed": True, "newest_step": 30},
    ),
    "an-uncharged-attempt-that-progressed-resets": (
        [*crash_loop(2), attempt_started(), failed("preempted", (), 40), commit(40), stopped()],
        {"no_progress_streak": 0, "restarts_used": 2},
    ),
    "resumed-step-recommitted-is-no-progress": (
        [attempt_started(resume=10), commit(9), failed("crash"), restarted()],
        {"progressed": False, "newest_step": 9, "no_progress_streak": 1},
    ),
    "a-newer-memory-snapshot-is-progress": (
        [*crash_loop(2), attempt_started(), commit(5), snapshots(12), failed("crash")],
        {"no_progress_streak": 0, "progressed": True, "newest_step": 12},
    ),
    "a-snapshot-no-newer-than-the-resume-is-no-progress": (
        [attempt_started(resume=13), snapshots(12), failed("crash"), restarted()],
        {"progressed": False, "newest_step": 12, "no_progress_streak": 1},
    ),
    "an-attempt-without-a-snapshot-is-no-progress": (
        [*crash_loop(1), attempt_started(), snapshots(None), failed("crash"), restarted()],
        {"progressed": False, "newest_step": None, "no_progress_streak": 2},
    ),
    "older-commit-is-no-progress": (
        [attempt_started(), commit(20), *crash_loop(1)[:1], commit(10)],
        {"progressed": False, "newest_step": 20},
    ),
    "a-new-attempt-has-not-progressed": (
        [attempt_started(), commit(5), failed("crash"), restarted(), attempt_started(resume=6)],
        {"progressed": False, "no_progress_streak": 0, "attempts": 2},
    ),
    "oom-count": (
        [
            attempt_started(),
            failed("oom"),
            restarted(),
            attempt_started(),
            failed("crash"),
            restarted(),
            attempt_started(),
            failed("oom", (0,), 7),
        ],
        {"oom_count": 2, "last_failure": "oom", "failure": ("oom", (0,), 7)},
    ),
    "signature-carried-across-a-new-start": (
        [
            *crash_loop(1),
            attempt_started(),
            failed("preempted", (), 35),
            stopped(),
            job_started(),
            attempt_started(),
        ],
        {"charged_failure": CRASH_30, "restarts_used": 1, "no_progress_streak": 1},
    ),
    "attempts-continue-across-a-new-start": (
        [*crash_loop(2), attempt_started(), stopped(), job_started(), attempt_started()],
        {"attempts": 4},
    ),
    "the-last-charged-failure-not-the-last-failure": (
        [*crash_loop(1), attempt_started(), failed("crash", (0,), 80), JobGaveUp(reason="spent")],
        {"charged_failure": CRASH_30, "failure": ("crash", (0,), 80)},
    ),
    "a-new-start-ends-the-attempt": (
        [attempt_started(), commit(3), job_started()],
        {"progressed": False, "newest_step": 3, "attempts": 1},
    ),
    "success-changes-nothing": (
        [attempt_started(), JobSucceeded(last_step=9)],
        {"attempts": 1, "restarts_used": 0, "failure": None},
    ),
    "failures-count-per-attributed-node-once-each": (
        [
            on_nodes("crash", "n2"),
            on_nodes("oom", "n1", "n2", "n2"),
            on_nodes("hang"),
            job_started(),
            on_nodes("node_failure", "n3"),
        ],
        {"node_failures": {"n2": 2, "n1": 1, "n3": 1}},
    ),
    "exclusions-carry-over-starts-first-reason-kept": (
        [
            NodeExcluded(node="n2", reason="2 failures attributed to it", failures=2),
            job_started(),
            NodeExcluded(node="n2", reason="again", failures=3),
            NodeExcluded(node="n1", reason="failed its health check: memory", failures=0),
        ],
        {
            "excluded": {
                "n2": "2 failures attributed to it",
                "n1": "failed its health check: memory",
            }
        },
    ),
}


@pytest.mark.parametrize(("events", "expected"), FOLDS.values(), ids=list(FOLDS))
def test_fold(events: list[Event], expected: dict[str, Any]) -> None:
    """Folding each sequence of events gives the documented budget."""
    budget = budget_of(events)
    assert {name: getattr(budget, name) for name in expected} == expected


def test_fold_is_one_event_at_a_time() -> None:
    """budget_of() is fold() one event at a time; an ignored event returns the same budget."""
    events = [*crash_loop(2), attempt_started(), commit(4)]
    budget = Budget()
    for event in events:
        budget = fold(budget, event)
    assert budget == budget_of(events)
    assert fold(budget, StopRequested(reason="stopped", source="x")) is budget


def test_signature_matches_the_rules() -> None:
    """A failure_detected's signature equals deterministic_signature() of its failure."""
    f = Failure(K.OOM, (3, 0), (137,), ("SIGKILL",), None, "oom", ("n1",))
    assert signature_of(failure_event(f)) == deterministic_signature(f)


# ---------------------------------------------------------------- during the run == at start-up

POLICY = RestartPolicy(max_restarts=6, backoff_s=0.0, backoff_max_s=0.0, max_no_progress=3)
KINDS = (K.CRASH, K.CRASH, K.OOM, K.HANG, K.PREEMPTED, K.TIMELIMIT, K.STOPPED)


class Daemon:
    """A stand-in for the supervisor: every event it logs is folded into its budget."""

    def __init__(self, run_dir: Path, rng: random.Random) -> None:
        self.rng = rng
        self.budget = budget_of(read(run_dir / "events.jsonl").events)  # start-up: the file
        self.log = EventLog(run_dir, "toy", console=None, on_log=self._fold)

    def _fold(self, event: Event) -> None:
        self.budget = fold(self.budget, event)  # the run: each event as it is logged

    def emit(self, event: Event) -> None:
        self.log.log(event)

    def run(self) -> str:
        """Attempts until the job ends or this daemon stops: ``"ended"`` / ``"stopped"``."""
        try:
            self.emit(job_started())
            while True:
                self.log.attempt = self.budget.attempts + 1
                newest = self.budget.newest_step
                self.emit(attempt_started(resume=0 if newest is None else newest + 1))
                assert self.budget.attempts == self.log.attempt
                outcome = self._one_attempt(0 if newest is None else newest + 1)
                if outcome is not None:
                    return outcome
        finally:
            self.log.close()

    def _one_attempt(self, step: int) -> str | None:
        for _ in range(self.rng.randint(0, 2)):
            step += self.rng.choice((0, 5))
            self.emit(commit(step))
        if self.rng.random() < 0.05:
            self.emit(JobSucceeded(last_step=step))
            return "ended"
        if self.rng.random() < 0.05:
            return "stopped"  # the daemon was killed mid-attempt: no end logged
        kind = self.rng.choice(KINDS)
        f = Failure(kind, (self.rng.randint(0, 1),), (), (), step + self.rng.randint(0, 1), "d")
        self.emit(failure_event(f))
        decision = decide(self.budget, f, POLICY, jitter=self.rng.random())
        if isinstance(decision, Restart):
            self.emit(
                RestartScheduled(
                    backoff_s=decision.after_s,
                    restarts_left=decision.restarts_left,
                    charged=decision.charged,
                    deterministic=decision.deterministic,
                    note=decision.note,
                )
            )
            return None
        if isinstance(decision, GiveUp):
            self.emit(JobGaveUp(reason=decision.reason))
            return "ended"
        assert isinstance(decision, Requeue)
        self.emit(JobStopped(reason=decision.reason, requeued=True, step=None, note=""))
        return "stopped"


@pytest.mark.parametrize("seed", range(40))
def test_folding_during_the_run_equals_folding_the_file(tmp_path: Path, seed: int) -> None:
    """Across daemons (requeues, a kill), the budget folded from the file equals the one run live."""
    rng = random.Random(seed)
    live: Budget | None = None
    for _ in range(6):
        daemon = Daemon(tmp_path, rng)
        if live is not None:
            assert daemon.budget == live
        outcome = daemon.run()
        live = daemon.budget
        if outcome == "ended":
            break
    assert live is not None
    history = read(tmp_path / "events.jsonl")
    assert budget_of(history.events) == live
    numbers = [e.attempt for e in history.entries if isinstance(e.event, AttemptStarted)]
    assert numbers == list(range(1, live.attempts + 1))


def test_a_rollback_moves_the_skip_and_bounds_only_the_next_load() -> None:
    """rolled_back: one rollback used, the skip kept for every later attempt, the load bound
    (resume_before) only until the next attempt starts; no restart charged."""
    rolled = RolledBack(
        from_step=25,
        to_step=19,
        resume_step=26,
        skipped_steps=6,
        onset=25,
        discarded=(29,),
        rollbacks_left=2,
        note="",
    )
    b = budget_of([job_started(), attempt_started(0), rolled])
    assert (b.rollbacks_used, b.skip_to, b.resume_before, b.newest_step) == (1, 26, 25, 19)
    assert b.restarts_used == 0
    b = fold(b, attempt_started(26))
    assert (b.rollbacks_used, b.skip_to, b.resume_before) == (1, 26, None)
