"""A warm standby with cgroups is used only once it has joined the group it waits in: the next
attempt may take it sooner (a restart at once, after an attempt that failed at once, while the
standby's Python still starts on a loaded machine), and its group is removed when it is taken."""

from __future__ import annotations

import os
import sys
import time
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


@pytest.mark.parametrize("joined", [True, False], ids=["joined", "not-yet-joined"])
def test_a_standby_is_used_only_once_it_is_in_its_group(
    tmp_path: Path, job_groups: JobGroups, joined: bool
) -> None:
    """Taken after its bootstrap joined ``standby-1``, the standby runs the attempt. Taken at
    once (its Python not started yet), it is dismissed and a fresh launcher runs the attempt;
    before, its group was removed under it and it exited 126, a crash that was none. Either
    way the attempt ends 0 with its rank in the attempt's group."""
    torchrun = Torchrun((str(Path(sys.executable).parent / "torchrun"),), sys.executable, "given")
    standby = Standby(torchrun)
    attempt = job_groups.attempt(1)
    plan = _plan(tmp_path, torchrun, attempt)
    standby.prepare(plan, cgroup=job_groups.standby)
    waiting = Group(job_groups.root / "standby-1")
    members: set[int] = set()
    if joined:
        deadline = time.monotonic() + 60
        while not (members := waiting.pids()):
            assert time.monotonic() < deadline, "the standby never joined its group"
            time.sleep(0.02)
    launched = standby.spawn(plan)
    try:
        assert launched.wait(timeout=120) == 0
    finally:
        if launched.poll() is None:
            launched.kill()
            launched.wait()
    assert (launched.pid in members) is joined
    ran_in = (tmp_path / "group.txt").read_text()
    assert attempt.endswith(ran_in), (attempt, ran_in)
    assert not waiting.path.exists()
    standby.close()
