"""The memory tier under rvsup (real torchrun, 2 DDP ranks on CPU/gloo): a crash resumes from the
newest complete snapshot in host memory, bit-identically and with fewer steps redone than storage
allows; a full tmpfs turns the tier off with an event and the job finishes; a killed daemon's
snapshots are used by the next start; the job's end removes them."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers import memory_cgroup
from tests.helpers.harness import events, named, running, rvsup, wait_for, write_job
from tests.helpers.jobs import snapshot_dir
from tests.helpers.states import assert_same_state, load_final
from tests.helpers.tmpfs import tmpfs
from worker_sdk.contract import layout

pytestmark = pytest.mark.process

# storage every 50 steps: a crash before step 49 has no storage checkpoint to resume from
_CHECKPOINT = 'every_steps = 50\nmemory_every_steps = 1\nmemory_dir = "{shm}"'


def _shm(tmp_path: Path) -> Path:
    """A folder every user may write, sticky (as /dev/shm): the tests' memory_dir."""
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    shm.chmod(0o1777)
    return shm


def _job(tmp_path: Path, shm: Path) -> tuple[Path, Path, Callable[[], Path | None], Path]:
    """The trainer's job with the memory tier in ``shm`` (made here, sticky as /dev/shm), how
    to find its snapshot directory once the daemon made it, and the file whose removal lets the
    ranks run at full speed (until then 0.3 s a step: a test aims at a snapshot, or waits for
    the tier's event, before the job ends, however loaded the machine)."""
    final = tmp_path / "final.pt"
    slow = tmp_path / "slow"
    slow.touch()
    job = write_job(
        tmp_path,
        env={"FINAL": str(final), "STEP_SLEEP": "0.3", "SLOW_WHILE": str(slow)},
        checkpoint=_CHECKPOINT.format(shm=shm),
    )
    return job, final, lambda: snapshot_dir(job), slow


def _assert_removed(job: Path) -> None:
    """The job's end removed its snapshot directory."""
    directory = snapshot_dir(job)
    assert directory is not None
    assert not directory.exists()


def _newest_snapshot(directory: Path | None, lowest: int) -> int | None:
    if directory is None:
        return None
    info = layout.latest(directory)
    return info.step if info is not None and info.step >= lowest else None


def test_snapshots_start_at_once_with_a_writer_forked_beside_each_rank(
    tmp_path: Path, reference_final: Path
) -> None:
    """The ranks are forked from the zygote, and so is each rank's snapshot writer, with torch
    imported: no wait for a writer to start, so a kill -9 of rank 1 after step 8, 0.8 s into
    the job, resumes from a snapshot of step 1 or later (a writer the rank starts itself,
    importing torch, takes longer than that here), bit-identically. The next attempt says it
    resumes from memory (attempt_started and checkpoint_loaded), redoes fewer steps than storage
    (none saved yet: all of them), the job's end removes the snapshots, and the history shows
    the steps lost next to the source."""
    final = tmp_path / "final.pt"
    job = write_job(
        tmp_path,
        env={"FINAL": str(final), "STEP_SLEEP": "0.1", "FAULT": "kill:1:8:1"},
        checkpoint=_CHECKPOINT.format(shm=_shm(tmp_path)),
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    evs = events(tmp_path / "run")
    assert not named(evs, "cold_start"), "the ranks were to be forked from the zygote"
    (failure,) = named(evs, "failure_detected")
    first, second = named(evs, "attempt_started")
    assert first["source"] is None
    assert second["source"] == "memory" and 2 <= second["resume_step"] <= 9, second
    directory = snapshot_dir(job)
    assert directory is not None and second["checkpoint"].startswith(str(directory))
    loaded = named(evs, "checkpoint_loaded")[-1]
    assert (loaded["source"], loaded["resume_step"]) == ("memory", second["resume_step"])
    redone = failure["last_step"] - (second["resume_step"] - 1)
    assert 0 <= redone < failure["last_step"] + 1  # storage-only: every step again
    summaries = named(evs, "memory_snapshots")
    assert summaries[0]["attempt"] == 1 and summaries[0]["count"] >= 1
    assert summaries[0]["interval"] == 1
    assert_same_state(load_final(reference_final), load_final(final))
    _assert_removed(job)
    table = rvsup("history", str(job)).stdout
    assert f"{redone} (memory)" in table


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs (root only): too small for any snapshot."""
    with tmpfs(tmp_path / "tiny", "16k") as mounted:
        yield mounted


def test_a_full_tmpfs_turns_the_tier_off_and_the_job_finishes(
    tmp_path: Path, tiny_tmpfs: Path, reference_final: Path
) -> None:
    """memory_dir on a tmpfs too small for a snapshot: a memory_tier_off event (no space), the
    storage checkpoints go on, the job succeeds bit-identical."""
    job, final, _, slow = _job(tmp_path, tiny_tmpfs)
    with running(job) as proc:
        wait_for(
            lambda: named(events(tmp_path / "run"), "memory_tier_off"),
            timeout=240,
            what="memory_tier_off",
        )
        slow.unlink()
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    evs = events(tmp_path / "run")
    (off,) = named(evs, "memory_tier_off")
    assert "space" in off["reason"].lower(), off
    assert named(evs, "checkpoint_committed")
    assert named(evs, "job_succeeded")
    assert_same_state(load_final(reference_final), load_final(final))


@pytest.mark.kills_daemon
def test_a_killed_daemons_snapshots_are_used_by_the_next_start(
    tmp_path: Path, reference_final: Path
) -> None:
    """SIGKILL of the daemon once a snapshot of step 5 or later is complete (its ranks die with
    it): the snapshots stay, and the next rvsup start resumes from the newest, bit-identical."""
    job, final, shm_dir, slow = _job(tmp_path, _shm(tmp_path))
    with running(job) as proc:
        wait_for(lambda: _newest_snapshot(shm_dir(), 5), timeout=240, what="a snapshot")
        tree = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        psutil.wait_procs(tree, timeout=30)
    slow.unlink()
    newest = _newest_snapshot(shm_dir(), 5)
    assert newest is not None
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    second = named(events(tmp_path / "run"), "attempt_started")[-1]
    assert second["source"] == "memory" and second["resume_step"] >= newest + 1
    assert_same_state(load_final(reference_final), load_final(final))
    _assert_removed(job)


@pytest.mark.parametrize(("ballast_mb", "fits"), [(150, False), (0, True)])
def test_the_tier_takes_only_the_memory_the_jobs_limit_leaves(
    tmp_path: Path, ballast_mb: int, fits: bool
) -> None:
    """The job in a memory cgroup limited to 1.5 GB (root; skipped otherwise), a snapshot every
    step: with 150 MB more state per rank, the snapshots (about 1.3 GB on the node) do not fit
    what the limit leaves, and without the room check the kernel's OOM killer kills a rank at
    every attempt until the job gives up; with it the tier turns off with the figures and the
    job finishes, no failure. With the small state the snapshots fit, and are taken."""
    job = write_job(
        tmp_path,
        total=30,
        env={"BALLAST_MB": str(ballast_mb), "STEP_SLEEP": "0.05"},
        checkpoint=f'every_steps = 50\nmemory_every_steps = 1\nmemory_dir = "{_shm(tmp_path)}"',
    )
    with memory_cgroup.limited(1500 * 2**20, "room-test") as group:
        res = memory_cgroup.start_in(group, job, timeout=240)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert not named(evs, "failure_detected")
    offs = named(evs, "memory_tier_off")
    (summary,) = named(evs, "memory_snapshots")
    if fits:
        assert not offs and summary["count"] >= 1, (offs, summary)
    else:
        (off,) = offs
        assert off["reason"].startswith("not enough memory for snapshots"), off
        assert "memory limit of cgroup" in off["reason"] and summary["count"] == 0
