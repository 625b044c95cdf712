"""Suite-wide guard: no test may leave a process behind.

Every process the suite starts inherits ``RVTEST_MARK`` (set here, before any test runs), so a
leftover is found even after it was orphaned and re-parented, or started by Slurm on our behalf.
The name is not ``RVSUP_*`` on purpose: the zygote is started without rvsup's variables, and a
rank forked from it shows the zygote's environment in ``/proc/PID/environ``, mark included.
Processes are also found by cgroup: every member of an rvsup job's cgroup v2 group
(``rvsup-PID``, made under the daemon's own group, which is this process's) is the suite's,
whatever its environment. After each process-level test, such processes that did not exist
before it are killed and the test fails; so does a job's group left populated.
Long-lived cluster daemons of a session fixture are exempt until the session ends, when a last
check exempts nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.process.cgroup import Group
from worker_sdk.spawn import cgroup as _cgroup

MARK = "RVTEST_MARK"
_DAEMONS = frozenset({"slurmctld", "slurmd", "slurmstepd", "munged", "slurmdbd", "mariadbd"})
os.environ[MARK] = uuid.uuid4().hex


def marked_processes(*, exempt_daemons: bool) -> dict[int, str]:
    """pid -> command line of every live process carrying this run's mark, or in a job's group."""
    me = os.getpid()
    grouped = set().union(*(job_group_members(g) for g in job_groups()))
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if exempt_daemons and proc.info["name"] in _DAEMONS:
                continue
            if proc.pid not in grouped and proc.environ().get(MARK) != os.environ[MARK]:
                continue
            found[proc.pid] = " ".join(proc.cmdline())[:200]
        except (psutil.Error, OSError):
            continue
    return found


_OWN_GROUP = _cgroup.own_group_dir()


def job_groups() -> list[Path]:
    """The rvsup jobs' cgroup v2 groups under this process's own (where rvsup makes them)."""
    if _OWN_GROUP is None:
        return []
    return sorted(Path(_OWN_GROUP).glob("rvsup-*"))


def job_group_members(group: Path) -> set[int]:
    """Every process in ``group`` or below it."""
    return Group(group).pids()


def _kill(pids: Iterator[int] | list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_PROCESS_DIRS = ("process", "slurm")


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves a process of its own behind (and kill it). Checked after every
    test that starts real processes (tests/process, tests/slurm; a scan costs ~0.06 s); for the
    rest, the check at the end of the session covers them."""
    if request.node.path.parent.name not in _PROCESS_DIRS:
        yield
        return
    before = set(marked_processes(exempt_daemons=True))
    groups_before = set(job_groups())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = {
            pid: cmd
            for pid, cmd in marked_processes(exempt_daemons=True).items()
            if pid not in before
        }
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    groups = _leaked_groups(set(job_groups()) - groups_before)
    if left:
        _kill(list(left))
        pytest.fail(f"test left {len(left)} process(es) behind: {left}")
    if groups:
        pytest.fail(f"test left rvsup cgroup(s) populated: {groups}")


def _leaked_groups(new: set[Path]) -> list[str]:
    """The new jobs' groups still populated (their processes are killed); the empty ones, left
    by a daemon that was killed itself, are removed."""
    populated = []
    for path in sorted(new):
        group = Group(path)
        if group.populated():
            populated.append(str(path))
        group.end()
    return populated


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture is torn down, nothing marked may be alive."""
    left = marked_processes(exempt_daemons=False)
    if left:
        _kill(list(left))
        print(f"\nrvsup test suite: killed {len(left)} leftover process(es): {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
