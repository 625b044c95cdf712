"""Failure details name the exact step, not the last rate-limited heartbeat's: every rank stores
its last finished step into a shared-memory slot that the supervisor reads on its node."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.harness import events, named, rvsup, write_job

pytestmark = pytest.mark.process


def test_a_killed_rank_is_reported_at_the_step_it_had_just_finished(tmp_path: Path) -> None:
    """Rank 1 SIGKILLs itself at the start of step 143 while heartbeats go out once a second and
    steps take milliseconds: the failure says step 142 exactly (heartbeats alone said up to a
    second's worth of steps earlier), and the restart resumes from the checkpoint of step 139."""
    job = write_job(
        tmp_path,
        total=200,
        env={"FAULT": "kill:1:143:1"},
        heartbeat='interval = "1s"\nstartup_timeout = "60s"',
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    (failure,) = named(evs, "failure_detected")
    assert failure["kind"] == "crash"
    assert failure["ranks"][0] == 1
    assert "rank 1 killed by SIGKILL at step 142" in failure["detail"], failure["detail"]
    # rank 0 was running step 143 when its all-reduce broke (its own report says so)
    assert failure["last_step"] in (142, 143), failure
    assert named(evs, "attempt_started")[-1]["resume_step"] == 140
