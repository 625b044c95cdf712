"""Process-tree facilities on real processes: teardown, zombie exit status, pidfds, OOM count."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest

from supervisor.process.proctree import (
    ExitStatus,
    become_subreaper,
    descendants,
    open_pidfd,
    teardown,
    zombie_wait_status,
)
from tests.helpers.process_guard import guard

pytestmark = pytest.mark.process

# The tree: P (our child) -> A (ignores SIGTERM, does not reap) -> G (grandchild),
#                         -> B (stopped with SIGSTOP)
#                         -> C (plain)
# A tells P the pid of G; P prints one JSON line with every pid once the tree is ready.
_SLEEPER = "import time\ntime.sleep(120)\n"
_STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(g.pid, flush=True)
    time.sleep(120)
    """
)
_PARENT = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    stubborn, sleeper = sys.argv[1], sys.argv[2]
    a = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True)
    g = int(a.stdout.readline())
    b = subprocess.Popen([sys.executable, "-c", sleeper])
    c = subprocess.Popen([sys.executable, "-c", sleeper])
    os.kill(b.pid, signal.SIGSTOP)
    print(json.dumps({"A": a.pid, "G": g, "B": b.pid, "C": c.pid}), flush=True)
    time.sleep(120)
    """
)


@contextlib.contextmanager
def _as_subreaper() -> Iterator[None]:
    """This test process as a child subreaper (as the daemon is; the suite's guard made it one
    already), its guard's reaping paused for the block: what is reaped there, teardown reaped."""
    assert become_subreaper()
    with guard().reaping_paused():
        yield


def _our_children() -> set[int]:
    return {c.pid for c in psutil.Process().children()}


def _force_cleanup(pids: list[int]) -> None:
    """Kill and reap whatever of ``pids`` is left (nothing, unless the test failed)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def _wait_status(pid: int, wanted: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != wanted:
        assert time.monotonic() < deadline, f"{pid} never became {wanted}"
        time.sleep(0.01)


@contextlib.contextmanager
def _tree(*argv: str) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """``python -c *argv`` as our child (stdout piped) while we are a subreaper; on exit,
    whatever is left of the yielded pid list is killed and reaped."""
    with _as_subreaper():
        proc = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE)
        pids = [proc.pid]
        try:
            yield proc, pids
        finally:
            _force_cleanup(pids)
            assert proc.stdout is not None
            proc.stdout.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _first_line(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().decode()


@pytest.mark.serial  # bounds in seconds
def test_teardown_of_a_tree() -> None:
    """Stopped and SIGTERM-ignoring members die (the latter by SIGKILL at the deadline), every
    process of the tree is gone and reaped, and the Popen keeps its real exit status."""
    with _tree(_PARENT, _STUBBORN, _SLEEPER) as (parent, pids):
        tree: dict[str, int] = json.loads(_first_line(parent))
        pids += tree.values()  # noqa: PLW2901 -- registers them for the fixture's clean-up
        _wait_status(tree["B"], psutil.STATUS_STOPPED)
        assert descendants(parent.pid) == set(tree.values())

        report = teardown([parent.pid], term_timeout_s=1.0, kill_timeout_s=5.0, popens=[parent])

        assert report.signalled == 5
        assert report.killed >= 1  # the stubborn one, at the deadline
        assert report.leftover == 0
        assert 1.0 <= report.seconds < 6.0
        assert parent.returncode == -signal.SIGTERM
        mine = _our_children()
        for name, pid in {"P": parent.pid, **tree}.items():
            assert pid not in mine, f"{name} ({pid}) is still a child of ours (a zombie)"
            assert not psutil.pid_exists(pid), f"{name} ({pid}) still exists"


_GENTLE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    c, s = subprocess.Popen(argv), subprocess.Popen(argv)
    os.kill(s.pid, signal.SIGSTOP)
    print(c.pid, s.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.serial  # bounds in seconds
def test_teardown_gentle_tree_needs_no_kill() -> None:
    """Processes that obey SIGTERM, a stopped one included (it is continued), are gone well
    before the deadline; nobody is SIGKILLed."""
    with _tree(_GENTLE) as (parent, pids):
        child, stopped = (int(x) for x in _first_line(parent).split())
        pids += [child, stopped]
        _wait_status(stopped, psutil.STATUS_STOPPED)
        report = teardown([], term_timeout_s=20.0, popens=[parent])
        assert (report.signalled, report.killed, report.leftover) == (3, 0, 0)
        assert report.seconds < 10.0
        assert parent.returncode == -signal.SIGTERM
        assert not any(psutil.pid_exists(pid) for pid in pids)


_LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, lambda *_: time.sleep(30))  # shuts down slowly, as torchrun
    w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(w.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.serial  # bounds in seconds
def test_teardown_does_not_wait_for_a_launcher_once_its_workers_are_gone() -> None:
    """Given its workers, a teardown SIGKILLs a launcher that is slow to shut down as soon as the
    workers obeyed SIGTERM, instead of waiting out the deadline."""
    with _tree(_LAUNCHER) as (parent, pids):
        worker = int(_first_line(parent))
        pids.append(worker)
        report = teardown([worker], term_timeout_s=20.0, popens=[parent], workers=[worker])
        assert (report.signalled, report.killed, report.leftover) == (2, 1, 0)
        assert report.seconds < 3.0
        assert parent.returncode == -signal.SIGKILL
        assert not any(psutil.pid_exists(pid) for pid in pids)


_NOISY_LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    def noted(*_):
        print("SIGTERM", flush=True)  # torchrun logs its shutdown
    signal.signal(signal.SIGTERM, noted)
    w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(w.pid, flush=True)
    time.sleep(120)
    """
)


def test_a_spared_launcher_gets_no_sigterm_only_the_kill() -> None:
    """A spared process (a single-node torchrun) is not sent SIGTERM, which would only make it
    log its shutdown: its workers are, and once they are gone it is SIGKILLed."""
    with _tree(_NOISY_LAUNCHER) as (parent, pids):
        worker = int(_first_line(parent))
        pids.append(worker)
        report = teardown(
            [worker],
            term_timeout_s=20.0,
            popens=[parent],
            workers=[worker],
            spared=[parent.pid],
        )
        assert (report.signalled, report.killed, report.leftover) == (2, 1, 0)
        assert parent.returncode == -signal.SIGKILL
        assert parent.stdout is not None
        assert parent.stdout.read() == b""  # it never saw a SIGTERM
        assert not any(psutil.pid_exists(pid) for pid in pids)


_SLOW_PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    def leave(signum, frame):
        time.sleep(0.5)  # still cleaning up when the zombie child is first looked at
        os._exit(0)
    signal.signal(signal.SIGTERM, leave)
    g = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once, never reaped here
    while open(f"/proc/{g.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    print(g.pid, flush=True)
    time.sleep(120)
    """
)


def test_teardown_reaps_zombie_inherited_during_teardown() -> None:
    """A child's unreaped zombie, handed to us when that child exits during teardown, is reaped
    before teardown returns (no zombie of ours survives)."""
    with _tree(_SLOW_PARENT) as (parent, pids):
        zombie = int(_first_line(parent))
        pids.append(zombie)
        assert psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE
        report = teardown([], term_timeout_s=10.0, popens=[parent])
        assert (report.signalled, report.killed, report.leftover) == (2, 0, 0)
        assert parent.returncode == 0
        assert zombie not in _our_children(), "the inherited zombie was not reaped"
        assert not psutil.pid_exists(zombie)


_ZOMBIE_MAKER = textwrap.dedent(
    """
    import os, signal, sys, time
    kids = []
    for how in ("exit", "kill"):
        pid = os.fork()
        if pid == 0:
            if how == "exit":
                os._exit(7)
            time.sleep(120)
            os._exit(0)
        kids.append(pid)
    os.kill(kids[1], signal.SIGKILL)
    print(kids[0], kids[1], flush=True)
    sys.stdin.read()  # keep both as zombies until told to go
    for pid in kids:
        os.waitpid(pid, 0)
    """
)


def test_zombie_wait_status_of_a_non_child() -> None:
    """The raw wait status of another process's zombie is read from /proc: exit 7, SIGKILL."""
    helper = subprocess.Popen(
        [sys.executable, "-c", _ZOMBIE_MAKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert helper.stdout is not None and helper.stdin is not None
        exited, killed = (int(x) for x in helper.stdout.readline().split())
        _wait_status(exited, psutil.STATUS_ZOMBIE)
        _wait_status(killed, psutil.STATUS_ZOMBIE)
        assert exited not in _our_children()
        status = zombie_wait_status(exited)
        assert status == 7 << 8
        assert ExitStatus.from_wait_status(status) == ExitStatus(7, None)
        status = zombie_wait_status(killed)
        assert status == signal.SIGKILL
        assert ExitStatus.from_wait_status(status) == ExitStatus(None, signal.SIGKILL)
        assert zombie_wait_status(helper.pid) is None  # alive: not a zombie
    finally:
        if helper.stdin is not None:
            helper.stdin.close()
        helper.wait(timeout=10)
        if helper.stdout is not None:
            helper.stdout.close()
    assert zombie_wait_status(exited) is None  # reaped: gone


def test_open_pidfd_becomes_readable_on_exit() -> None:
    """A pidfd is not readable while the process lives and readable once it exits."""
    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER])
    fd = open_pidfd(proc.pid)
    try:
        assert fd is not None
        assert select.select([fd], [], [], 0.2)[0] == []
        proc.kill()
        assert select.select([fd], [], [], 10)[0] == [fd]
    finally:
        if fd is not None:
            os.close(fd)
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def test_open_pidfd_of_a_gone_process() -> None:
    """open_pidfd returns None for a process that no longer exists."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert open_pidfd(proc.pid) is None


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, ExitStatus(None, None)),
        (0, ExitStatus(0, None)),
        (3 << 8, ExitStatus(3, None)),
        (signal.SIGTERM, ExitStatus(None, signal.SIGTERM)),
        (signal.SIGKILL | 0x80, ExitStatus(None, signal.SIGKILL)),  # with a core dump
    ],
)
def test_exit_status_from_wait_status(status: int | None, expected: ExitStatus) -> None:
    """A raw wait status becomes an exit code or a signal."""
    assert ExitStatus.from_wait_status(status) == expected


@pytest.mark.parametrize(
    ("rc", "expected"),
    [
        (None, ExitStatus(None, None)),
        (0, ExitStatus(0, None)),
        (86, ExitStatus(86, None)),
        (-9, ExitStatus(None, 9)),
    ],
)
def test_exit_status_from_returncode(rc: int | None, expected: ExitStatus) -> None:
    """A Popen returncode becomes an exit code or a signal (negative)."""
    assert ExitStatus.from_returncode(rc) == expected
