"""A process forked for a client joins the client's group even when the client was moved."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.process.cgroup import JobGroups
from worker_sdk.spawn.cgroup import Group, own_group_dir

pytestmark = pytest.mark.process

_JOIN = """
import sys
from worker_sdk.spawn import cgroup
getattr(cgroup, sys.argv[1])(*sys.argv[2:3], *map(int, sys.argv[3:]))
print(cgroup.own_group_dir())
"""

# join_beside, with the daemon's move of the client and removal of ``standby`` done between the
# child's opening of standby's cgroup.procs and its write (the kernel then answers ENODEV)
_JOIN_WHILE_REMOVED = """
import os, sys
from pathlib import Path
from worker_sdk.spawn import cgroup
standby, attempt, client = sys.argv[1], sys.argv[2], int(sys.argv[3])
real_open = os.open
def open_then_remove(path, *args, **kwargs):
    fd = real_open(path, *args, **kwargs)
    if path == os.path.join(standby, "cgroup.procs"):
        Path(attempt, "cgroup.procs").write_text(str(client))
        os.rmdir(standby)
    return fd
os.open = open_then_remove
cgroup.join_beside(standby, client)
print(cgroup.own_group_dir())
"""


@pytest.fixture
def client() -> Iterator[subprocess.Popen[bytes]]:
    """A standby's client: a process that waits (on its stdin) until the test ends."""
    waiting = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    yield waiting
    assert waiting.stdin is not None
    waiting.stdin.close()
    waiting.wait(timeout=30)


def _joined(function: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _JOIN, function, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_standby_forked_after_its_client_was_moved_joins_the_clients_new_group(
    job_groups: JobGroups, client: subprocess.Popen[bytes]
) -> None:
    """The race of a warm standby taken at once: its client waits in ``standby-N``, the daemon
    moves the client into the attempt's group and removes ``standby-N`` before the zygote's
    child has joined it. The child ends in the attempt's group; joining ``standby-N`` alone
    (as before) fails, and the child exited with 127."""
    standby = job_groups.standby()
    attempt = Group(Path(job_groups.attempt(1)))
    (Path(standby) / "cgroup.procs").write_text(str(client.pid))
    assert own_group_dir(client.pid) == standby
    attempt.take_from(Group(Path(standby)))
    assert not Path(standby).exists()
    assert own_group_dir(client.pid) == str(attempt.path)

    alone = _joined("join", standby)
    assert alone.returncode != 0 and "FileNotFoundError" in alone.stderr

    beside = _joined("join_beside", standby, str(client.pid))
    assert beside.returncode == 0, beside.stderr
    assert beside.stdout.strip() == str(attempt.path)


def test_a_gone_client_is_no_group_to_join(job_groups: JobGroups) -> None:
    """When the client is gone as well, there is nothing to join: the child fails (and does not
    run the rank outside every group of the job)."""
    standby = job_groups.standby()
    Group(Path(standby)).remove()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    failed = _joined("join_beside", standby, str(gone.pid))
    assert failed.returncode != 0 and "FileNotFoundError" in failed.stderr


def test_a_group_removed_while_it_is_being_joined_is_joined_beside(
    job_groups: JobGroups, client: subprocess.Popen[bytes]
) -> None:
    """The same race, one step later: the child has opened ``standby-N``'s cgroup.procs when the
    daemon moves the client and removes the group, and its write fails with ENODEV. The child
    ends in the attempt's group (it exited with 127, and the restart was charged: seen under
    load as a launcher that exited 127 within 30 ms of its attempt's start)."""
    standby = job_groups.standby()
    attempt = Group(Path(job_groups.attempt(1)))
    attempt.path.mkdir()
    (Path(standby) / "cgroup.procs").write_text(str(client.pid))
    joined = subprocess.run(
        [
            sys.executable,
            "-c",
            _JOIN_WHILE_REMOVED,
            standby,
            str(attempt.path),
            str(client.pid),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not Path(standby).exists()
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.strip() == str(attempt.path)
