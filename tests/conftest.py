"""Suite-wide guard: no test may leave a process behind.

Every process the suite starts inherits ``RVSUP_TEST_MARK`` (set here, before any test runs), so a
leftover is found even after it was orphaned and re-parented, or started by Slurm on our behalf.
After each process-level test, marked processes that did not exist before it are killed and the
test fails.
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

import psutil
import pytest

MARK = "RVSUP_TEST_MARK"
_DAEMONS = frozenset({"slurmctld", "slurmd", "slurmstepd", "munged", "slurmdbd", "mariadbd"})
os.environ[MARK] = uuid.uuid4().hex


def marked_processes(*, exempt_daemons: bool) -> dict[int, str]:
    """pid -> command line of every live process carrying this run's mark."""
    me = os.getpid()
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if exempt_daemons and proc.info["name"] in _DAEMONS:
                continue
            if proc.environ().get(MARK) != os.environ[MARK]:
                continue
            found[proc.pid] = " ".join(proc.cmdline())[:200]
        except (psutil.Error, OSError):
            continue
    return found


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
    if left:
        _kill(list(left))
        pytest.fail(f"test left {len(left)} process(es) behind: {left}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture is torn down, nothing marked may be alive."""
    left = marked_processes(exempt_daemons=False)
    if left:
        _kill(list(left))
        print(f"\nrvsup test suite: killed {len(left)} leftover process(es): {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
