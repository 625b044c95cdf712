"""The bad-node campaign's pure parts: the bad node drawn, and the figures read from a history."""

from __future__ import annotations

import random
from typing import Any

from tests.chaos.bad_node import NODES, Measured, draw_bad_node, measure


def _attempt(*nodes: str) -> dict[str, Any]:
    return {"event": "attempt_started", "launcher": ["srun", f"--nodelist={','.join(nodes)}"]}


def test_the_bad_node_is_one_the_job_starts_on_and_replays_from_its_seed() -> None:
    """node1 or node2 (node3 is the spare), a known kind, a step the job reaches; same seed, same
    draw."""
    for index in range(50):
        bad = draw_bad_node(random.Random(f"1:bad:{index}"))
        assert bad == draw_bad_node(random.Random(f"1:bad:{index}"))
        assert bad.node in NODES[:2] and bad.kind in ("crash", "unhealthy") and 3 <= bad.step <= 8


def test_measure_counts_attempts_on_the_bad_node_only_after_its_exclusion() -> None:
    """Two attempts on node2 before its exclusion do not count; one after does; charged
    restarts are counted, uncharged ones not; success is job_succeeded."""
    events = [
        _attempt("node1", "node2"),
        {"event": "restart_scheduled", "charged": True},
        _attempt("node1", "node2"),
        {"event": "restart_scheduled", "charged": True},
        {"event": "node_excluded", "node": "node2"},
        _attempt("node1", "node3"),
        {"event": "restart_scheduled", "charged": False},
        _attempt("node2", "node3"),
        {"event": "job_succeeded"},
    ]
    assert measure(events, "node2", 12.5) == Measured(
        succeeded=True,
        attempts=4,
        restarts=2,
        excluded=True,
        on_bad_after_exclusion=1,
        seconds=12.5,
    )


def test_measure_without_exclusion_counts_nothing_on_the_bad_node() -> None:
    """Exclusion off: the node is never excluded, so no attempt counts; a job without
    job_succeeded gave up."""
    events = [_attempt("node1", "node2"), {"event": "restart_scheduled", "charged": True}] * 3
    seen = measure(events, "node2", 1.0)
    assert (seen.succeeded, seen.excluded, seen.on_bad_after_exclusion, seen.restarts) == (
        False,
        False,
        0,
        3,
    )
