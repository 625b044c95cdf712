"""The daemon's side of the memory tier (supervisor/ranks/snapshots.py): the complete snapshots
read from their manifests, the resume choice, what rank 0 reports (the directory itself:
test_snapshot_home.py)."""

from __future__ import annotations

from pathlib import Path

from supervisor.ranks.snapshots import MemoryTier, SnapshotBook
from tests.helpers.checkpoint_dirs import make_checkpoint_v2
from tests.helpers.core_fakes import job_config
from worker_sdk.contract import layout
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p


def _tier(tmp_path: Path, setting: str = 'memory_every_steps = "auto"') -> MemoryTier:
    cfg = job_config(tmp_path, f'[checkpoint]\nmemory_dir = "{tmp_path / "shm"}"\n{setting}')
    return MemoryTier(cfg, _snapshots(tmp_path))


def _snapshots(tmp_path: Path) -> Path:
    """The job's snapshot directory (made by the daemon at its start: snapshot_home)."""
    return tmp_path / "shm" / "rvsup-snapshots"


def test_only_complete_snapshots_newer_than_storage_are_chosen(tmp_path: Path) -> None:
    """Torn (temporary) and damaged (a file missing) snapshots are not complete; the newest
    complete one newer than storage is chosen and named to the ranks."""
    tier = _tier(tmp_path)
    make_checkpoint_v2(_snapshots(tmp_path), 23)
    torn = make_checkpoint_v2(_snapshots(tmp_path), 25)
    torn.rename(_snapshots(tmp_path) / layout.temp_name(25, "a1"))
    damaged = make_checkpoint_v2(_snapshots(tmp_path), 24)
    (damaged / layout.rank_file(1)).unlink()
    assert tier.complete_steps() == [23]
    choice = tier.choose(19, nnodes=1, resume_before=None)
    assert (choice.source, choice.step) == ("memory", 23)
    env = tier.environment(choice)
    assert env[p.ENV_MEMORY_RESUME] == "23"
    assert env[p.ENV_MEMORY_DIR] == str(_snapshots(tmp_path))
    assert env[p.ENV_MEMORY_EVERY] == "auto"
    assert tier.choose(19, nnodes=2, resume_before=None).source == "storage"  # none on the node
    tier.remove()
    assert not _snapshots(tmp_path).exists()


def test_on_several_nodes_the_choice_reads_this_nodes_copies(tmp_path: Path) -> None:
    """Every node keeps its own copy in a folder named for its host: the choice reads this
    node's; a snapshot is a replica once a node that ran none of the previous attempt joins;
    the job's end takes the folder of every node this daemon sees."""
    tier = _tier(tmp_path)
    here = layout.node_folder(_snapshots(tmp_path))
    assert here.parent == _snapshots(tmp_path)
    make_checkpoint_v2(here, 30)
    make_checkpoint_v2(_snapshots(tmp_path) / "another-host", 31)
    assert tier.complete_steps(nnodes=2) == [30]
    assert tier.complete_steps() == []
    assert not tier.joining(("node1", "node2"))  # the daemon's first attempt
    choice = tier.choose(19, nnodes=2, resume_before=None, joining=False)
    assert (choice.source, choice.step) == ("memory", 30)
    assert tier.environment(choice)[p.ENV_MEMORY_DIR] == str(_snapshots(tmp_path))  # the ranks add
    assert tier.path_of(30, nnodes=2) == here / layout.committed_name(30)
    assert not tier.joining(("node1", "node2"))
    assert tier.joining(("node1", "node3"))  # node3 replaces node2
    replica = tier.choose(19, nnodes=2, resume_before=None, joining=True)
    assert (replica.source, replica.step) == ("replica", 30)
    assert tier.environment(replica)[p.ENV_MEMORY_RESUME] == "30"
    assert tier.world_size_of(tier.path_of(30, nnodes=2)) == 2
    tier.remove()
    assert not _snapshots(tmp_path).exists()


def test_one_node_after_several_takes_this_nodes_copies(tmp_path: Path) -> None:
    """launch.min_nnodes: an attempt on one node after attempts on several finds this node's
    copies where the ranks of one node look (moved, never over an existing one)."""
    tier = _tier(tmp_path)
    assert tier.gather_here() == ()
    here = layout.node_folder(_snapshots(tmp_path))
    for step in (30, 31):
        make_checkpoint_v2(here, step)
    make_checkpoint_v2(_snapshots(tmp_path), 31)
    assert tier.gather_here() == (30,)
    assert tier.complete_steps() == [31, 30]
    assert tier.complete_steps(nnodes=2) == [31]
    assert tier.choose(19, nnodes=1, resume_before=None).step == 31


def test_a_rollback_discards_the_snapshots_of_every_nodes_folder(tmp_path: Path) -> None:
    """On several nodes, the copies this daemon sees go too (the ranks of each node discard
    theirs after the next restore: worker_sdk.checkpoint.memory.load)."""
    tier = _tier(tmp_path)
    here = layout.node_folder(_snapshots(tmp_path))
    for step in (11, 12, 13):
        make_checkpoint_v2(here, step)
    assert tier.discard_from(12) == (12, 13)
    assert tier.complete_steps(nnodes=2) == [11]


def test_a_rollback_discards_the_snapshots_from_its_onset_on(tmp_path: Path) -> None:
    """The snapshots of the onset and later may hold the damage: discarded, so that no later
    attempt takes them as the newest; the attempt after the rollback resumes from storage."""
    tier = _tier(tmp_path)
    for step in (11, 12, 13, 14):
        make_checkpoint_v2(_snapshots(tmp_path), step)
    assert tier.discard_from(13) == (13, 14)
    assert tier.complete_steps() == [12, 11]
    assert tier.choose(9, nnodes=1, resume_before=13).source == "storage"
    assert tier.choose(9, nnodes=1, resume_before=None).step == 12


def test_off_means_no_snapshots_and_no_variables(tmp_path: Path) -> None:
    """memory_every_steps = "off": storage only, and the ranks are told nothing."""
    tier = _tier(tmp_path, 'memory_every_steps = "off"')
    make_checkpoint_v2(_snapshots(tmp_path), 23)
    choice = tier.choose(19, nnodes=1, resume_before=None)
    assert (choice.source, choice.step) == ("storage", 19)
    assert tier.environment(choice) == {}


def test_no_directory_means_storage_only(tmp_path: Path) -> None:
    """No directory could be made at the start: the tier is off, nothing is scanned."""
    cfg = job_config(tmp_path, f'[checkpoint]\nmemory_dir = "{tmp_path / "shm"}"')
    tier = MemoryTier(cfg, None)
    assert not tier.usable()
    assert tier.choose(19, nnodes=1, resume_before=None).source == "storage"
    assert (
        tier.discard_from(0),
        tier.gather_here(),
        tier.environment(tier.choose(None, nnodes=1, resume_before=None)),
    ) == ((), (), {})
    tier.remove()


def test_the_book_reports_a_pause_again_only_after_a_snapshot(tmp_path: Path) -> None:
    """A tier that paused for lack of room says so once; after a snapshot was taken, the same
    failure is news again (a new event)."""
    book = SnapshotBook()
    paused = "OSError: no space; snapshots pause and are tried again later in this attempt"
    assert book.heard(m.Snapshots(4, 0.01, 5, 100, 1, paused)) is not None
    assert book.heard(m.Snapshots(4, 0.01, 5, 100, 1, paused)) is None
    assert book.heard(m.Snapshots(9, 0.02, 6, 100, 1)) is None  # a snapshot taken since
    assert book.heard(m.Snapshots(9, 0.02, 6, 100, 1, paused)) is not None


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
