"""The committing writer may rename a save's directory (its commit) as soon as the last other
rank's marker has its name: that rank's writer must not touch the directory by its path
afterwards (it failed with FileNotFoundError under load, which turned the memory tier off for
the rest of the attempt)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker_sdk.checkpoint.background.writer import SaveJob, run_job, written_marker
from worker_sdk.contract.layout import committed_name, temp_name


def job_of_rank_1(directory: Path) -> SaveJob:
    """Rank 1's part of a 2-rank save of step 150 (rank 0 commits)."""
    tmp = directory / temp_name(150, "a1")
    tmp.mkdir()
    return SaveJob(
        step=150,
        directory=directory,
        tmp=tmp,
        rank=1,
        world_size=2,
        shared=None,
        part={"step": 150},
        dcp_items=None,
        dcp_metadata=None,
        objects=(),
        keep_last=2,
        attempt_tag="a1",
        replace=False,
        blocked_s=0.0,
        wait_s=10.0,
    )


def test_a_commit_right_after_the_marker_does_not_fail_the_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's writer commits (renames the directory) the moment rank 1's marker appears:
    rank 1's save is still done, its marker inside the committed directory."""
    job = job_of_rank_1(tmp_path)
    committed = tmp_path / committed_name(150)
    real_rename = os.rename

    def rename_then_commit(src: os.PathLike[str] | str, dst: os.PathLike[str] | str) -> None:
        real_rename(src, dst)
        if Path(dst) == written_marker(job.tmp, 1):  # what rank 0's writer waits for
            real_rename(job.tmp, committed)

    monkeypatch.setattr(os, "rename", rename_then_commit)
    answer = run_job(job, {})
    assert answer[0] == "done", answer
    assert (committed / written_marker(job.tmp, 1).name).exists()
