"""The rank table at scale (supervisor/ranks/rank_table.py) and the silence check's bound on
the oldest progress (supervisor/ranks/silence.py): what stays exact when thousands of ranks
beat through their agents."""

from __future__ import annotations

import pytest

from supervisor.config.model import HeartbeatSection
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.silence import SilenceWatch
from worker_sdk.contract import messages as m


def _table(n: int) -> RankTable:
    table = RankTable()
    for r in range(n):
        table.fold(b"agent", r, 100 + r, m.Hello(0, "node"), 0.0)
    return table


@pytest.mark.parametrize(
    ("beat", "expected"),
    [
        (m.Heartbeat(4, 0.5), (4, 3.0, 3.0, None)),
        (m.Heartbeat(-1, 0.0), (-1, 3.0, 0.0, None)),  # no progress: the last progress stays
    ],
)
def test_a_beat_folds_as_the_heartbeat_message_does(
    beat: m.Heartbeat, expected: tuple[int, float, float, float | None]
) -> None:
    """``beat`` (the agents' fast path) leaves a rank as ``fold`` of the same heartbeat does:
    last step, last seen, last progress, a save in progress cleared."""
    fast, slow = _table(1), _table(1)
    for table in (fast, slow):
        table.fold(b"agent", 0, 100, m.CheckpointBegin(3), 1.0)
    fast.beat(b"agent", 0, 100, beat.step, beat.longest_step_s, 3.0)
    slow.fold(b"agent", 0, 100, beat, 3.0)
    for table in (fast, slow):
        st = table.ranks[0]
        assert (st.last_step, st.last_seen_t, st.last_progress_t, st.saving_since) == expected
    assert list(fast.ranks[0].step_times) == list(slow.ranks[0].step_times)


def test_started_counts_each_rank_once_and_forgets_a_replaced_one() -> None:
    """The count of ranks past their first step: a second step does not count again, a rank
    whose process was replaced (another pid) counts again only once it steps."""
    table = _table(2)
    table.beat(b"a", 0, 100, 0, 0.0, 1.0)
    table.beat(b"a", 0, 100, 1, 0.0, 2.0)
    assert not table.started(2)
    table.beat(b"a", 1, 101, 0, 0.0, 2.0)
    assert table.started(2)
    table.fold(b"a", 1, 999, m.Hello(0, "node"), 3.0)  # rank 1 restarted in a new process
    assert not table.started(2)
    table.beat(b"a", 1, 999, 0, 0.0, 4.0)
    assert table.started(2)


def test_an_exact_step_ahead_of_the_heartbeats_is_progress() -> None:
    """A step read from the rank's step slot (or its exit report) past what its heartbeats said
    is progress, first step included; the rate-limited heartbeat of an earlier step that
    arrives after it takes nothing back; what is not an int is ignored."""
    table = _table(1)
    table.beat(b"a", 0, 100, 3, 0.0, 1.0)
    table.exact_step(0, 7, 2.0)
    st = table.ranks[0]
    assert (st.last_step, st.last_progress_t) == (7, 2.0)
    table.beat(b"a", 0, 100, 5, 0.0, 2.5)
    assert (st.last_step, st.last_progress_t) == (7, 2.0)
    for junk in (True, "9", 9.0, None):
        table.exact_step(0, junk, 3.0)
    table.exact_step(1, 9, 3.0)  # a rank not in the table
    assert (st.last_step, st.last_progress_t) == (7, 2.0)
    fresh = _table(1)
    fresh.exact_step(0, 0, 4.0)
    assert fresh.started(1) and fresh.ranks[0].first_step_t == 4.0


def test_a_ranks_last_progress_never_goes_back() -> None:
    """A heartbeat an agent held (its moment earlier than the message before it) does not set
    a rank's last progress back."""
    table = _table(1)
    table.fold(b"a", 0, 100, m.Phase(0, "eval", True), 5.0)
    table.beat(b"a", 0, 100, 3, 0.0, 4.9)
    assert table.ranks[0].last_progress_t == 5.0


@pytest.mark.parametrize(("ranks", "kept_each"), [(64, 256), (4096, 32), (16384, 8)])
def test_step_time_samples_stay_bounded_however_many_ranks(ranks: int, kept_each: int) -> None:
    """Each rank keeps at most its share of the samples (at least 8), and above 4096 ranks
    a rank's heartbeats are sampled in turn: the samples kept in all stay about 131k."""
    table = _table(ranks)
    beats = 300 if ranks <= 4096 else 300 * (ranks // 4096)
    for i in range(beats):
        table.beat(b"a", 0, 100, i, 0.1 + i, float(i))
    kept = table.ranks[0].step_times
    assert len(kept) == kept_each
    assert kept[-1] >= 0.1 + beats - ranks // 4096 - 1  # the newest are the ones kept


def test_the_silence_check_looks_again_when_its_bound_is_too_old_or_a_rank_is_added() -> None:
    """While every rank progressed recently, the check finds nothing; a rank that stops is
    found once its silence nears the timeout, whatever bound the check kept; a rank added
    after the bound was taken is looked at too."""
    hb = HeartbeatSection(
        interval_s=1.0,
        startup_timeout_s=5.0,
        hang_timeout_s=5.0,
        hang_timeout_max_s=60.0,
        transport="auto",
    )
    table = _table(3)
    watch = SilenceWatch(hb, table, world_size=3, t0=0.0, lead_s=1.0)
    for t in range(1, 4):
        for r in range(3):
            table.beat(b"a", r, 100 + r, t, 0.0, float(t))
        assert watch.check(float(t), finishing=False) is None
    for t in range(4, 10):  # rank 2 stops after step 3 (at t=3)
        for r in range(2):
            table.beat(b"a", r, 100 + r, t, 0.0, float(t))
        found = watch.check(float(t) + 0.5, finishing=False)
        if t + 0.5 - 3 < 4.0:
            assert found is None, t
        else:
            assert found is not None and found.near, t
            break
    late = _table(0)
    watch = SilenceWatch(hb, late, world_size=1, t0=0.0, lead_s=1.0)
    assert watch.check(0.5, finishing=False) is None
    late.fold(b"a", 0, 100, m.Hello(0, "node"), 0.6)  # its last progress: 0.6
    assert watch.check(4.8, finishing=False) is not None
