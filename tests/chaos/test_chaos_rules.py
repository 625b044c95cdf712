"""The chaos campaign's pure parts: schedules drawn, written and parsed back; invariants judged
from event lists."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.load import load_config
from tests.chaos.__main__ import References, _parse_args, _violations
from tests.chaos.execute import Observed, _job
from tests.chaos.invariants import (
    _damaged_snapshots,
    _full_memory,
    _storage_before,
    check,
    expected_exit_codes,
)
from tests.chaos.rollbacks import _loads_after, omitted
from tests.chaos.schedule import (
    ENDING,
    EXTERNAL,
    IN_RANK,
    KINDS,
    MEMORY,
    SHMFULL_STEPS,
    SKIP_STEPS,
    STORAGE_KINDS,
    TOTAL_STEPS,
    Rollback,
    draw,
    parse,
)


@pytest.mark.parametrize("seed", range(300))
def test_a_drawn_schedule_replays_from_its_line_and_every_fault_can_strike(seed: int) -> None:
    """The same seed draws the same schedule; its line parses back to it; ending faults lie in
    successive attempts at steps the next attempt still reaches (after an outside fault, at
    least 15 steps later; after a NaN, at least where its rollback resumes), all before the
    job's end; a full disk never meets an aimed save."""
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
            floor += SKIP_STEPS if previous[0] == "nan" else 0
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
        ("max_restarts=0 max_rollbacks=1 nan:0:5:1", 2, [0], False),
        ("max_restarts=0 max_rollbacks=0 nan:0:5:1", 1, [3], True),
        ("max_restarts=0 nan:0:5:1 nan:1:9:2", 2, [3], True),
        ("max_restarts=0 nan:0:5:1 nan:1:11:2", 3, [0], False),
        ("max_restarts=0 nan:0:5:1 kill:1:9:2", 2, [3], True),
        ("max_restarts=1 max_rollbacks=1 nan:0:5:1 daemonkill:-:20:2 nan:1:40:3", 3, [-9, 3], True),
    ],
)
def test_what_a_schedule_demands(
    line: str, attempts: int, codes: list[int], gives_up: bool
) -> None:
    """Attempts, exit codes and give-up follow from the faults and the budgets: stops and a lost
    daemon are free, a pair of faults is one failure, the failure past the budget ends the job;
    a NaN spends a rollback, not a restart, and one within skip_steps of the previous
    rollback's resume step, or past max_rollbacks, ends the job."""
    s = parse(line)
    assert (s.attempts, expected_exit_codes(s), s.gives_up) == (attempts, codes, gives_up)


@pytest.mark.parametrize(
    ("line", "why", "rollbacks"),
    [
        ("max_restarts=1 nan:0:5:1 kill:1:9:2 nan:0:20:3", None, [(1, 5, 8, 2), (3, 20, 23, 1)]),
        ("max_restarts=0 nan:0:5:1 nan:1:10:2", "deterministic", [(1, 5, 8, 2)]),
        ("max_restarts=0 max_rollbacks=1 nan:0:5:1 nan:1:20:2", "rollback budget", [(1, 5, 8, 0)]),
        ("max_restarts=0 nan:0:5:1 oom:1:20:2", "restart budget", [(1, 5, 8, 2)]),
    ],
)
def test_what_a_nan_demands(line: str, why: str | None, rollbacks: list[tuple[int, ...]]) -> None:
    """Each rolled-back NaN resumes skip_steps (3) past its step with one rollback less left;
    why the job gives up is named: a NaN right after the skipped steps is deterministic."""
    s = parse(line)
    assert s.gives_up_because == why
    assert s.rollbacks == tuple(Rollback(*r) for r in rollbacks)


def test_the_steps_a_rollback_skips_stay_skipped_in_later_attempts() -> None:
    """After a rollback resumes at 8, every later attempt starts no earlier, until a newer
    rollback moves the floor."""
    s = parse("max_restarts=2 nan:0:5:1 kill:1:9:2 nan:0:20:3")
    assert [s.skip_to(a) for a in (1, 2, 3, 4)] == [None, 8, 8, 23]


def test_a_schedule_with_a_nan_states_its_rollback_budget() -> None:
    """The line of a schedule with a NaN names max_rollbacks, and parses back to it."""
    s = parse("max_restarts=1 max_rollbacks=0 nan:1:7:1")
    assert s.text() == "max_restarts=1 max_rollbacks=0 nan:1:7:1" and s.max_rollbacks == 0
    assert parse(s.text()) == s


@pytest.mark.parametrize(
    "line",
    [
        "max_restarts=x",
        "restarts=1",
        "max_restarts=1 nap:0:5:1",
        "max_restarts=1 kill:0:5",
        "max_restarts=1 max_rollbacks=x nan:0:5:1",
    ],
)
def test_a_bad_schedule_line_is_refused(line: str) -> None:
    """A replay line that is not a schedule is refused with what is expected."""
    with pytest.raises(ValueError, match=r"max_restarts=N|max_rollbacks=N|kind:rank:step:attempt"):
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
    found = _judge_aimed("max_restarts=2 savekill:1:5:1", struck=9, last_step=last_step)
    assert (not any("reported at last step" in v for v in found)) is ok, found


def _judge_aimed(
    line: str, *, struck: int, last_step: int, ranks: list[int] | None = None
) -> list[str]:
    """The violations of a crash then a success, the crash's fault aimed at step ``struck``
    (the save or snapshot it caught, or the ranks' step when the zygote was killed), the
    failure naming ``last_step`` (and ``ranks``, when given)."""
    events = _crash_then_success()
    events[3] = {**events[3], "last_step": last_step, **({} if ranks is None else {"ranks": ranks})}
    return check(
        parse(line),
        exit_codes=[0],
        events=events,
        save_killed={1: struck},
        damaged={},
        history="1 crash\n2 succeeded",
    )


_NAN_LINE = "max_restarts=1 max_rollbacks=1 nan:1:25:1 kill:0:29:2"


def _nan_then_crash() -> list[dict[str, Any]]:
    """The history of ``_NAN_LINE`` as rvsup writes it: a NaN at step 25 rolled back to step 19
    (step 29's checkpoint, written after the onset, discarded), on at 28; a crash at 29; the
    restart loads step 19 again and resumes at 28."""
    return [
        _ev("attempt_started", 1),
        _ev("checkpoint_loaded", 1, resume_step=0, checkpoint=None),
        _ev("checkpoint_committed", 1, step=9, path="/c/step-9"),
        _ev("checkpoint_committed", 1, step=19, path="/c/step-19"),
        _ev("anomaly_detected", 1, kind="nonfinite_loss", step=25, onset=25, rank=1, value=None),
        _ev("checkpoint_committed", 1, step=29, path="/c/step-29"),
        _ev("failure_detected", 1, kind="nonfinite_loss", ranks=[1], last_step=29, detail="nan"),
        _ev(
            "rolled_back",
            1,
            from_step=25,
            to_step=19,
            resume_step=28,
            skipped_steps=8,
            onset=25,
            discarded=[29],
            rollbacks_left=0,
        ),
        _ev("restart_scheduled", 1, charged=False, backoff_s=0.0, restarts_left=1),
        _ev("attempt_started", 2),
        _ev("checkpoint_loaded", 2, resume_step=28, checkpoint="/c/step-19"),
        _ev("failure_detected", 2, kind="crash", ranks=[0], last_step=28, detail="rank 0 killed"),
        _ev("restart_scheduled", 2, charged=True, backoff_s=0.1, restarts_left=0),
        _ev("attempt_started", 3),
        _ev("checkpoint_loaded", 3, resume_step=28, checkpoint="/c/step-19"),
        _ev("checkpoint_committed", 3, step=29, path="/c/step-29"),
        _ev("job_succeeded", 3),
    ]


def _judge_nan(events: list[dict[str, Any]], line: str = _NAN_LINE, **kw: Any) -> list[str]:
    args: dict[str, Any] = {
        "exit_codes": [0],
        "events": events,
        "save_killed": {},
        "damaged": {},
        "history": "1 nonfinite_loss\n2 crash\n3 succeeded",
    }
    return check(parse(line), **{**args, **kw})


def test_a_true_rollback_history_breaks_no_invariant() -> None:
    """The NaN caught at its step on its rank, rolled back to the newest checkpoint before it,
    an uncharged restart, both later attempts resuming at 28 from step 19: no violation; the
    final state must equal a run without steps 20..27."""
    assert _judge_nan(_nan_then_crash()) == []
    assert omitted(_nan_then_crash()) == ((20, 28),)


@pytest.mark.parametrize(
    ("index", "change", "violation"),
    [
        (4, {"step": 26}, "anomaly (kind, step, onset, rank, value)"),
        (4, {"rank": 0}, "anomaly (kind, step, onset, rank, value)"),
        (4, {"onset": 24}, "anomaly (kind, step, onset, rank, value)"),
        (6, {"last_step": 24}, "nan at step 25 reported at last step 24"),
        (7, {"to_step": 9, "skipped_steps": 18}, "rolled back (from, onset, to, resume)"),
        (7, {"resume_step": 26}, "rolled back (from, onset, to, resume)"),
        (7, {"skipped_steps": 6}, "6 steps skipped, expected 8"),
        (7, {"discarded": [19, 29]}, "some before the onset"),
        (7, {"rollbacks_left": 1}, "rollbacks_left 1, expected 0"),
        (8, {"charged": True, "restarts_left": 0}, "restarts (charged, backoff, left)"),
        (10, {"resume_step": 20}, "attempt 2 resumes at 20"),
        (10, {"checkpoint": "/c/step-9", "resume_step": 28}, "attempt 2 loads step 9"),
        (14, {"resume_step": 20}, "attempt 3 resumes at 20"),
        (14, {"checkpoint": "/c/step-29", "resume_step": 30}, "discarded by the rollback"),
        (11, {"kind": "loss_spike"}, "reported as loss_spike"),
    ],
)
def test_each_lie_about_a_rollback_is_named(
    index: int, change: dict[str, Any], violation: str
) -> None:
    """A NaN reported at another step, rank or onset, a rollback to the wrong checkpoint or
    resume step, a miscounted skip, a discarded checkpoint from before the onset, a wrong
    rollback countdown, a charged rollback, an attempt that trains on the skipped steps again
    (right after the rollback, or after a later crash), a load of a discarded checkpoint: each
    is reported."""
    events = _nan_then_crash()
    events[index] = {**events[index], **change}
    if index == 11:  # the crash after the rollback reported as an anomaly
        events.insert(11, _ev("anomaly_detected", 2, kind="loss_spike", step=28, onset=28))
    found = _judge_nan(events)
    assert any(violation in v for v in found), found


@pytest.mark.parametrize(
    ("line", "reason", "ok"),
    [
        ("max_restarts=1 max_rollbacks=0 nan:1:25:1", "rollback budget spent (0 of 0 used)", True),
        ("max_restarts=1 max_rollbacks=0 nan:1:25:1", "deterministic: rank 1", False),
        ("max_restarts=1 max_rollbacks=1 nan:1:25:1 nan:1:28:2", "deterministic: rank 1", True),
        ("max_restarts=1 max_rollbacks=1 nan:1:25:1 nan:1:28:2", "rollback budget spent", False),
    ],
)
def test_a_nan_that_ends_the_job_says_why(line: str, reason: str, ok: bool) -> None:
    """A NaN past max_rollbacks gives up saying the budget is spent; one right after the
    previous rollback's skipped steps gives up as deterministic; the wrong reason, or a
    rollback where the job must give up, is reported."""
    events = _nan_then_crash()[:7]
    if "28:2" in line:
        events += [
            *_nan_then_crash()[7:11],
            _ev(
                "anomaly_detected", 2, kind="nonfinite_loss", step=28, onset=28, rank=1, value=None
            ),
            _ev("failure_detected", 2, kind="nonfinite_loss", ranks=[1], last_step=28, detail="n"),
        ]
    attempt = events[-1]["attempt"]
    events.append(_ev("job_gave_up", attempt, reason=reason))
    found = _judge_nan(events, line, exit_codes=[3])
    assert (found == []) is ok, found


def test_the_ranges_left_out_are_merged() -> None:
    """Two rollbacks whose skipped ranges overlap (the second went back before the first's
    resume step) leave out their union; a rollback to the start leaves out from step 0."""
    back = [
        _ev("rolled_back", 1, to_step=None, resume_step=8),
        _ev("rolled_back", 2, to_step=19, resume_step=28),
        _ev("rolled_back", 3, to_step=19, resume_step=33),
    ]
    assert omitted(back) == ((0, 8), (20, 33))


@pytest.mark.parametrize(("every", "parsed"), [("auto", None), ("3", 3)])
def test_a_campaign_with_the_memory_tier_writes_it_into_the_job(
    tmp_path: Path, every: str, parsed: int | None
) -> None:
    """``--memory EVERY`` gives every job of the campaign the memory tier, in its own
    directory; without it the job is storage-only."""
    s = parse("max_restarts=1 kill:1:13:1")
    shm = tmp_path / "shm"
    job = _job(tmp_path, s, ckpt="ckpt", final=tmp_path / "final.pt", memory=(every, shm))
    cfg = load_config(job)
    assert (cfg.checkpoint.memory_every_steps, cfg.checkpoint.memory_dir) == (parsed, str(shm))
    (tmp_path / "plain").mkdir()
    plain = load_config(_job(tmp_path / "plain", s, ckpt="ckpt", final=tmp_path / "final.pt"))
    assert plain.checkpoint.memory_every_steps == 0


def test_snapshots_left_after_the_job_are_a_violation(tmp_path: Path) -> None:
    """A job that ended leaving its snapshots in memory_dir breaks an invariant: rvsup removes
    them at every end of a job."""
    s = parse("max_restarts=1 kill:1:13:1")
    seen = Observed(memory_left=["rvsup-0-0123456789abcdef"])
    problems = _violations(s, seen, References(tmp_path))
    assert "snapshots left in memory_dir after the job ended: ['rvsup-0-0123456789abcdef']" in (
        problems
    )
    assert not any("snapshots left" in p for p in _violations(s, Observed(), References(tmp_path)))


def test_a_memory_resume_is_judged_against_the_storage_it_could_load() -> None:
    """Storage's newest that was damaged between two starts, or discarded by a rollback, does
    not make a snapshot newer than the rest "older than storage"; one that was whole does."""
    evs: list[dict[str, Any]] = [
        {"event": "checkpoint_committed", "attempt": 1, "step": 19, "path": "/c/step-0000000019"},
        {"event": "checkpoint_committed", "attempt": 2, "step": 49, "path": "/c/step-0000000049"},
        {"event": "attempt_started", "attempt": 3},
    ]
    assert _storage_before(evs, 3, {2: "/c/step-0000000049"}) == 19
    assert _storage_before(evs, 3, {}) == 49
    rolled = [*evs[:2], {"event": "rolled_back", "attempt": 2, "onset": 30}, evs[2]]
    assert _storage_before(rolled, 3, {}) == 19
    assert _storage_before(evs, 1, {}) is None


def test_a_load_from_memory_right_after_a_rollback_is_named() -> None:
    """The attempt after a rollback resumes from storage (what rolled_back names), and no
    attempt loads a snapshot of a step after the checkpoint restored, up to the resume step
    (those before the onset hold steps the rollback skipped)."""
    s = parse("max_restarts=1 max_rollbacks=1 nan:0:13:1 kill:0:32:2")
    (r,) = s.rollbacks
    back = {"event": "rolled_back", "attempt": 1, "to_step": 9, "onset": 13, "resume_step": 16}
    shm = "/dev/shm/x/step-00000000"
    loads = [
        back,
        {"event": "checkpoint_loaded", "attempt": 2, "checkpoint": shm + "12", "source": "memory"},
        {"event": "checkpoint_loaded", "attempt": 3, "checkpoint": shm + "14", "source": "memory"},
        {"event": "checkpoint_loaded", "attempt": 4, "checkpoint": shm + "30", "source": "memory"},
    ]
    problems = _loads_after(r, back, loads, 0)
    assert problems == [
        f"attempt 2 loads {shm}12 from memory after the rollback",
        "attempt 2 loads step 12, rolled back to 9",
        f"attempt 2 loads {shm}12, discarded by the rollback",
        f"attempt 3 loads {shm}14, discarded by the rollback",
    ]


@pytest.mark.parametrize("seed", range(200))
def test_the_memory_tiers_faults_are_drawn_only_when_asked_and_always_strike(seed: int) -> None:
    """Without the memory tier's kinds a draw is what it always was (none of them); with them,
    a writers' kill comes a few steps before its attempt's ending fault, a corrupted snapshot
    only after a killed daemon (the one end of a job that leaves its snapshots), and a kill
    aimed at a snapshot never in a schedule with one aimed at a save (whose ballast makes
    snapshots rare)."""
    rng = f"11:{seed}"
    plain = draw(random.Random(rng))
    assert not plain.uses_memory
    assert plain == draw(random.Random(rng), kinds=STORAGE_KINDS)
    s = draw(random.Random(rng), kinds=KINDS)
    assert parse(s.text()) == s
    kinds = {f.kind for f in s.faults}
    assert not {"savekill", "snapkill"} <= kinds, s.text()
    for attempt in range(1, s.attempts + 1):  # a kill aimed at a snapshot needs live writers
        here = {f.kind for f in s.in_attempt(attempt)}
        assert not {"writerkill", "snapkill"} <= here, s.text()
    for f in s.faults:
        ending = s.ending(f.attempt)
        if f.kind == "writerkill" and ending:
            assert f.step + 5 <= ending[0].step, s.text()
        if f.kind == "shmcorrupt":
            assert [e.kind for e in ending] == ["daemonkill"], s.text()


def test_a_campaign_draws_every_kind_of_the_memory_tier() -> None:
    """Over a campaign's worth of draws, each of the memory tier's kinds comes up."""
    drawn = {f.kind for i in range(200) for f in draw(random.Random(f"1:{i}"), kinds=KINDS).faults}
    assert set(MEMORY) <= drawn


def test_a_memory_fault_needs_the_memory_tier() -> None:
    """Replaying a schedule with a fault of the memory tier without ``--memory`` is refused
    (exit 2), before anything runs; a line that does not parse is refused too."""
    with pytest.raises(SystemExit) as refused:
        _parse_args(["--replay", "max_restarts=1 snapkill:1:12:1"])
    assert refused.value.code == 2
    with pytest.raises(SystemExit):
        _parse_args(["--replay", "max_restarts=1 snapkil:1:12:1", "--memory", "3"])
    assert _parse_args(["--replay", "max_restarts=1 snapkill:1:12:1", "--memory", "3"]).memory


def test_a_shape_is_one_the_job_has() -> None:
    """``--shape`` takes the loops tests/helpers/trainer.py writes (plain by default,
    accelerate, lightning) and refuses any other, before anything runs; the Lightning job
    refuses the smoke, the memory tier and a replay with a fault it has no place for."""
    assert _parse_args([]).shape == "plain"
    assert _parse_args(["--shape", "accelerate"]).shape == "accelerate"
    lightning = ["--shape", "lightning"]
    assert _parse_args([*lightning, "--replay", "max_restarts=1 kill:1:13:1"]).shape == "lightning"
    for refused in (
        ["--shape", "keras"],
        [*lightning, "--smoke"],
        [*lightning, "--memory", "auto"],
        [*lightning, "--replay", "max_restarts=1 max_rollbacks=1 nan:1:13:1"],
    ):
        with pytest.raises(SystemExit) as exited:
            _parse_args(refused)
        assert exited.value.code == 2, refused


def _snapshot_history(*, loaded: str, skipped: bool) -> list[dict[str, Any]]:
    snap = "/dev/shm/x/step-0000000021"
    return [
        _ev("attempt_started", 2, checkpoint=snap, source="memory"),
        *([_ev("checkpoint_skipped", 2, path=snap)] if skipped else []),
        _ev("checkpoint_loaded", 2, checkpoint=loaded, source="storage"),
    ]


@pytest.mark.parametrize(
    ("loaded", "skipped", "problem"),
    [
        ("/c/step-0000000019", True, None),
        ("/c/step-0000000019", False, "the snapshot damaged after attempt 1 is not reported"),
        ("/dev/shm/x/step-0000000021", True, "attempt 2 loads snapshot /dev/shm/x/step-0000000021"),
    ],
)
def test_a_snapshot_damaged_between_starts_is_skipped_never_loaded(
    loaded: str, skipped: bool, problem: str | None
) -> None:
    """The attempt after a corrupted snapshot, started from it, reports it skipped and loads
    something else; loading it, or passing it over silently, is named."""
    found = _damaged_snapshots(
        _snapshot_history(loaded=loaded, skipped=skipped), {1: "/dev/shm/x/step-0000000021"}
    )
    if problem is None:
        assert found == []
    else:
        assert any(problem in f for f in found), found


@pytest.mark.parametrize(("last_step", "ok"), [(11, True), (14, True), (15, False)])
def test_a_kill_aimed_at_a_snapshot_may_land_two_steps_later(last_step: int, ok: bool) -> None:
    """A snapshot of step 12 is written while its rank trains on: the kill aimed at it may
    name step 11 to 14, never 15."""
    found = _judge_aimed("max_restarts=2 snapkill:1:5:1", struck=12, last_step=last_step)
    assert (not any("reported at last step" in v for v in found)) is ok, found


@pytest.mark.parametrize(
    ("every", "reason", "ok"),
    [
        (3, "OSError: [Errno 28] No space left on device", True),
        (3, None, True),  # the space a prune freed took the window's snapshots
        (3, "rank(s) [1] could not take their snapshot", False),
        (None, None, True),  # "auto"
    ],
)
def test_a_full_memory_dir_turns_the_tier_off_with_its_reason(
    every: int | None, reason: str | None, ok: bool
) -> None:
    """A full memory_dir that turns the tier off says no space was left; one that the
    snapshots of the window did not meet (space freed by a prune) is no violation."""
    events = [
        _ev("attempt_started", 1),
        *([_ev("memory_tier_off", 1, reason=reason)] if reason else []),
        _ev("job_succeeded", 1),
    ]
    found = _full_memory(parse("max_restarts=0 shmfull:0:5:1"), 1, events, every)
    assert (found == []) is ok, found
    after_writers = parse("max_restarts=0 writerkill:-:3:1 shmfull:0:5:1")
    assert _full_memory(after_writers, 1, events, every) == []  # new writers start cold


@pytest.mark.parametrize("seed", range(100))
def test_a_full_memory_dir_ends_before_its_attempts_ending_fault(seed: int) -> None:
    """The window of a drawn shmfull lies before its attempt's ending fault, and never beside
    an aimed kill (the small tmpfs holds no ballast)."""
    s = draw(random.Random(f"12:{seed}"), kinds=KINDS)
    for f in s.faults:
        if f.kind == "shmfull":
            ending = s.ending(f.attempt)
            assert not ending or f.step + SHMFULL_STEPS < ending[0].step, s.text()
            assert not {"savekill", "snapkill"} & {g.kind for g in s.faults}, s.text()
    trainer = s.trainer_faults()
    assert ("shmfill" in trainer) == s.fills_memory == ("shmunfill" in trainer)


@pytest.mark.parametrize(
    ("ranks", "last_step", "ok"),
    [([0, 1], 12, True), ([1], 14, True), ([0], 10, False), ([0, 1], 15, False)],
)
def test_a_killed_zygote_is_a_crash_of_any_rank_near_the_step_struck(
    ranks: list[int], last_step: int, ok: bool
) -> None:
    """The zygote killed when the ranks were at step 12: a crash naming any of its ranks, the
    last step from 11 to 14."""
    found = _judge_aimed(
        "max_restarts=2 zygotekill:-:10:1", struck=12, last_step=last_step, ranks=ranks
    )
    assert (found == []) is ok, found


@pytest.mark.parametrize(("source", "reported"), [("memory", False), ("storage", True)])
def test_a_damaged_checkpoint_need_not_be_reported_when_the_next_attempt_resumes_from_memory(
    source: str, reported: bool
) -> None:
    """After a killed daemon whose newest storage checkpoint was then corrupted, the next
    attempt resuming from a newer snapshot reads no storage: the damage is not reported, and
    that is no violation; resuming from storage without reporting it is one."""
    loaded = "/dev/shm/x/step-0000000012" if source == "memory" else "/c/step-4"
    events = [
        _ev("attempt_started", 1),
        _ev("checkpoint_loaded", 1, resume_step=0, checkpoint=None),
        _ev("checkpoint_committed", 1, step=4, path="/c/step-4"),
        _ev("checkpoint_committed", 1, step=9, path="/c/step-9"),
        _ev("attempt_started", 2),
        _ev("checkpoint_loaded", 2, resume_step=13, checkpoint=loaded, source=source),
        _ev("job_succeeded", 2),
    ]
    found = check(
        parse("max_restarts=0 daemonkill:-:12:1 corrupt:-:0:1"),
        exit_codes=[-9, 0],
        events=events,
        save_killed={},
        damaged={1: "/c/step-9"},
        history="1 supervisor lost\n2 succeeded",
    )
    assert any("not reported skipped" in v for v in found) is reported, found


def test_a_later_load_of_a_snapshot_between_the_restore_and_the_onset_is_named() -> None:
    """Two attempts after a rollback to step 9 (onset 13, on at 16), a snapshot of step 11 holds
    steps the rollback skipped: loading it is named; one of step 16 or later is not."""
    s = parse("max_restarts=1 max_rollbacks=1 nan:0:13:1 kill:0:32:2")
    (r,) = s.rollbacks
    back = {"event": "rolled_back", "attempt": 1, "to_step": 9, "onset": 13, "resume_step": 16}
    shm = "/dev/shm/x/step-00000000"
    loads = [
        back,
        {"event": "checkpoint_loaded", "attempt": 2, "checkpoint": "/c/step-9", "source": "x"},
        {"event": "checkpoint_loaded", "attempt": 3, "checkpoint": shm + "11", "source": "memory"},
        {"event": "checkpoint_loaded", "attempt": 4, "checkpoint": shm + "31", "source": "memory"},
    ]
    assert _loads_after(r, back, loads, 0) == [
        f"attempt 3 loads {shm}11, discarded by the rollback"
    ]
