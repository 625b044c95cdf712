"""Out of memory: reported by the SDK, found in stderr, or a kernel OOM kill; the next attempt is told."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import memory_cgroup
from tests.helpers.harness import events, named, rvsup, write_job

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
def limited_cgroup() -> Iterator[Path]:
    """A child memory cgroup limited to 400 MB (removed afterwards)."""
    with memory_cgroup.limited(400 * 2**20, "oom-test") as group:
        yield group


# an OOM kill counts host-wide (/proc/vmstat): another test's SIGKILL meanwhile is taken for one
@pytest.mark.serial
def test_kernel_oom_kill_in_a_memory_cgroup_is_classified_oom(
    tmp_path: Path, limited_cgroup: Path
) -> None:
    """A rank killed by the kernel's OOM killer (cgroup limit), not by an exception: kind oom."""
    job = write_job(
        tmp_path, env={"FAULT": "hostoom:1:4:1", "OOM_CGROUP": str(limited_cgroup)}, total=8
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    failures = named(events(tmp_path / "run"), "failure_detected")
    assert [f["kind"] for f in failures] == ["oom"], failures
    assert failures[0]["signals"][0] == "SIGKILL"
