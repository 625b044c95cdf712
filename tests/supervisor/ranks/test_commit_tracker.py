"""The daemon's view of the checkpoint directory: checkpoints the ranks found damaged."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.ranks.checkpoints import CommitTracker
from tests.helpers.checkpoint_dirs import make_checkpoint
from worker_sdk.contract import layout


def _recommit(directory: Path, step: int, created: float) -> Path:
    """A new commit of ``step`` replacing the one there (as a rank that found it damaged does)."""
    path = directory / layout.committed_name(step)
    layout.discard(path)
    make_checkpoint(directory, step)
    manifest = json.loads((path / layout.MANIFEST).read_text())
    (path / layout.MANIFEST).write_text(json.dumps(manifest | {"created": created}))
    return path


def test_a_checkpoint_found_damaged_is_neither_newest_nor_listed(tmp_path: Path) -> None:
    """Marked damaged, step 23 leaves ``steps()`` and the newest falls back to step 19, also
    after a refresh from disk (whose manifests still check out for the daemon)."""
    make_checkpoint(tmp_path, 19, world_size=3)
    damaged = make_checkpoint(tmp_path, 23)
    tracker = CommitTracker(tmp_path)
    assert (tracker.newest_step, tracker.steps()) == (23, [23, 19])
    assert tracker.mark_damaged(damaged) == 23
    assert (tracker.newest_step, tracker.newest_world_size, tracker.steps()) == (19, 3, [19])
    tracker.refresh()
    assert (tracker.newest_step, tracker.steps()) == (19, [19])


def test_the_damaged_one_heard_again_stays_out_and_a_new_commit_of_its_step_counts(
    tmp_path: Path,
) -> None:
    """A late event of the damaged commit reports nothing; a new commit of the same step (the
    ranks replace a checkpoint they could not load) is reported and is the newest again."""
    make_checkpoint(tmp_path, 19)
    damaged = make_checkpoint(tmp_path, 23)
    tracker = CommitTracker(tmp_path)
    assert tracker.observe(damaged, seconds=None, source="watchdog") is not None
    tracker.mark_damaged(damaged)
    assert tracker.observe(damaged, seconds=None, source="watchdog") is None
    assert tracker.newest_step == 19
    fresh = _recommit(tmp_path, 23, created=99.0)
    commit = tracker.observe(fresh, seconds=0.1, source="sdk")
    assert commit is not None and commit.step == 23
    assert (tracker.newest_step, tracker.steps()) == (23, [23, 19])


def test_paths_elsewhere_are_not_marked(tmp_path: Path) -> None:
    """A skipped snapshot of the memory tier, or a name that is no committed checkpoint, leaves
    the checkpoint directory's view alone."""
    ckpt, shm = tmp_path / "ckpt", tmp_path / "shm"
    make_checkpoint(ckpt, 23)
    snapshot = make_checkpoint(shm, 23)
    tracker = CommitTracker(ckpt)
    assert tracker.mark_damaged(snapshot) is None
    assert tracker.mark_damaged(ckpt / "notes.txt") is None
    assert (tracker.newest_step, tracker.steps()) == (23, [23])


def test_a_rollback_past_the_damaged_one_forgets_it(tmp_path: Path) -> None:
    """``discard_from`` removes the damaged checkpoint with the others from its step on and
    the newest left is the newest undamaged one before it."""
    for step in (10, 19):
        make_checkpoint(tmp_path, step)
    tracker = CommitTracker(tmp_path)
    tracker.mark_damaged(tmp_path / layout.committed_name(19))
    make_checkpoint(tmp_path, 23)
    tracker.refresh()
    assert tracker.discard_from(20) == (23,)
    assert (tracker.newest_step, tracker.steps()) == (10, [10])
    assert tracker.discard_from(15) == (19,)
    assert tracker.damaged == {}
