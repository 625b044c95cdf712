"""What ``rvsup status`` shows, from a status answer: pure rendering, progress and time left."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.console.status_view import Progress, render

RANK = {"rank": 0, "host": "n1", "pid": 7, "heartbeat_age_s": 0.4, "phase": None}


def answer(*steps: int, total: int | None = None) -> dict[str, Any]:
    return {
        "job": "toy",
        "state": "running",
        "attempt": 2,
        "restarts_used": 1,
        "max_restarts": 5,
        "hang_timeout_s": 5.0,
        "pid": 99,
        "newest_checkpoint_step": 39,
        "ranks": [
            {**RANK, "rank": r, "last_step": s, "total_steps": total} for r, s in enumerate(steps)
        ],
        "messages": {"accepted": 10, "dropped": {}},
    }


@pytest.mark.parametrize(
    ("steps", "total", "rate", "line"),
    [
        ((50, 48), 1000, 10.0, "step 48 of 1000, 10.00 steps/s, time left ~0:01:35"),
        (
            (50, 48),
            None,
            10.0,
            "step 48, 10.00 steps/s (the time left needs resume(total_steps=...))",
        ),
        ((50, 48), 1000, None, "step 48 of 1000, - steps/s, time left: -"),
        ((), None, None, "step -, - steps/s (the time left needs resume(total_steps=...))"),
        ((999,), 1000, 2.0, "step 999 of 1000, 2.00 steps/s, time left ~0:00:00"),
    ],
)
def test_progress_line(
    steps: tuple[int, ...], total: int | None, rate: float | None, line: str
) -> None:
    """The slowest rank's step, the rate and the time left to the script's last step (only
    where the script said its total)."""
    assert render(answer(*steps, total=total), [], rate)[1] == line


def test_render_names_the_job_restarts_left_and_every_rank() -> None:
    """The first line says the state, attempt and restarts left; every rank has a row."""
    lines = render(answer(50, 48), [], None)
    assert lines[0] == (
        "toy: running, attempt 2, restarts 1/5 (4 left), hang timeout 5.0s, daemon pid 99"
    )
    assert lines[2] == "newest checkpoint: storage step 39"
    assert sum(1 for ln in lines if ln.lstrip().startswith(("0  n1", "1  n1"))) == 2


def test_render_lists_the_excluded_nodes_and_why() -> None:
    """Each excluded node of the daemon's answer is a line with its reason; none, no line."""
    excluded = {"n2": "2 failures attributed to it", "n3": "failed its health check: memory"}
    lines = render({**answer(5), "excluded_nodes": excluded}, [], None)
    assert [ln for ln in lines if ln.startswith("excluded node")] == [
        "excluded node n2: 2 failures attributed to it",
        "excluded node n3: failed its health check: memory",
    ]
    assert not [ln for ln in render(answer(5), [], None) if ln.startswith("excluded")]


def test_progress_rate_is_over_one_attempt_and_a_window() -> None:
    """Steps per second come from refreshes of one attempt; a new attempt starts over, and
    samples older than the window are dropped."""
    p = Progress()
    assert p.rate() is None
    p.add(0.0, 1, 10)
    p.add(2.0, 1, 30)
    assert p.rate() == 10.0
    p.add(3.0, 2, 5)
    assert p.rate() is None
    p.add(4.0, 2, 9)
    p.add(100.0, 2, 500)
    assert p.rate() is None  # the older samples left the window


STRAGGLER = {
    "rank": 1,
    "node": "n2",
    "slower": 25.31,
    "lost_s": 0.958,
    "lost_per_step_s": 0.0502,
    "step_s": 0.0523,
    "since_s": 12.4,
    "exclude_node": True,
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, []),
        ({"straggler": None, "exclude_at_restart": {}}, []),
        (
            {"straggler": STRAGGLER},
            [
                (
                    "straggler: rank 1 on n2, 25.3x slower than the others: they wait 50 ms"
                    " for it every 52 ms step (named 12s ago)"
                )
            ],
        ),
        (
            {"straggler": {**STRAGGLER, "node": None, "lost_per_step_s": 0.0031, "step_s": 0.0042}},
            [
                (
                    "straggler: rank 1, 25.3x slower than the others: they wait 3.1 ms for it"
                    " every 4.2 ms step (named 12s ago)"
                )
            ],
        ),
        (
            {"exclude_at_restart": {"n2": "rank 1 was a straggler", "a1": "rank 4 was one"}},
            [
                "excluded at the next restart: a1 (rank 4 was one)",
                "excluded at the next restart: n2 (rank 1 was a straggler)",
            ],
        ),
    ],
    ids=["old-daemon", "none", "named", "no-node-short-steps", "exclusions"],
)
def test_straggler_lines(extra: dict[str, Any], expected: list[str]) -> None:
    """The straggler named now (rank, node, how much slower, what it costs a step, since when)
    and the nodes the next restart leaves out follow the ranks' table; an answer without them
    (an older daemon, or none named) adds no line."""
    lines = render({**answer(50, 48), **extra}, [], None)
    found = [ln for ln in lines if ln.startswith(("straggler:", "excluded at"))]
    assert found == expected


BUSY = {
    "ranks": [0],
    "where": "train.py:92 in main",
    "detail": "rank 0 is waiting on its own (a sleep or I/O) (train.py:92 in main); rank 1 waits"
    " for it",
    "silent_s": 47.2,
    "hang_at_s": 120.0,
    "bound": "hang_timeout_idle",
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, []),
        ({"busy": None}, []),
        (
            {"busy": BUSY},
            [
                (
                    "busy, no step for 47s: rank 0 is waiting on its own (a sleep or I/O)"
                    " (train.py:92 in main); rank 1 waits for it; a hang at 120s"
                    " (hang_timeout_idle)"
                )
            ],
        ),
    ],
    ids=["old-daemon", "none", "judged-busy"],
)
def test_busy_line(extra: dict[str, Any], expected: list[str]) -> None:
    """A silence judged busy (a slow phase) is shown with what each rank does, how long there
    has been no step, and when it becomes a hang under which bound."""
    lines = render({**answer(50, 48), **extra}, [], None)
    assert [ln for ln in lines if ln.startswith("busy,")] == expected


AGENTS = {"count": 2, "oldest_beat_s": 0.31, "least_memory": ["n2", 3 * 2**30], "oom_kills": {}}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, []),
        ({"agents": None}, []),
        (
            {"agents": AGENTS},
            ["node agents: 2, oldest beat 0.3s ago; least memory available: n2, 3.0 GiB"],
        ),
        (
            {"agents": {**AGENTS, "least_memory": None, "oom_kills": {"n2": [1, ""]}}},
            ["node agents: 2, oldest beat 0.3s ago", "OOM kills on n2 this attempt: 1"],
        ),
        (
            {"agents": {**AGENTS, "oom_kills": {"n3": [2, "no memory cgroup"]}}},
            [
                "node agents: 2, oldest beat 0.3s ago; least memory available: n2, 3.0 GiB",
                "OOM kills on n3 this attempt: 2 (the host's count: no memory cgroup)",
            ],
        ),
    ],
    ids=["old-daemon", "one-node", "agents", "oom-killed", "host-wide"],
)
def test_agent_lines(extra: dict[str, Any], expected: list[str]) -> None:
    """On several nodes: how many agents beat and the oldest beat, the node with the least
    memory available, and each node whose processes the OOM killer killed, with how it was
    counted."""
    lines = render({**answer(50, 48), **extra}, [], None)
    assert [ln for ln in lines if ln.startswith(("node agents", "OOM kills"))] == expected
