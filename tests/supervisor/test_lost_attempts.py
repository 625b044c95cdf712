"""What the next ``rvsup start`` writes for an attempt whose supervisor was lost."""

from __future__ import annotations

from pathlib import Path

from supervisor.daemon import close_lost_attempts
from supervisor.record import history
from supervisor.record.events import EventLog
from supervisor.record.schema import (
    AttemptClosed,
    CheckpointCommitted,
    JobSucceeded,
)
from tests.helpers.checkpoint_dirs import make_checkpoint
from tests.helpers.events import attempt_started, job_started
from worker_sdk.contract.layout import MANIFEST


def _committed(log: EventLog, attempt: int, path: Path, step: int) -> None:
    log.log(
        CheckpointCommitted(step=step, path=str(path), seconds=0.1, bytes=1, source="sdk"),
        attempt=attempt,
    )


def test_commits_the_lost_supervisor_never_logged_are_logged_before_the_close(
    tmp_path: Path,
) -> None:
    """The ranks committed steps 19 and 29 after their supervisor last logged a commit (9), and
    a torn step 39: the next start logs 19 and 29 as ``checkpoint_committed`` (source "found",
    in the lost attempt), never the torn one nor 9 again, then closes the attempt."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    log = EventLog(run, "toy", console=None)
    log.log(job_started(), attempt=0)
    log.log(attempt_started(0), attempt=1)
    paths = {step: make_checkpoint(ckpt, step) for step in (9, 19, 29, 39)}
    (paths[39] / MANIFEST).write_text("{torn")
    _committed(log, 1, paths[9], 9)
    log.log(job_started(), attempt=0)  # the next start
    before = len(history.read(log.path).entries)
    close_lost_attempts(log, history.read(log.path).entries, run, ckpt)
    log.close()
    new = history.read(log.path).entries[before:]
    assert [(e.attempt, type(e.event)) for e in new] == [
        (1, CheckpointCommitted),
        (1, CheckpointCommitted),
        (1, AttemptClosed),
    ]
    found = [e.event for e in new if isinstance(e.event, CheckpointCommitted)]
    assert [(c.step, c.path, c.source, c.world_size) for c in found] == [
        (19, str(paths[19]), "found", 2),
        (29, str(paths[29]), "found", 2),
    ]
    (row,) = history.attempt_rows(history.read(log.path).entries)
    assert (row.outcome, row.checkpoint_step) == ("supervisor lost", 29)


def test_nothing_is_found_when_no_attempt_was_lost(tmp_path: Path) -> None:
    """A history whose attempts all ended: nothing is logged, whatever lies on disk."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    log = EventLog(run, "toy", console=None)
    log.log(job_started(), attempt=0)
    log.log(attempt_started(0), attempt=1)
    log.log(JobSucceeded(last_step=9), attempt=1)
    make_checkpoint(ckpt, 19)
    before = len(history.read(log.path).entries)
    close_lost_attempts(log, history.read(log.path).entries, run, ckpt)
    log.close()
    assert len(history.read(log.path).entries) == before
