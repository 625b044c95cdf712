"""The chaos campaign's pure parts: schedules drawn, written and parsed back; invariants judged
from event lists."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.chaos.invariants import check, expected_exit_codes
from tests.chaos.schedule import ENDING, EXTERNAL, IN_RANK, TOTAL_STEPS, draw, parse


@pytest.mark.parametrize("seed", range(300))
def test_a_drawn_schedule_replays_from_its_line_and_every_fault_can_strike(seed: int) -> None:
    """The same seed draws the same schedule; its line parses back to it; ending faults lie in
    successive attempts at steps the next attempt still reaches (after an outside fault, at
    least 15 steps later), all before the job's end; a full disk never meets an aimed save."""
    s = draw(random.Random(f"7:{seed}"))
    assert draw(random.Random(f"7:{seed}")) == s
    assert parse(s.text()) == s
    endings = [s.ending(a) for a in range(1, s.attempts + 1)]
    assert all(endings[:-1]), "every attempt but the last ends with a fault"
    previous: tuple[str, int] | None = None
    for ending in filter(None, endings):
        kind, step = ending[0].kind, ending[0].step
        assert kind in ENDING and step < TOTAL_STEPS
        if previous is not None:
            floor = previous[1] + (15 if previous[0] in EXTERNAL else 0)
            assert step >= floor, s.text()
        previous = (kind, step)
    assert not (s.needs_tmpfs and s.aims_at_saves)


@pytest.mark.parametrize(
    ("line", "attempts", "codes", "gives_up"),
    [
        ("max_restarts=0", 1, [0], False),
        ("max_restarts=1 kill:0:5:1 kill:0:6:2", 2, [3], True),
        ("max_restarts=0 term:-:5:1 usr1:-:30:2", 3, [75, 75, 0], False),
        ("max_restarts=1 daemonkill:-:5:1 oom:1:30:2", 3, [-9, 0], False),
        ("max_restarts=0 kill:0:5:1 raise:1:5:1 term:-:30:2", 1, [3], True),
    ],
)
def test_what_a_schedule_demands(
    line: str, attempts: int, codes: list[int], gives_up: bool
) -> None:
    """Attempts, exit codes and give-up follow from the faults and the budget: stops and a lost
    daemon are free, a pair of faults is one failure, the failure past the budget ends the job."""
    s = parse(line)
    assert (s.attempts, expected_exit_codes(s), s.gives_up) == (attempts, codes, gives_up)


@pytest.mark.parametrize(
    "line", ["max_restarts=x", "restarts=1", "max_restarts=1 nap:0:5:1", "max_restarts=1 kill:0:5"]
)
def test_a_bad_schedule_line_is_refused(line: str) -> None:
    """A replay line that is not a schedule is refused with what is expected."""
    with pytest.raises(ValueError, match=r"max_restarts=N|kind:rank:step:attempt"):
        parse(line)


def _ev(name: str, attempt: int, **fields: Any) -> dict[str, Any]:
    return {"event": name, "attempt": attempt, **fields}


def _crash_then_success() -> list[dict[str, Any]]:
    return [
        _ev("attempt_started", 1),
        _ev("checkpoint_loaded", 1, resume_step=0, checkpoint=None),
        _ev("checkpoint_committed", 1, step=9, path="/c/step-9"),
        _ev("failure_detected", 1, kind="crash", ranks=[1], last_step=12, detail="rank 1 killed"),
        _ev("restart_scheduled", 1, charged=True, restarts_left=1),
        _ev("attempt_started", 2),
        _ev("checkpoint_loaded", 2, resume_step=10, checkpoint="/c/step-9"),
        _ev("job_succeeded", 2),
    ]


def _judge(events: list[dict[str, Any]], **kw: Any) -> list[str]:
    args: dict[str, Any] = {
        "exit_codes": [0],
        "events": events,
        "save_killed": {},
        "damaged": {},
        "history": "1 crash\n2 succeeded",
    }
    return check(parse("max_restarts=2 kill:1:13:1"), **{**args, **kw})


def test_a_true_history_breaks_no_invariant() -> None:
    """A kill at step 13 reported as a crash of rank 1 at step 12, one charged restart, a resume
    from a committed checkpoint, success: no violation."""
    assert _judge(_crash_then_success()) == []


@pytest.mark.parametrize(
    ("change", "kw", "violation"),
    [
        ({"kind": "hang"}, {}, "reported as hang"),
        ({"ranks": [0, 1]}, {}, "blames ranks [0, 1]"),
        ({"last_step": 9}, {}, "last step 9"),
        ({}, {"exit_codes": [3]}, "exit codes [3]"),
        ({}, {"damaged": {1: "/c/step-9"}}, "damaged after attempt 1"),
        ({}, {"history": "1 unknown"}, "unknown or running"),
    ],
)
def test_each_lie_in_the_history_is_named(
    change: dict[str, Any], kw: dict[str, Any], violation: str
) -> None:
    """A wrong kind, culprit or step in failure_detected, a wrong exit code, a resume from a
    damaged checkpoint, an attempt left unknown: each is reported."""
    events = _crash_then_success()
    events[3] = {**events[3], **change}
    assert any(violation in v for v in _judge(events, **kw)), _judge(events, **kw)


@pytest.mark.parametrize(("rewritten", "ok"), [(True, True), (False, False)])
def test_a_damaged_checkpoint_written_anew_may_be_loaded(rewritten: bool, ok: bool) -> None:
    """A checkpoint damaged after attempt 1 and committed again by attempt 2 (which resumed from
    an older one) is whole when attempt 3 loads it; without the new commit, loading it is a
    violation."""
    events = [
        *_crash_then_success()[:5],
        _ev("attempt_started", 2),
        _ev("checkpoint_loaded", 2, resume_step=0, checkpoint=None),
        *([_ev("checkpoint_committed", 2, step=9, path="/c/step-9")] if rewritten else []),
        _ev("failure_detected", 2, kind="crash", ranks=[1], last_step=12, detail="rank 1"),
        _ev("restart_scheduled", 2, charged=True, restarts_left=0),
        _ev("attempt_started", 3),
        _ev("checkpoint_loaded", 3, resume_step=10, checkpoint="/c/step-9"),
        _ev("job_succeeded", 3),
    ]
    found = _judge(events, damaged={1: "/c/step-9"})
    assert (not any("loads /c/step-9, damaged" in v for v in found)) is ok, found


def test_budget_arithmetic_is_checked() -> None:
    """A restart that was not charged, or a countdown that skips, is a violation."""
    events = _crash_then_success()
    events[4] = {**events[4], "restarts_left": 0}
    assert any("restarts_left [0], expected [1]" in v for v in _judge(events))
    events[4] = {**events[4], "charged": False}
    assert any("0 charged restarts, expected 1" in v for v in _judge(events))


def test_kinds_are_partitioned() -> None:
    """Every ending kind is either inside a rank or from outside."""
    assert set(ENDING) == set(IN_RANK) | set(EXTERNAL)
    assert not set(IN_RANK) & set(EXTERNAL)


@pytest.mark.parametrize(("last_step", "ok"), [(8, True), (9, True), (10, True), (11, False)])
def test_a_kill_aimed_at_a_save_may_land_in_the_next_step(last_step: int, ok: bool) -> None:
    """A kill aimed at the save of step 9 lands a moment after the save was seen: the failure
    may name step 8, 9 or the step 10 the rank went on to run, never 11."""
    events = _crash_then_success()
    events[3] = {**events[3], "last_step": last_step}
    found = check(
        parse("max_restarts=2 savekill:1:5:1"),
        exit_codes=[0],
        events=events,
        save_killed={1: 9},
        damaged={},
        history="1 crash\n2 succeeded",
    )
    assert (not any("reported at last step" in v for v in found)) is ok, found
