"""The loss rules and the rollback decision (supervisor/rules/anomalies.py), as tables."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from supervisor.rules.anomalies import (
    AnomalyPolicy,
    LossWatch,
    Rollback,
    RollbackRefused,
    baseline,
    decide_rollback,
)
from supervisor.rules.budget import Budget
from supervisor.rules.failures import classify
from supervisor.rules.observation import Anomaly, FailureKind, Observation

POLICY = AnomalyPolicy(spike_factor=10.0, window=20, patience=3, skip_steps=1, max_rollbacks=2)


def _feed(
    watch: LossWatch, values: list[float], *, rank: int = 0, every: int = 10
) -> list[Anomaly]:
    found = []
    for i, v in enumerate(values):
        a = watch.observe(rank, (i + 1) * every, v)
        if a is not None:
            found.append(a)
    return found


def test_baseline_is_median_plus_factor_mads() -> None:
    """The threshold is the median plus factor times the MAD, with a floor for a flat loss."""
    assert baseline([1.0, 2.0, 3.0, 4.0, 100.0], 10.0) == (3.0, 13.0)
    median, threshold = baseline([2.0] * 8, 10.0)
    assert median == 2.0 and threshold == pytest.approx(2.02)


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        # (values after 20 ordinary ones around 2.0, (step seen, onset) or None)
        ([50.0, 50.0, 50.0], (230, 201)),  # patience 3: the third high value, onset after 200
        ([50.0, 50.0, 2.0, 50.0, 50.0], None),  # a normal value breaks the streak
        ([50.0, 2.0] * 5, None),  # isolated outliers never make a spike
        ([2.3, 2.4, 2.2], None),  # ordinary noise
        ([float("nan")], (210, 201)),  # a NaN in a heartbeat: onset after the last good one
        ([float("inf")], (210, 201)),
    ],
)
def test_spike_and_nonfinite_table(tail: list[float], expected: tuple[int, int] | None) -> None:
    """A spike needs `patience` high values in a row; its onset follows the last normal one."""
    rng = random.Random(0)
    watch = LossWatch(POLICY)
    assert _feed(watch, [2.0 + rng.uniform(-0.1, 0.1) for _ in range(20)]) == []
    found = []
    for i, v in enumerate(tail):
        a = watch.observe(0, 210 + 10 * i, v)
        if a is not None:
            found.append(a)
    if expected is None:
        assert found == []
    else:
        assert [(a.step, a.onset) for a in found] == [expected]
        kind = FailureKind.LOSS_SPIKE if math.isfinite(tail[-1]) else FailureKind.NONFINITE_LOSS
        assert found[0].kind is kind


def test_nothing_judged_before_enough_values() -> None:
    """A rank's first values only build its baseline (a falling loss starts high)."""
    watch = LossWatch(POLICY)
    assert _feed(watch, [100.0, 90.0, 80.0, 1000.0, 1000.0, 1000.0]) == []


def test_ranks_have_their_own_baselines() -> None:
    """Rank 1's loss is judged against rank 1's values, not rank 0's."""
    watch = LossWatch(POLICY)
    _feed(watch, [2.0 + 0.01 * (i % 3) for i in range(20)], rank=0)
    assert _feed(watch, [500.0 + (i % 3) for i in range(20)], rank=1) == []


def test_baseline_outlives_a_rollback() -> None:
    """After a rollback a loss that is still high is caught, with the new attempt's first
    step as its onset (the rule that calls it deterministic needs that)."""
    watch = LossWatch(POLICY)
    _feed(watch, [2.0 + 0.01 * (i % 3) for i in range(20)])
    watch.begin_attempt(231)
    found = [watch.observe(0, s, 80.0) for s in (240, 250, 260)]
    assert found[:2] == [None, None]
    assert found[2] is not None and found[2].onset == 231


def test_nonfinite_onset_never_before_the_attempt() -> None:
    """A non-finite loss is dated at the step the rank names, never before the attempt began."""
    watch = LossWatch(POLICY)
    watch.begin_attempt(50)
    assert watch.nonfinite(0, 57, 57, math.nan).onset == 57
    assert watch.nonfinite(1, 57, 40, math.inf).onset == 50


def test_onset_dated_from_where_the_ranks_actually_resumed() -> None:
    """The attempt planned to resume at 27, but that checkpoint proved damaged and the ranks
    resumed at 20: a NaN at step 22 has its onset at 22 (dated from the planned start, its
    onset would be 27, and the checkpoints of steps 22..26 would be trusted)."""
    watch = LossWatch(POLICY)
    watch.begin_attempt(27)
    watch.resumed_at(20)
    assert watch.nonfinite(1, 22, 22, math.nan).onset == 22
    assert watch.nonfinite(1, 22, 15, math.nan).onset == 20


def _realistic_curve(seed: int, steps: int = 6000) -> list[float]:
    """A language-model-like loss: a fast fall, a slow tail, a warmup bump, per-batch noise
    (lognormal, 8 %) and a heavier batch now and then (1.6x, 1 % of the batches)."""
    rng = random.Random(seed)
    out = []
    for s in range(steps):
        mean = 2.8 + 8.0 * math.exp(-s / 250) + 0.4 * math.exp(-(((s - 60) / 30) ** 2))
        value = mean * math.exp(rng.gauss(0.0, 0.08))
        if rng.random() < 0.01:
            value *= 1.6
        out.append(value)
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("every", [1, 7, 25])
def test_defaults_never_fire_on_a_realistic_curve(seed: int, every: int) -> None:
    """The default policy reports nothing over a whole noisy run, at any heartbeat spacing."""
    watch = LossWatch(AnomalyPolicy())
    curve = _realistic_curve(seed)
    assert [watch.observe(0, s, curve[s]) for s in range(0, len(curve), every)] == [None] * len(
        range(0, len(curve), every)
    )


def test_defaults_catch_a_scaled_loss() -> None:
    """The same curve with the loss scaled 50x from step 3000 is caught after patience."""
    watch = LossWatch(AnomalyPolicy())
    curve = _realistic_curve(0)
    found = None
    for s in range(0, len(curve), 25):
        found = watch.observe(0, s, curve[s] * (50.0 if s >= 3000 else 1.0))
        if found is not None:
            break
    assert found is not None and found.kind is FailureKind.LOSS_SPIKE
    assert (found.step, found.onset) == (3050, 2976)


def _anomaly(step: int, onset: int) -> Anomaly:
    return Anomaly(FailureKind.NONFINITE_LOSS, 1, step, onset, math.nan)


@pytest.mark.parametrize(
    ("budget", "anomaly", "checkpoints", "expected"),
    [
        # poisoned batch at 57, checkpoints every 20: back to 39, on at 58 (18 steps skipped)
        (Budget(), _anomaly(57, 57), [59, 39, 19], Rollback(39, 58, 18, 57, "")),
        # a tensor loss read at heartbeat 64, finite at 50: back to 39, on at 65
        (Budget(), _anomaly(64, 51), [59, 39], Rollback(39, 65, 25, 51, "")),
        # no checkpoint before the onset ever: back to the start
        (Budget(), _anomaly(5, 5), [9], Rollback(None, 6, 6, 5, "")),
        # the one before the onset was pruned (only 59 left, 39 committed): give up, naming it
        (Budget(), _anomaly(57, 57), [59], "step 39 was removed"),
        # came back right where the last rollback resumed: deterministic
        (Budget(rollbacks_used=1, skip_to=58), _anomaly(58, 58), [39], "deterministic"),
        # another place after a rollback: rolled back again
        (
            Budget(rollbacks_used=1, skip_to=58),
            _anomaly(90, 90),
            [79],
            Rollback(79, 91, 11, 90, ""),
        ),
        # the budget is spent
        (Budget(rollbacks_used=2, skip_to=58), _anomaly(90, 90), [79], "budget spent"),
    ],
)
def test_rollback_table(
    budget: Budget, anomaly: Anomaly, checkpoints: list[int], expected: Rollback | str
) -> None:
    """Where a rollback goes, how far it skips, and when the job gives up instead (every
    checkpoint ever committed was 19, 39, 59 and 79)."""
    decision = decide_rollback(budget, anomaly, POLICY, checkpoints, [19, 39, 59, 79])
    if isinstance(expected, str):
        assert isinstance(decision, RollbackRefused) and expected in decision.reason
        return
    assert isinstance(decision, Rollback)
    assert (decision.restore_step, decision.resume_step, decision.skipped_steps) == (
        expected.restore_step,
        expected.resume_step,
        expected.skipped_steps,
    )
    assert decision.discard_from == expected.discard_from


def test_skip_steps_widens_the_skip() -> None:
    """`skip_steps` moves the resume point past the onset by at least that many steps."""
    policy = AnomalyPolicy(skip_steps=50)
    decision = decide_rollback(Budget(), _anomaly(57, 57), policy, [39])
    assert isinstance(decision, Rollback) and decision.resume_step == 107
    again = decide_rollback(Budget(rollbacks_used=1, skip_to=107), _anomaly(150, 150), policy, [])
    assert isinstance(again, RollbackRefused)  # within 50 steps of the skip: the same place


def test_diverged_replicas_are_an_anomaly_naming_every_rank() -> None:
    """The ranks that differ become the failure's ranks; the onset follows the last agreement."""
    watch = LossWatch(POLICY)
    watch.begin_attempt(0)
    anomaly = watch.diverged((1, 3), 29, 20)
    assert (anomaly.kind, anomaly.rank, anomaly.others, anomaly.onset) == (
        FailureKind.REPLICAS_DIVERGED,
        1,
        (3,),
        20,
    )
    failure = classify(Observation(anomaly=anomaly, last_steps={0: 29, 1: 29}))
    assert failure.kind is FailureKind.REPLICAS_DIVERGED and failure.ranks == (1, 3)
    assert "rank(s) 1, 3" in failure.detail and "step 29" in failure.detail


def _watch(policy: AnomalyPolicy, first_step: int = 0) -> LossWatch:
    watch = LossWatch(policy)
    watch.begin_attempt(first_step)
    return watch


@pytest.mark.parametrize(
    ("verify", "reports", "expected"),
    [
        # (verify_every_steps, (rank, step, loss or None) heartbeats, earliest onset)
        (0, [], None),  # no loss ever and no replica check: nothing to protect
        (0, [(0, 40, None), (1, 40, None)], None),
        (10, [(0, 40, None), (1, 40, None)], 31),  # the check before step 40 agreed
        (10, [(0, 40, None)], 0),  # rank 1 not heard yet: the attempt's first step
        (0, [(0, 40, 2.0), (1, 40, 2.0)], 41),  # after the last normal loss
        (0, [(0, 40, 2.0), (1, 40, 2.0), (1, 50, 50.0), (1, 60, 50.0)], 41),  # high streak
        (0, [(0, 40, 2.0), (1, 40, 2.0), (1, 50, 50.0), (1, 60, 2.0), (0, 60, 2.0)], 61),
        (10, [(0, 40, 2.0), (1, 40, 2.0)], 31),
    ],
)
def test_earliest_onset_table(
    verify: int, reports: list[tuple[int, int, float | None]], expected: int | None
) -> None:
    """The earliest step an anomaly not yet found may start at (pruning keeps the checkpoint
    before it): the step after the last normal loss, held by a high streak, and the replica
    check's reach back."""
    watch = _watch(AnomalyPolicy(window=10, verify_every_steps=verify))
    if any(loss is not None for *_, loss in reports):  # a baseline of 2.0 before step 40
        for rank in (0, 1):
            for i in range(10):
                watch.observe(rank, 20 + i, 2.0)
    for rank, step, loss in reports:
        watch.heard(rank, step)
        if loss is not None:
            assert watch.observe(rank, step, loss) is None
    assert watch.earliest_onset(2) == expected


def test_earliest_onset_holds_at_a_found_anomaly_and_restarts_with_the_attempt() -> None:
    """Once an anomaly is found the protection stays at its onset; a new attempt starts from
    its first step until its ranks report."""
    watch = _watch(POLICY)
    for i in range(20):
        watch.heard(0, i)
        watch.observe(0, i, 2.0)
    found = watch.nonfinite(0, 25, 12, math.nan)
    assert watch.earliest_onset(1, found) == 12
    watch.begin_attempt(30)
    assert watch.earliest_onset(1) == 30


def _plain_rule(policy: AnomalyPolicy, losses: list[float]) -> list[int]:
    """The rule as the module docstring states it, computed afresh for every value: the steps
    at which a spike is found."""
    accepted: list[float] = []
    high = 0
    found = []
    for step, value in enumerate(losses):
        window = accepted[-policy.window :]
        if len(window) >= max(4, min(policy.window, 10)):
            _, threshold = baseline(window, policy.spike_factor)
            if value > threshold:
                high += 1
                if high >= policy.patience:
                    found.append(step)
                continue
        high = 0
        accepted.append(value)
    return found


@given(
    st.lists(
        st.one_of(  # flat runs with small steps up (a spread near its floor), and noise
            st.sampled_from([1.0, 1.0, 1.01, 0.99, 1.005, 1.02, 1.2, 1.5, 40.0, -1.0]),
            st.floats(0.5, 2.0),
            st.floats(-3.0, 3.0),
        ),
        min_size=1,
        max_size=120,
    ),
    st.sampled_from([(10.0, 50, 3), (2.0, 8, 1), (10.0, 4, 2)]),
)
@example([1.0] * 10 + [1.02], (2.0, 8, 1))  # flat: a spike just above the floor
@example([1.0, 1.01] * 6 + [1.2] * 3, (10.0, 50, 3))
@example([1.0] * 12 + [1.009, 1.011], (1.0, 8, 1))  # at either side of median x (1 + floor)
@settings(max_examples=300, deadline=None)
def test_the_watch_finds_the_spikes_the_plain_rule_finds(
    losses: list[float], knobs: tuple[float, int, int]
) -> None:
    """The watch keeps each rank's window sorted and skips the spread for a value surely
    below the threshold: it finds exactly the spikes of the rule computed afresh each time."""
    factor, window, patience = knobs
    policy = AnomalyPolicy(spike_factor=factor, window=window, patience=patience)
    watch = LossWatch(policy)
    found = [s for s, v in enumerate(losses) if watch.observe(0, s, v) is not None]
    assert found == _plain_rule(policy, losses)
