"""Finding the cgroup v2 hierarchy and a process's group in it; a teardown's events."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from supervisor.process.cgroup import TREE_WALK, JobGroups, ended_events, mechanism_here
from supervisor.process.proctree import TeardownReport
from supervisor.record.schema import ProcessesEnded, ProcessesLeft
from worker_sdk.spawn import cgroup as _cgroup
from worker_sdk.spawn.cgroup import group_dir, mount_points, own_group, placement, stale_groups

HYBRID = """\
24 31 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
41 35 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
42 35 0:39 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""
PURE = """\
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
CONTAINER = """\
30 24 0:26 /kubepods/pod1 /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw
"""
SPACED = r"""
50 24 0:26 / /mnt/cg\040two rw,relatime - cgroup2 none rw
"""


@pytest.mark.parametrize(
    ("text", "mounts"),
    [
        (HYBRID, [("/", "/sys/fs/cgroup/unified")]),
        (PURE, [("/", "/sys/fs/cgroup")]),
        (CONTAINER, [("/kubepods/pod1", "/sys/fs/cgroup")]),
        (SPACED, [("/", "/mnt/cg two")]),
        ("", []),
    ],
)
def test_mount_points(text: str, mounts: list[tuple[str, str]]) -> None:
    """Only cgroup2 mounts are found, wherever they are, with their root and escapes undone."""
    assert mount_points(text) == mounts


V1_CPU_MEMORY = """\
43 35 0:40 /slurm /sys/fs/cgroup/cpu,memory rw,relatime shared:12 - cgroup cgroup rw,cpu,memory
44 35 0:41 / /sys/fs/cgroup/memory.x rw,relatime shared:13 - cgroup cgroup rw,memory_x
"""


@pytest.mark.parametrize(
    ("text", "mounts"),
    [
        (HYBRID, [("/", "/sys/fs/cgroup/memory")]),
        (V1_CPU_MEMORY, [("/slurm", "/sys/fs/cgroup/cpu,memory")]),  # co-mounted; no lookalike
        (PURE, []),
        ("", []),
    ],
)
def test_mount_points_of_a_v1_controller(text: str, mounts: list[tuple[str, str]]) -> None:
    """Given a v1 controller, only the cgroup v1 mounts carrying it (by its exact name in the
    super options) are found: the memory tier reads v1 memory limits under them."""
    assert mount_points(text, v1_controller="memory") == mounts


@pytest.mark.parametrize(
    ("text", "group"),
    [
        ("12:memory:/x\n0::/user.slice/rvsup.service\n", "/user.slice/rvsup.service"),
        ("0::/\n", "/"),
        ("4:memory:/x\n1:cpu:/\n", None),
    ],
)
def test_own_group(text: str, group: str | None) -> None:
    """The v2 line ``0::/path`` names the group; a v1-only host has none."""
    assert own_group(text) == group


def test_group_dir_joins_mount_and_group(tmp_path: Path) -> None:
    """The group's directory is under the mount that shows it (a namespaced mount's root is
    taken off the path), and only when it exists."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert group_dir([("/", str(tmp_path))], "/a/b") == str(tmp_path / "a" / "b")
    assert group_dir([("/", str(tmp_path))], "/") == str(tmp_path)
    assert group_dir([("/pod", str(tmp_path))], "/pod/a") == str(tmp_path / "a")
    assert group_dir([("/pod", str(tmp_path))], "/other/a") is None
    assert group_dir([("/", str(tmp_path))], "/missing") is None


def test_placement(tmp_path: Path) -> None:
    """A forked child is placed only into another group than its parent's, and only one its
    parent may write."""
    (tmp_path / "cgroup.procs").write_text("")
    assert placement(None, "/own") is None
    assert placement("/own", "/own") is None
    assert placement(str(tmp_path), "/own") == str(tmp_path)
    assert placement(str(tmp_path / "nowhere"), "/own") is False


def test_ended_events_name_what_is_left() -> None:
    """A teardown is one processes_ended line; processes it could not end are named in a
    processes_left line."""
    clean = TeardownReport(signalled=5, killed=2, leftover=0, seconds=0.5, forced=1)
    assert ended_events(clean, scope="attempt", mechanism="m") == [
        ProcessesEnded(scope="attempt", mechanism="m", ended=5, sigkilled=1, seconds=0.5)
    ]
    stuck = TeardownReport(5, 2, 1, 5.5, left=(os.getpid(),), forced=2)
    ended, left = ended_events(stuck, scope="job", mechanism="m")
    assert isinstance(ended, ProcessesEnded) and ended.ended == 4
    assert isinstance(left, ProcessesLeft)
    assert left.processes[0].startswith(f"{os.getpid()} ")
    assert "python" in left.processes[0] or "pytest" in left.processes[0]


def test_no_usable_group_falls_back_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cgroup v2 hierarchy, or where a made group cannot be joined, there is no job
    group: the reason is returned (for job_started and rvsup validate) and nothing is left."""
    monkeypatch.setattr(_cgroup, "own_group_dir", lambda: None)
    assert JobGroups.create() == "no cgroup v2 hierarchy is mounted"
    assert mechanism_here().startswith(f"{TREE_WALK}: no cgroup v2")
    monkeypatch.setattr(_cgroup, "own_group_dir", lambda: str(tmp_path))  # not a cgroup
    reason = JobGroups.create()
    assert isinstance(reason, str) and reason.startswith("cannot move processes into")
    assert list(tmp_path.iterdir()) == []


def test_stale_groups_are_those_of_dead_owners(tmp_path: Path) -> None:
    """A group named after a process that is gone is stale; one of a live process, or named
    otherwise, is not."""
    gone = 2**22 + 1  # above pid_max's default: no such process
    for name in (f"rvsup-{gone}", f"rvsup-{os.getpid()}", "rvsup-node-1", "other"):
        (tmp_path / name).mkdir()
    assert [g.path.name for g in stale_groups(tmp_path, "rvsup-")] == [f"rvsup-{gone}"]


# Who places processes into groups: each one the process that starts it, nothing else.
PLACERS = {
    ("supervisor/process/cgroup.py", "create"),  # the daemon itself, in and back: its probe
    # a process itself, into its v1 memory group and back: the daemon's, a node's wrapper's
    ("worker_sdk/spawn/cgroup.py", "join_memory_group"),
    ("worker_sdk/spawn/cgroup.py", "leave_memory_group"),
    ("supervisor/process/launcher.py", "bootstrap"),  # the daemon: launchers, standby, zygote
    ("worker_sdk/spawn/zygote.py", "_place"),  # the zygote: the ranks it forks
    ("worker_sdk/spawn/node_group.py", "start"),  # a node's wrapper: its torchrun and agent
}


def test_only_the_starter_of_a_process_places_it() -> None:
    """The one rule of containment (``worker_sdk/spawn/cgroup.py``), in the source: ``place`` is
    called where a process is started and nowhere else, and no other code writes a group's
    ``cgroup.procs``."""
    repo = Path(__file__).resolve().parents[3]
    calls, writers = set(), set()
    for path in sorted([*repo.glob("supervisor/**/*.py"), *repo.glob("worker_sdk/**/*.py")]):
        name = str(path.relative_to(repo))
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and (
                    getattr(node.func, "id", None) == "place"
                    or getattr(node.func, "attr", None) == "place"
                ):
                    calls.add((name, function.name))
        if "cgroup.procs" in path.read_text():
            writers.add(name)
    assert calls == PLACERS
    # spawn/cgroup.py writes (place) and reads (pids) it; the memory room check looks for it
    assert writers == {"worker_sdk/spawn/cgroup.py", "worker_sdk/checkpoint/memory/room.py"}
