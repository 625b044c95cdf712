"""Out of memory: reported by the SDK, found in stderr, or a kernel OOM kill; the next attempt is told."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import memory_cgroup
from tests.helpers.harness import events, named, running, rvsup, wait_progress, write_job

pytestmark = pytest.mark.process


def _rank_logs(run_dir: Path, attempt: int) -> str:
    logs = sorted((run_dir / "logs" / f"attempt-{attempt}").glob("**/stdout.log"))
    return "\n".join(p.read_text() for p in logs)


def test_sdk_reported_oom_is_classified_and_the_next_attempt_is_told(tmp_path: Path) -> None:
    """torch.OutOfMemoryError in rank 1: kind oom (message kept), and the restarted ranks see
    RVSUP_LAST_FAILURE=oom and RVSUP_OOM_COUNT=1 in their environment."""
    job = write_job(tmp_path, env={"FAULT": "oom:1:4:1"}, total=20)
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    failures = named(evs, "failure_detected")
    assert [f["kind"] for f in failures] == ["oom"]
    assert failures[0]["ranks"][0] == 1 and "Tried to allocate" in failures[0]["detail"]
    assert "after oom ooms 1" in _rank_logs(tmp_path / "run", 2)


def test_on_oom_fail_gives_up_after_the_first(tmp_path: Path) -> None:
    """on_oom = "fail": the first OOM ends the job with exit 3; no budget is burnt on retries."""
    job = write_job(
        tmp_path,
        env={"FAULT": "oom:0:3:*"},
        restart='max_restarts = 5\nbackoff = "0.1s"\non_oom = "fail"',
    )
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 3, res.stderr
    evs = events(tmp_path / "run")
    assert len(named(evs, "attempt_started")) == 1
    assert "on_oom" in named(evs, "job_gave_up")[0]["reason"]


def test_oom_before_the_sdk_is_found_in_stderr(tmp_path: Path) -> None:
    """An OutOfMemoryError raised before resume() (no SDK report): recognised from stderr."""
    job = write_job(tmp_path, env={"OOM_BEFORE_RESUME": "1"}, total=10)
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    kinds = [f["kind"] for f in named(events(tmp_path / "run"), "failure_detected")]
    assert kinds == ["oom"]


@pytest.fixture
def memory_cgroup_here() -> None:
    """Skips where this process has no memory cgroup it may make groups in (root, a memory
    controller)."""
    own = memory_cgroup.own_memory_cgroup()
    if own is None or not os.access(own, os.W_OK):
        pytest.skip("no writable memory cgroup on this machine")


@pytest.mark.usefixtures("memory_cgroup_here")
def test_kernel_oom_kill_in_a_memory_cgroup_is_classified_oom(tmp_path: Path) -> None:
    """A rank killed by the kernel's OOM killer (the limit of a memory cgroup it made below its
    own), not by an exception: kind oom, counted among the job's processes, not host-wide."""
    job = write_job(
        tmp_path, env={"FAULT": "hostoom:1:4:1", "OOM_LIMIT_BYTES": str(400 * 2**20)}, total=8
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    failures = named(events(tmp_path / "run"), "failure_detected")
    assert [f["kind"] for f in failures] == ["oom"], failures
    assert failures[0]["signals"][0] == "SIGKILL"
    assert "of the job's processes" in failures[0]["detail"], failures[0]
    assert "host-wide" not in failures[0]["detail"], failures[0]


@pytest.mark.usefixtures("memory_cgroup_here")
def test_a_neighbours_oom_kill_is_not_this_jobs(tmp_path: Path) -> None:
    """On a shared node another job's process is killed by the OOM killer (its own memory
    cgroup's limit) while this job trains, then a rank of this job is killed with SIGKILL: a
    crash, not an OOM (the host's counter, which rvsup read before, counts the neighbour's
    kill; ``on_oom = "fail"`` would have ended the job with exit 3)."""
    job = write_job(
        tmp_path,
        env={"STEP_SLEEP": "0.2"},
        total=40,
        restart='max_restarts = 2\nbackoff = "0s"\non_oom = "fail"',
    )
    with running(job) as proc:
        ranks = wait_progress(job, min_step=3)["ranks"]
        with memory_cgroup.limited(64 * 2**20, "neighbour") as group:
            neighbour = subprocess.run(
                [
                    "sh",
                    "-c",
                    f'echo $$ > "{group}/cgroup.procs" && exec "$0" -c "$1"',
                    sys.executable,
                    "b = []\nwhile True: b.append(bytearray(16 << 20))",
                ],
                capture_output=True,
                timeout=120,
                check=False,
            )
        assert neighbour.returncode == -signal.SIGKILL, neighbour  # the OOM killer's
        os.kill(next(r["pid"] for r in ranks if r["rank"] == 1), signal.SIGKILL)
        assert proc.wait(timeout=180) == 0
    failures = named(events(tmp_path / "run"), "failure_detected")
    assert [f["kind"] for f in failures] == ["crash"], failures
