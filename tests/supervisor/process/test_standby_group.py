"""A warm standby with cgroups waits in the group of the attempt it is for, placed there when it
is started: the next attempt may take it at once (a restart after an attempt that failed at
once, while the standby's Python still starts on a loaded machine)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from supervisor.config.torchrun import Torchrun
from supervisor.process.cgroup import JobGroups
from supervisor.process.launch_plan import LaunchPlan
from supervisor.process.launcher import Standby
from worker_sdk.spawn.cgroup import Group

pytestmark = pytest.mark.process

# the rank: writes its cgroup v2 group ("0::/path" in /proc/self/cgroup) where it is told
_RANK = """
import sys
line = next(l for l in open("/proc/self/cgroup") if l.startswith("0::"))
open(sys.argv[1], "w").write(line[3:].strip())
"""


def _plan(tmp_path: Path, torchrun: Torchrun, attempt: str) -> LaunchPlan:
    rank = tmp_path / "rank.py"
    rank.write_text(_RANK)
    args = ("--nproc-per-node=1", "--standalone", str(rank), str(tmp_path / "group.txt"))
    return LaunchPlan(
        argv=(*torchrun.argv, *args),
        env=dict(os.environ),
        cwd=tmp_path,
        log_dir=tmp_path / "logs",
        nnodes=1,
        nproc_per_node=1,
        cgroup=attempt,
    )


@pytest.mark.parametrize("taken_by", [2, 3], ids=["its-attempt", "another-attempt"])
def test_a_standby_waits_in_the_group_of_the_attempt_it_is_for(
    tmp_path: Path, job_groups: JobGroups, taken_by: int
) -> None:
    """Prepared while attempt 1 runs, the standby is placed in attempt 2's group before
    ``prepare`` returns (nothing moves it later; before, it waited in a group of its own, was
    moved when taken, and a standby taken at once exited 126 or ran outside the attempt's
    group). Taken at once by attempt 2, it runs it, its rank in that group; any other attempt
    dismisses it (its group ended) and a fresh launcher runs in that attempt's group."""
    torchrun = Torchrun((str(Path(sys.executable).parent / "torchrun"),), sys.executable, "given")
    standby = Standby(torchrun)
    running = _plan(tmp_path, torchrun, job_groups.attempt(1))
    standby.prepare(running, cgroup=job_groups.attempt(2))
    waiting = Group(Path(job_groups.attempt(2)))
    members = waiting.pids()
    assert members, "the standby is not in its attempt's group"
    attempt = job_groups.attempt(taken_by)
    launched = standby.spawn(_plan(tmp_path, torchrun, attempt))
    try:
        assert launched.wait(timeout=120) == 0
    finally:
        if launched.poll() is None:
            launched.kill()
            launched.wait()
    assert (launched.pid in members) is (taken_by == 2)
    ran_in = (tmp_path / "group.txt").read_text()
    assert attempt.endswith(ran_in), (attempt, ran_in)
    if taken_by != 2:
        assert not waiting.path.exists()
    standby.close()
