"""Where the job's OOM kills are counted: the counter's files read from tables and directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.process.oom_count import HOST, OomCounter, oom_kill_field

V2_EVENTS = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n"
V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
VMSTAT = "pgfault 100\noom_kill 7\nthp_fault_alloc 0\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V2_EVENTS, 2),
        (V1_CONTROL, 5),
        (VMSTAT, 7),
        ("oom 1\noom_group_kill 4\n", None),  # no oom_kill line (a kernel before 4.13)
        ("oom_kill x\n", None),
        ("", None),
    ],
    ids=["v2-memory.events", "v1-memory.oom_control", "vmstat", "absent", "garbled", "empty"],
)
def test_oom_kill_field(text: str, expected: int | None) -> None:
    """The ``oom_kill`` line's count, whichever file it is read from; None without one."""
    assert oom_kill_field(text) == expected


def test_the_v2_group_is_counted_where_its_memory_controller_is_on(tmp_path: Path) -> None:
    """A v2 group with ``memory.events`` is the counter, of the job's processes alone."""
    (tmp_path / "memory.events").write_text(V2_EVENTS)
    counter = OomCounter.of_job(tmp_path, None, "unused")
    assert counter.host_wide == "" and counter.read() == 2


def test_a_v1_group_is_counted_with_the_groups_below_it(tmp_path: Path) -> None:
    """v1 counts a kill in the victim's group alone: the job's group and every group below it
    (a rank's own limited group) are summed, and a group without the file is passed over."""
    (tmp_path / "memory.oom_control").write_text(V1_CONTROL)
    (tmp_path / "oom-123").mkdir()
    (tmp_path / "oom-123" / "memory.oom_control").write_text("oom_kill 1\n")
    (tmp_path / "empty").mkdir()
    counter = OomCounter.of_job(None, tmp_path, "unused")
    assert counter.host_wide == "" and counter.read() == 6
    assert counter.where == f"cgroup v1 memory.oom_control under {tmp_path}"


def test_without_a_memory_group_the_host_is_counted_and_says_why(tmp_path: Path) -> None:
    """No v2 memory controller (a group without ``memory.events``) and no v1 group: the host's
    counter, with the reason the failure's detail will give."""
    counter = OomCounter.of_job(tmp_path, None, "no memory controller")
    assert counter.path == HOST and counter.host_wide == "no memory controller"
    assert isinstance(counter.read(), int)  # Linux >= 4.13
    assert OomCounter.of_job(None, None, "").host_wide == "no memory cgroup of the job's"
