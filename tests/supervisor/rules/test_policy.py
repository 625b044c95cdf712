"""decide() over the Budget, backoff_s(): budget, progress, OOM/node rules, determinism."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

import pytest

from supervisor.record.schema import Event, JobStarted, JobStopped, RestartScheduled
from supervisor.rules.budget import Budget, budget_of, fold
from supervisor.rules.failures import deterministic_signature
from supervisor.rules.observation import Failure, FailureKind, StopReason
from supervisor.rules.policy import (
    Decision,
    GiveUp,
    Requeue,
    Restart,
    RestartPolicy,
    backoff_s,
    decide,
    nodes_for_restart,
)
from tests.helpers.events import attempt_started, commit, failure_event
from worker_sdk.contract.protocol import EXIT_USAGE

K = FailureKind
POLICY = RestartPolicy(max_restarts=5, backoff_s=5.0, backoff_max_s=300.0, max_no_progress=2)


def failure(kind: FailureKind, ranks: tuple[int, ...] = (1,), step: int | None = 30) -> Failure:
    return Failure(kind, ranks, (), (), step, f"{kind} of rank(s) {ranks} at step {step}")


def policy(**changes: Any) -> RestartPolicy:
    return dataclasses.replace(POLICY, **changes)


CRASH_30 = failure(K.CRASH)


@dataclass(frozen=True)
class Case:
    budget: Budget
    failure: Failure
    expected: Decision
    policy: RestartPolicy = POLICY
    progressed: bool = True
    jitter: float = 0.0


def restart(
    n_used: int, *, in_a_row: int = 0, max_restarts: int = 5, kind: str = "crash"
) -> Restart:
    """The Restart that decide() gives with POLICY, jitter 0, n_used restarts used, in_a_row of
    them in a row after attempts without progress (0 after one that progressed), no repeat."""
    delay = 0.0 if in_a_row == 0 else min(300.0, 5.0 * 2 ** (in_a_row - 1)) / 2
    note = f"restart {n_used + 1} of {max_restarts} in {delay:.1f}s after {kind}"
    return Restart(delay, True, max_restarts - n_used - 1, False, note)


SPENT = Budget(restarts_used=5, no_progress_streak=1)
USAGE_CRASH = Failure(
    K.CRASH,
    (0,),
    (EXIT_USAGE,),
    (),
    None,
    "rank 0 exited with code 87 (the script called worker_sdk wrongly): call "
    "init_process_group() first",
)
CASES = {
    "preempted-uncharged-even-when-spent": Case(
        SPENT, failure(K.PREEMPTED), Requeue(StopReason.PREEMPTED)
    ),
    "timelimit-requeues": Case(SPENT, failure(K.TIMELIMIT), Requeue(StopReason.TIMELIMIT)),
    "stopped-requeues": Case(
        Budget(), failure(K.STOPPED), Requeue(StopReason.STOPPED), progressed=False
    ),
    "crash-first-restart": Case(Budget(), CRASH_30, restart(0)),
    "hang-restarts": Case(Budget(restarts_used=2), failure(K.HANG), restart(2, kind="hang")),
    "oom-restart": Case(Budget(), failure(K.OOM), restart(0, kind="oom")),
    "oom-fail": Case(
        Budget(),
        failure(K.OOM),
        GiveUp('out of memory and restart.on_oom = "fail"'),
        policy=policy(on_oom="fail"),
    ),
    "oom-fail-ignores-crash": Case(Budget(), CRASH_30, restart(0), policy=policy(on_oom="fail")),
    "node-failure-restart": Case(
        Budget(), failure(K.NODE_FAILURE), restart(0, kind="node_failure")
    ),
    "node-failure-fail": Case(
        Budget(),
        failure(K.NODE_FAILURE),
        GiveUp('node failure and restart.on_node_failure = "fail"'),
        policy=policy(on_node_failure="fail"),
    ),
    "last-restart-of-budget": Case(Budget(restarts_used=4), CRASH_30, restart(4)),
    "budget-spent": Case(
        Budget(restarts_used=5), CRASH_30, GiveUp("restart budget spent: 5 of 5 restarts used")
    ),
    "budget-checked-before-progress": Case(
        SPENT,
        CRASH_30,
        GiveUp("restart budget spent: 5 of 5 restarts used"),
        progressed=False,
    ),
    "zero-budget": Case(
        Budget(),
        CRASH_30,
        GiveUp("restart budget spent: 0 of 0 restarts used"),
        policy=policy(max_restarts=0),
    ),
    "no-progress-first-time": Case(Budget(), CRASH_30, restart(0), progressed=False),
    "no-progress-second-time": Case(
        Budget(restarts_used=1, no_progress_streak=1),
        CRASH_30,
        GiveUp("no progress: 2 restarts in a row without a new checkpoint"),
        progressed=False,
    ),
    "streak-but-progressed": Case(
        Budget(restarts_used=1, no_progress_streak=1), CRASH_30, restart(1), progressed=True
    ),
    "max-no-progress-one": Case(
        Budget(),
        CRASH_30,
        GiveUp("no progress: 1 restart in a row without a new checkpoint"),
        policy=policy(max_no_progress=1),
        progressed=False,
    ),
    "usage-error-gives-up-at-once": Case(
        Budget(),
        USAGE_CRASH,
        GiveUp(
            "the training script must be changed, no restart can help: rank 0 exited with "
            "code 87 (the script called worker_sdk wrongly): call init_process_group() first"
        ),
    ),
    "jitter-stretches-delay": Case(
        Budget(restarts_used=3, no_progress_streak=3),
        CRASH_30,
        Restart(15.0, True, 1, False, "restart 4 of 5 in 15.0s after crash"),
        policy=policy(max_no_progress=9),
        progressed=False,
        jitter=0.5,
    ),
    "progress-restarts-at-once-however-many-were-used": Case(
        Budget(restarts_used=7, no_progress_streak=0),
        CRASH_30,
        restart(7, max_restarts=10),
        policy=policy(max_restarts=10),
    ),
    "progress-ends-a-streak-of-waits": Case(
        Budget(restarts_used=3, no_progress_streak=2), CRASH_30, restart(3), progressed=True
    ),
    "restarts-in-a-row-without-progress-wait-longer": Case(
        Budget(restarts_used=3, no_progress_streak=2),
        CRASH_30,
        restart(3, in_a_row=2),
        policy=policy(max_no_progress=9),
        progressed=False,
    ),
    "deterministic-first-restart-waits": Case(
        Budget(charged_failure=deterministic_signature(CRASH_30)),
        CRASH_30,
        Restart(
            2.5,
            True,
            4,
            True,
            "restart 1 of 5 in 2.5s after crash; deterministic: rank 1 fails at step 30 every time",
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_decide(case: Case) -> None:
    """decide() follows the documented rules for each budget, failure and policy."""
    budget = replace(case.budget, progressed=case.progressed)
    got = decide(budget, case.failure, case.policy, jitter=case.jitter)
    assert got == case.expected


# the shipped defaults: the first restart at once, then 5 s doubled, capped at 300
D = [0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0, 300.0]


@pytest.mark.parametrize("n", range(11))
@pytest.mark.parametrize("jitter", [0.0, 0.999])
def test_backoff_values(n: int, jitter: float) -> None:
    """The first restart waits first_backoff (0), the second backoff, doubled per restart used
    after it, capped; the delay lies in [d/2, d) with d the capped value."""
    expected = {0.0: D[n] / 2, 0.999: D[n] * 0.9995}[jitter]
    assert backoff_s(n, POLICY, jitter) == pytest.approx(expected)


def test_backoff_literal_values() -> None:
    """A few hand-computed delays, so that the table above is not only the formula again."""
    assert backoff_s(0, POLICY, 0.999) == 0.0
    assert backoff_s(1, POLICY, 0.0) == 2.5
    assert backoff_s(4, POLICY, 0.0) == 20.0
    assert backoff_s(7, POLICY, 0.0) == 150.0
    assert backoff_s(10, POLICY, 0.999) == pytest.approx(299.85)


@pytest.mark.parametrize(
    ("n", "first", "deterministic", "jitter", "expected"),
    [
        (0, 0.0, False, 0.5, 0.0),  # the default: the first restart at once
        (0, 0.0, True, 0.0, 2.5),  # the same failure again: backoff, never at once
        (0, 5.0, False, 0.0, 2.5),  # first_backoff = backoff: the schedule before it existed
        (1, 5.0, False, 0.0, 2.5),  # ...its second restart waits backoff
        (0, 2.0, False, 0.999, 1.999),  # first_backoff with its jitter
        (1, 2.0, False, 0.0, 2.5),  # the second restart does not depend on first_backoff
        (2, 0.0, True, 0.0, 5.0),  # deterministic or not, from the second on the same
    ],
)
def test_backoff_first_restart(
    n: int, first: float, deterministic: bool, jitter: float, expected: float
) -> None:
    """The job's first charged restart waits first_backoff unless the failure is
    deterministic; every later one follows backoff."""
    p = policy(first_backoff_s=first)
    assert backoff_s(n, p, jitter, deterministic=deterministic) == pytest.approx(expected)


def test_backoff_huge_n_is_capped_without_overflow() -> None:
    """A job with an absurd restart count still gets the capped delay, not an OverflowError."""
    assert backoff_s(10_000, POLICY, 0.0) == 150.0
    assert backoff_s(64, POLICY, 0.0) == 150.0 and backoff_s(65, POLICY, 0.0) == 150.0


@pytest.mark.parametrize(("n", "jitter"), [(-1, 0.0), (0, 1.0), (0, -0.1)])
def test_backoff_rejects_bad_arguments(n: int, jitter: float) -> None:
    """A negative count or a jitter outside [0, 1) is a caller bug."""
    with pytest.raises(ValueError, match="must be"):
        backoff_s(n, POLICY, jitter)


# ---------------------------------------------------------------- deterministic failures


def charged(f: Failure) -> tuple[str, tuple[int, ...], int | None]:
    return deterministic_signature(f)


DETERMINISM = {
    "same-crash-again": (Budget(charged_failure=charged(CRASH_30)), CRASH_30, True),
    "same-oom-again": (Budget(charged_failure=charged(failure(K.OOM))), failure(K.OOM), True),
    "other-step": (Budget(charged_failure=charged(CRASH_30)), failure(K.CRASH, step=31), False),
    "other-rank": (Budget(charged_failure=charged(CRASH_30)), failure(K.CRASH, ranks=(0,)), False),
    "other-kind": (Budget(charged_failure=charged(CRASH_30)), failure(K.OOM), False),
    "same-hang-is-not-deterministic": (
        Budget(charged_failure=charged(failure(K.HANG))),
        failure(K.HANG),
        False,
    ),
    "the-newest-failure-does-not-count-uncharged": (
        Budget(failure=charged(CRASH_30), charged_failure=None),
        CRASH_30,
        False,
    ),
    "first-failure": (Budget(), CRASH_30, False),
}


@pytest.mark.parametrize(("budget", "now", "expected"), DETERMINISM.values(), ids=list(DETERMINISM))
def test_deterministic_detection(budget: Budget, now: Failure, expected: bool) -> None:
    """A crash/OOM with the last charged failure's kind, ranks and step is flagged."""
    got = decide(replace(budget, progressed=True), now, POLICY, jitter=0.0)
    assert isinstance(got, Restart)
    assert got.deterministic is expected
    assert ("deterministic:" in got.note) is expected


def test_deterministic_note_wording() -> None:
    """The note names the rank and the step the failure repeats at."""
    budget = Budget(charged_failure=charged(CRASH_30), progressed=True)
    got = decide(budget, CRASH_30, POLICY, jitter=0.0)
    assert isinstance(got, Restart)
    assert got.note.endswith("; deterministic: rank 1 fails at step 30 every time")


def test_deterministic_give_up_reason() -> None:
    """When the job gives up on a repeating failure, the reason says it is deterministic."""
    budget = Budget(restarts_used=5, charged_failure=charged(CRASH_30), progressed=True)
    got = decide(budget, CRASH_30, POLICY, jitter=0.0)
    assert got == GiveUp(
        "restart budget spent: 5 of 5 restarts used "
        "(deterministic: rank 1 fails at step 30 every time)"
    )


# ---------------------------------------------------------------- decide() fed its own history


def logged(budget: Budget, *events: Event) -> Budget:
    for event in events:
        budget = fold(budget, event)
    return budget


def attempt_events(f: Failure, *, progressed: bool, step: int) -> list[Event]:
    """An attempt as logged up to its failure (a new checkpoint at ``step`` if it progressed)."""
    return [attempt_started(), *([commit(step)] if progressed else []), failure_event(f)]


def restart_event(decision: Restart) -> RestartScheduled:
    return RestartScheduled(
        backoff_s=decision.after_s,
        restarts_left=decision.restarts_left,
        charged=decision.charged,
        deterministic=decision.deterministic,
        note=decision.note,
    )


@pytest.mark.parametrize(
    ("progress_each_time", "max_no_progress", "attempts_before_giving_up", "reason"),
    [
        (False, 2, 2, "no progress: 2 restarts in a row without a new checkpoint"),
        (False, 3, 3, "no progress: 3 restarts in a row without a new checkpoint"),
        (True, 2, 6, "restart budget spent: 5 of 5 restarts used"),
    ],
)
def test_a_crash_loop_ends(
    progress_each_time: bool, max_no_progress: int, attempts_before_giving_up: int, reason: str
) -> None:
    """decide() fed the budget folded from its own events gives up at the right attempt."""
    rules = policy(max_no_progress=max_no_progress)
    budget = Budget()
    for attempt in range(1, 20):
        crash = failure(K.CRASH, step=attempt * 10)
        events = attempt_events(crash, progressed=progress_each_time, step=attempt * 10)
        budget = logged(budget, *events)
        decision = decide(budget, crash, rules, jitter=0.3)
        if isinstance(decision, GiveUp):
            assert attempt == attempts_before_giving_up
            assert decision.reason.startswith(reason)
            return
        assert isinstance(decision, Restart)
        budget = logged(budget, restart_event(decision))
    pytest.fail("never gave up")


def test_preemptions_never_spend_the_budget() -> None:
    """Any number of preemptions leaves every restart of the budget available."""
    budget = Budget()
    for _ in range(50):
        stop = failure(K.PREEMPTED, ranks=())
        budget = logged(budget, *attempt_events(stop, progressed=False, step=0))
        assert decide(budget, stop, POLICY, jitter=0.0) == Requeue(StopReason.PREEMPTED)
        budget = logged(budget, JobStopped(reason="preempted", requeued=True, step=None, note=""))
    assert (budget.restarts_used, budget.no_progress_streak) == (0, 0)
    assert isinstance(decide(budget, CRASH_30, POLICY, jitter=0.0), Restart)


def test_deterministic_across_a_requeue() -> None:
    """The same crash before and after a requeue (a new rvsup start) is called deterministic."""
    before = budget_of(attempt_events(CRASH_30, progressed=False, step=0))
    first = decide(before, CRASH_30, POLICY, jitter=0.0)
    assert isinstance(first, Restart) and not first.deterministic
    preempted = failure(K.PREEMPTED, ranks=(), step=31)
    history = [
        *attempt_events(CRASH_30, progressed=False, step=0),
        restart_event(first),
        *attempt_events(preempted, progressed=False, step=0),
        JobStopped(reason="preempted", requeued=True, step=None, note=""),
        JobStarted(config="j", host="h", pid=2, slurm_job_id="9", restart_count=1, restarts_used=1),
        *attempt_events(CRASH_30, progressed=False, step=0),
    ]
    again = decide(budget_of(history), CRASH_30, policy(max_no_progress=99), jitter=0.0)
    assert isinstance(again, Restart) and again.deterministic
    again = decide(budget_of(history), CRASH_30, POLICY, jitter=0.0)
    assert again == GiveUp(
        "no progress: 2 restarts in a row without a new checkpoint "
        "(deterministic: rank 1 fails at step 30 every time)"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"on_oom": "maybe"},
        {"on_node_failure": "retry"},
        {"max_restarts": -1},
        {"backoff_s": -1.0},
        {"max_no_progress": 0},  # documented >= 1, as the config requires: 0 does not disable
    ],
)
def test_policy_rejects_nonsense(changes: dict[str, object]) -> None:
    """A RestartPolicy with an impossible value cannot be built."""
    with pytest.raises(ValueError, match="must be"):
        policy(**changes)


@pytest.mark.parametrize(
    ("kind", "nodes", "gives_up"),
    [
        (K.NODE_FAILURE, (1, 2), True),  # one node left, the job runs on at least two
        (K.NODE_FAILURE, (0, 2), True),
        (K.NODE_FAILURE, (2, 2), False),  # a spare node took the lost one's place
        (K.NODE_FAILURE, (1, 1), False),  # min_nnodes = 1: go on with the node left
        (K.NODE_FAILURE, (0, 1), True),
        (K.NODE_FAILURE, None, False),  # not on Slurm: nothing to count
        (K.CRASH, (1, 2), False),  # only a node failure is judged by the nodes left
    ],
)
def test_node_failure_without_enough_nodes_gives_up(
    kind: FailureKind, nodes: tuple[int, int] | None, gives_up: bool
) -> None:
    """A node failure restarts only with at least the job's minimum of nodes left (``nodes``:
    left, minimum), else gives up."""
    got = decide(Budget(progressed=True), failure(kind), POLICY, jitter=0.0, nodes=nodes)
    assert isinstance(got, GiveUp) == gives_up
    if gives_up:
        assert isinstance(got, GiveUp) and "left in this allocation" in got.reason


@pytest.mark.parametrize(
    ("lost", "needed", "expected"),
    [
        ((), 2, ("n1", "n2")),
        (("n2",), 2, ("n1", "n3")),
        (("n1", "n3"), 2, ("n2",)),
        (("n2",), 3, ("n1", "n3")),
        (("elsewhere",), 1, ("n1",)),
    ],
)
def test_nodes_for_restart(lost: tuple[str, ...], needed: int, expected: tuple[str, ...]) -> None:
    """The first `needed` nodes not lost, in allocation order; fewer when not enough are left."""
    assert nodes_for_restart(("n1", "n2", "n3"), lost, needed) == expected
