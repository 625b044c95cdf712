"""The daemon's side of the memory tier (supervisor/ranks/snapshots.py): the directory, the
complete snapshots read from their manifests, the resume choice, what rank 0 reports."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.ranks.snapshots import MemoryTier, SnapshotBook, snapshot_dir
from tests.helpers.checkpoint_dirs import make_checkpoint_v2
from tests.helpers.core_fakes import job_config
from worker_sdk.contract import layout
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p


def _tier(tmp_path: Path, setting: str = 'memory_every_steps = "auto"') -> MemoryTier:
    cfg = job_config(tmp_path, f'[checkpoint]\nmemory_dir = "{tmp_path / "shm"}"\n{setting}')
    return MemoryTier(cfg)


def test_the_directory_is_the_jobs_own(tmp_path: Path) -> None:
    """The snapshot directory is inside memory_dir, named for the user and the run directory."""
    tier = _tier(tmp_path)
    assert tier.directory.parent == tmp_path / "shm"
    assert tier.directory.name.startswith(f"rvsup-{os.getuid()}-")
    (tmp_path / "other").mkdir()
    assert snapshot_dir(job_config(tmp_path / "other")) != snapshot_dir(job_config(tmp_path))


def test_only_complete_snapshots_newer_than_storage_are_chosen(tmp_path: Path) -> None:
    """Torn (temporary) and damaged (a file missing) snapshots are not complete; the newest
    complete one newer than storage is chosen and named to the ranks."""
    tier = _tier(tmp_path)
    make_checkpoint_v2(tier.directory, 23)
    torn = make_checkpoint_v2(tier.directory, 25)
    torn.rename(tier.directory / layout.temp_name(25, "a1"))
    damaged = make_checkpoint_v2(tier.directory, 24)
    (damaged / layout.rank_file(1)).unlink()
    assert tier.complete_steps() == [23]
    choice = tier.choose(19, nnodes=1, resume_before=None)
    assert (choice.source, choice.step) == ("memory", 23)
    env = tier.environment(choice)
    assert env[p.ENV_MEMORY_RESUME] == "23"
    assert env[p.ENV_MEMORY_DIR] == str(tier.directory)
    assert env[p.ENV_MEMORY_EVERY] == "auto"
    assert tier.choose(19, nnodes=2, resume_before=None).source == "storage"
    tier.remove()
    assert not tier.directory.exists()


def test_a_rollback_discards_the_snapshots_from_its_onset_on(tmp_path: Path) -> None:
    """The snapshots of the onset and later may hold the damage: discarded, so that no later
    attempt takes them as the newest; the attempt after the rollback resumes from storage."""
    tier = _tier(tmp_path)
    for step in (11, 12, 13, 14):
        make_checkpoint_v2(tier.directory, step)
    assert tier.discard_from(13) == (13, 14)
    assert tier.complete_steps() == [12, 11]
    assert tier.choose(9, nnodes=1, resume_before=13).source == "storage"
    assert tier.choose(9, nnodes=1, resume_before=None).step == 12


def test_off_means_no_snapshots_and_no_variables(tmp_path: Path) -> None:
    """memory_every_steps = "off": storage only, and the ranks are told nothing."""
    tier = _tier(tmp_path, 'memory_every_steps = "off"')
    make_checkpoint_v2(tier.directory, 23)
    choice = tier.choose(19, nnodes=1, resume_before=None)
    assert (choice.source, choice.step) == ("storage", 19)
    assert tier.environment(choice) == {}


def test_the_book_sums_up_the_attempt_and_reports_the_tier_off_once(tmp_path: Path) -> None:
    """The newest summary wins; the first report of a failure is an event, later ones not."""
    book = SnapshotBook()
    assert book.summary() is None
    assert book.heard(m.Snapshots(4, 0.01, 5, 100, 1)) is None
    off = book.heard(m.Snapshots(7, 0.02, 8, 100, 1, "OSError: no space"))
    assert off is not None and off.reason == "OSError: no space"
    assert book.heard(m.Snapshots(7, 0.02, 8, 100, 1, "OSError: no space")) is None
    summary = book.summary()
    assert summary is not None
    assert (summary.count, summary.newest_step, summary.blocked_s) == (8, 7, 0.02)
