"""The node's health as its agent reads it (supervisor/agent/node_health.py), from tables: the
memory available in /proc/meminfo's text (the health probe's reader, which the agent uses), and
the OOM kills counted since the agent started."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.agent.node_health import NodeHealth
from supervisor.process.health_probe import memory_available
from supervisor.process.oom_count import OomCounter

MEMINFO = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


@pytest.mark.parametrize(
    ("text", "available"),
    [
        (MEMINFO, 20_000_000 * 1024),
        ("MemAvailable:   512\n", 512),  # no unit: bytes
        ("MemTotal:       24576000 kB\n", None),  # a kernel before 3.14 has no MemAvailable
        ("MemAvailable:   lots kB\n", None),
        ("", None),
    ],
)
def test_the_memory_available_is_read_from_meminfo(text: str, available: int | None) -> None:
    """``MemAvailable`` in bytes (kB multiplied), None where there is no number."""
    assert memory_available(text) == available


def test_oom_kills_count_from_the_agents_start(tmp_path: Path) -> None:
    """The kills are those counted after the agent started; a counter that cannot be read
    (its group removed) gives None, not a guess; the host-wide reason is passed on."""
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    health = NodeHealth(OomCounter.of_job(tmp_path, None, ""))
    assert health.read().oom_kills == 0
    events.write_text("low 0\nhigh 0\nmax 5\noom 3\noom_kill 3\n")
    assert health.read().oom_kills == 1
    events.unlink()
    assert health.read().oom_kills is None
    host = NodeHealth(OomCounter.of_job(None, None, "no memory cgroup"))
    assert host.read().oom_host_wide == "no memory cgroup"
