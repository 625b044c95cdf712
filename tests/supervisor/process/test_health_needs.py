"""What a health round asks of every node (supervisor/process/health.py ``needs_of``): the free
space /dev/shm must have, or why it is not checked, from job.toml's checkpoint settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.load import load_config
from supervisor.process.health import needs_of
from tests.helpers.jobs import write_job_file

GIB = 1 << 30


@pytest.mark.parametrize(
    ("checkpoint", "tier", "shm", "why"),
    [
        ("async = true", "off", GIB // 2, None),  # a node's share of the newest checkpoint
        ("async = true", None, GIB // 2, None),
        ("", "off", None, "checkpoint.async and the memory tier are off: nothing is staged"),
        ("", None, None, "checkpoint.async is off; the memory tier checks its own room in"),
        (
            "memory_every_steps = 5",
            None,
            None,
            "checkpoint.async is off; the memory tier checks its own",
        ),
        ("async = true", "given", 2 * GIB, None),
    ],
    ids=["async", "async-tier", "nothing", "tier-auto", "tier-5", "given"],
)
def test_the_shm_need_follows_what_is_staged_there(
    tmp_path: Path, checkpoint: str, tier: str | None, shm: int | None, why: str | None
) -> None:
    """With asynchronous saves every node needs its share of the newest checkpoint (1 GiB over
    2 nodes here) in /dev/shm, or the size given; without them nothing is checked, and the
    reason says whether the memory tier stages there (it checks its own room) or nothing does."""
    tables = {"checkpoint": checkpoint}
    if tier == "given":
        tier, tables["health"] = "off", 'shm_free = "2GiB"'
    path = write_job_file(tmp_path, command=["true"], tables=tables, memory_tier=tier)
    needs = needs_of(load_config(path), None, 2, GIB)
    assert needs.shm_free == shm
    if why is None:
        assert "shm" not in needs.why, needs.why
    else:
        assert needs.why["shm"].startswith(why), needs.why
