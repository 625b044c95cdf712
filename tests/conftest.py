"""Suite-wide guard: no test may leave a process behind.

The test process is the subreaper of everything it starts, so every process a test started is
found as one of its descendants, forked, double-forked or ``setsid()``-ed ones included; the
processes started for it outside its tree are found by the ``RVTEST_MARK`` variable (set here,
before any test runs): ``tests/helpers/process_guard.py`` says why and how. After each process-level
test, such processes that did not exist before it are killed and the test fails (a job's cgroup
left populated holds such processes: they are ours, whatever group they are in); the empty groups
of rvsup daemons killed by a test are removed (each pytest process is in a cgroup of its own,
so that it sees only the daemons its own tests killed: ``tests/helpers/cgroup_scope.py``).
Long-lived cluster daemons of a session fixture (and what they run) are exempt until the
session ends, when a last check exempts nothing.

Under pytest-xdist (``-n``) every worker imports this module: each is the subreaper of what its
own tests start and draws a marker value of its own, so one worker never takes the other's
processes for its leftovers. A worker's last check is reported by the controller (a worker's
output is not shown), which checks last of all, once its workers are gone, for what a worker that
died may have left to it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cgroup_scope import enter_own_group
from tests.helpers.process_guard import ProcessGuard, guard
from worker_sdk.spawn import cgroup as _cgroup
from worker_sdk.spawn.cgroup import Group

pytest_plugins = (  # see each module
    "tests.helpers.fixtures",
    "tests.helpers.phases",
    "tests.helpers.torchless",
)

MARK = "RVTEST_MARK"
_DAEMONS = frozenset({"slurmctld", "slurmd", "slurmstepd", "munged", "slurmdbd", "mariadbd"})
os.environ[MARK] = uuid.uuid4().hex  # this process's own value: an xdist worker replaces its
# controller's (which /proc/PID/environ still shows for the worker itself, never for its children)
_LEFT = "rvtest_leftovers"  # the key of a worker's last check in what it hands its controller
_workers_left: dict[int, str] = {}
GUARD: ProcessGuard = guard(mark=(MARK, os.environ[MARK]), exempt=_DAEMONS)


def marked_processes(*, exempt_daemons: bool) -> dict[int, str]:
    """pid -> command line of every live process the suite started (see the module)."""
    return GUARD.processes(exempt=exempt_daemons)


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves a process of its own behind (and kill it). Checked after every
    test that starts real processes (marked ``process`` or ``slurm``; a scan costs ~0.06 s); for
    the rest, the check at the end of the session covers them."""
    if not any(request.node.get_closest_marker(name) for name in ("process", "slurm")):
        yield
        return
    before = set(GUARD.processes(exempt=True))
    stale_before = {group.path for group in _stale_groups()}
    yield
    left = GUARD.check(before, grace_s=5.0)
    for group in _stale_groups():
        if group.path not in stale_before and not group.populated():
            group.remove()
    if left:
        pytest.fail(f"test left {len(left)} process(es) behind: {left}")


_OWN_GROUP = enter_own_group()  # a group per process: tests/helpers/cgroup_scope.py


def _stale_groups() -> list[Group]:
    """The job groups beside ours (where rvsup makes them) whose daemon is gone."""
    if _OWN_GROUP is None:
        return []
    return _cgroup.stale_groups(Path(_OWN_GROUP), "rvsup-")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist controller) Keep what a worker's last check found and ended."""
    _workers_left.update(getattr(node, "workeroutput", {}).get(_LEFT, {}))


@pytest.hookimpl(trylast=True)  # an xdist controller's workers are gone by then
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture is torn down, nothing of ours may be alive. The daemonic children
    of ``multiprocessing`` (a DataLoader's workers, forked from this process by an in-process
    test whose objects live on) are ended first, as ``multiprocessing`` ends them at exit
    anyway, with the session's SIGCHLD watch of the DataLoaders put back to its default. An
    xdist worker hands what it found to its controller, which reports it with its own."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.terminate()
            child.join(5)
    gc.collect()
    left = GUARD.leftovers((), exempt=False, grace_s=5.0)
    GUARD.end(left)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_LEFT] = left
        return
    left |= _workers_left
    if left:
        print(f"\nrvsup test suite: killed {len(left)} leftover process(es): {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
