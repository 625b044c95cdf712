"""The hang rule's evidence, gathered from real processes: /proc and faulthandler's stacks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.process.evidence_window import STACKS_CAP_BYTES
from supervisor.ranks.slow import MIN_WINDOW_S, SlowWatch
from supervisor.rules.stuck import Stuck
from tests.helpers.slow_storage import slow_storage
from tests.helpers.stand_in_ranks import ranks
from worker_sdk.contract import protocol as p

pytestmark = pytest.mark.process  # ranks stood in for by real processes


def judged(
    tmp: Path, pids: dict[int, int], *, idle_cap_s: float | None = None
) -> tuple[SlowWatch, Stuck | None]:
    """Open a window, wait for it, and judge at the timeout."""
    watch = SlowWatch(tmp, cap_s=60.0, idle_cap_s=idle_cap_s)
    t0 = time.monotonic()
    assert watch.review(t0, hung=False, silent_s=4.0, review_s=5.0, pids=pids) is None
    time.sleep(MIN_WINDOW_S + 0.3)
    now = time.monotonic()
    return watch, watch.review(now, hung=True, silent_s=5.0, review_s=5.0, pids=pids)


@pytest.mark.parametrize(
    ("kinds", "busy", "says"),
    [
        (["spin", "collective"], (0,), "rank 0 is working"),  # rank 1 waits for it
        (["sleep", "collective"], (0,), "rank 0 is waiting on its own"),  # a sleep in user code
        (["spin", "spin"], (0, 1), "rank 1 is working"),
        (["future", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["queue", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["future-socket", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["future-busy", "collective"], (0,), "rank 0 is working"),  # its thread uses the CPU
    ],
)
def test_a_working_rank_opens_a_slow_phase(
    tmp_path: Path, kinds: list[str], busy: tuple[int, ...], says: str
) -> None:
    """Real processes: a rank that spins, sleeps, or waits on a thread of its own that sleeps
    (its future, a queue it feeds), reads a socket or works, outside a collective, is busy, not
    stuck: no hang, a slow phase naming it and what it does, recorded once the silence ends."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is None
    assert watch.phase is not None and watch.phase.ranks == busy
    assert says in watch.phase.detail, watch.phase.detail
    event = watch.close(time.monotonic(), finished=True)
    assert event is not None and event.ranks == busy and event.seconds >= 5.0
    assert "<string>" in event.where, event


@pytest.mark.parametrize(
    ("kinds", "stuck_ranks", "says"),
    [
        (["lock", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["deadlocked-future", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["event-beside-flight", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["stop", "collective"], (0,), "rank 0 is stopped by a signal"),
        (["collective", "collective"], (), "wait in collectives"),
    ],
)
def test_a_stuck_group_is_a_hang_at_the_timeout(
    tmp_path: Path, kinds: list[str], stuck_ranks: tuple[int, ...], says: str
) -> None:
    """Real processes: a deadlock on a lock (also one between the main thread and the thread it
    waits on, and a wait on an event nobody sets beside rvsup's own thread, which a rank's wait
    never counts on), a stopped process, every rank in a collective: stuck at the timeout, no
    slow phase."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is not None and stuck.ranks == stuck_ranks and says in stuck.detail, stuck
    assert watch.phase is None


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("storage", "rank 0 is waiting on storage (state D)"),
        ("future-storage", "rank 0 is waiting on a thread of its own"),
    ],
)
def test_a_write_to_slow_storage_is_an_idle_wait(tmp_path: Path, kind: str, says: str) -> None:
    """Real processes on a file system whose server takes 4 s per write: a rank flushing its
    checkpoint there (close() in state D, no CPU), or waiting on a thread of its own that does,
    is busy, not stuck, and waits on its own: bounded by hang_timeout_idle."""
    with slow_storage(tmp_path / "slow", 4.0), ranks(tmp_path, [kind, "collective"]) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is None, stuck
    phase = watch.phase
    assert phase is not None and phase.ranks == (0,) and says in phase.detail, phase
    assert phase.idle_t is not None, phase  # no rank works: the idle bound applies


def test_a_rank_that_cannot_dump_is_not_signalled(tmp_path: Path) -> None:
    """A rank without the dump handler (before resume()) is not sent the dump signal, which
    would kill it: it lives on, judged from /proc alone (sleeping: its own wait)."""
    with ranks(tmp_path, ["sleep"], dumps=False) as pids:
        watch, stuck = judged(tmp_path, pids)
        alive = [pid for pid in pids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
    assert alive == list(pids)
    assert stuck is None and watch.phase is not None and watch.phase.ranks == (0,)


def test_a_slow_phase_is_a_hang_at_its_cap(tmp_path: Path) -> None:
    """Busy ranks are judged again each review, and are a hang once the silence lasts cap_s."""
    with ranks(tmp_path, ["spin", "collective"]) as pids:
        watch, stuck = judged(tmp_path, pids)
        assert stuck is None and watch.phase is not None
        cap = watch.phase.cap_t
        late = watch.review(cap, hung=True, silent_s=60.0, review_s=5.0, pids=pids)
    assert late is not None and "ran for hang_timeout_max (60s)" in late.detail
    assert watch.note == late.detail


@pytest.mark.parametrize(
    ("kinds", "idle"),
    [(["sleep", "collective"], True), (["spin", "collective"], False)],
    ids=["asleep", "working"],
)
def test_an_idle_wait_is_a_hang_at_hang_timeout_idle(
    tmp_path: Path, kinds: list[str], idle: bool
) -> None:
    """A rank asleep outside collectives (its own wait, no CPU) is a hang once its silence
    reaches the idle bound (20 s here), not the cap (60 s); a working rank is not, and is
    judged by the cap alone."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids, idle_cap_s=20.0)
        assert stuck is None and watch.phase is not None
        start = watch.phase.start_t
        shown = watch.status(start + 10.0)
        at_idle = watch.review(start + 20.0, hung=True, silent_s=20.0, review_s=5.0, pids=pids)
    assert shown is not None and shown["silent_s"] == 10.0
    if idle:
        assert shown["hang_at_s"] == 20.0 and shown["bound"] == "hang_timeout_idle", shown
        assert at_idle is not None and at_idle.ranks == (0,)
        assert "waited on its own, using no CPU, for hang_timeout_idle (20s)" in at_idle.detail
    else:
        assert shown["hang_at_s"] == 60.0 and shown["bound"] == "hang_timeout_max", shown
        assert at_idle is None


def test_a_full_stacks_file_is_not_added_to(tmp_path: Path) -> None:
    """A rank whose stacks file has grown to the cap (a job that keeps coming close to its
    timeout) is not asked for more stacks: judged from /proc alone."""
    with ranks(tmp_path, ["sleep"]) as pids:
        stacks = tmp_path / p.stacks_file(0)
        os.truncate(stacks, STACKS_CAP_BYTES)
        watch, stuck = judged(tmp_path, pids)
    assert stacks.stat().st_size == STACKS_CAP_BYTES
    assert stuck is None and watch.phase is not None and watch.phase.where == "no stack"
