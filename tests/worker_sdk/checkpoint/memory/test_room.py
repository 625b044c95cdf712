"""Whether the snapshots fit a node's memory (worker_sdk.checkpoint.memory.room): what they
need, from a table; why they do not fit; the cgroup files read as the kernel writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker_sdk.checkpoint.memory import room
from worker_sdk.checkpoint.memory.room import Need, Room

MB = 2**20

NEEDS = [
    # arena growth, once, per rank, the once arena grows, ranks here, nodes, held
    #   -> files, arenas
    (100, 0, 100, False, 1, 1, 0, 300, 100),  # one rank: three snapshots at once, one arena
    (100, 0, 100, False, 4, 1, 0, 1200, 400),  # every rank of the node as large as this one
    (100, 0, 100, False, 2, 3, 0, 1800, 200),  # several nodes: every node keeps every part
    (100, 0, 100, False, 2, 1, 200, 400, 200),  # an earlier attempt's snapshots, replaced
    (0, 0, 100, False, 2, 1, 900, 0, 0),  # the directory already holds more: nothing more
    (50, 0, 150, False, 1, 1, 0, 450, 50),  # a state that grew: the arena's growth only
    # DDP on 8 ranks: rank 0's 1000 bytes of replicated state are saved once, not 8 times
    (1000, 1000, 0, True, 8, 1, 0, 3000, 1000),
    (1000, 1000, 0, True, 8, 2, 0, 3000, 1000),  # and once on each node
    (10, 1000, 10, False, 8, 1, 0, 3240, 80),  # rank 0's DCP shards: like every rank's
]


@pytest.mark.parametrize(
    ("growth", "once", "per_rank", "growing", "here", "nodes", "held", "files", "arenas"),
    NEEDS,
    ids=str,
)
def test_need(
    growth: int,
    once: int,
    per_rank: int,
    growing: bool,
    here: int,
    nodes: int,
    held: int,
    files: int,
    arenas: int,
) -> None:
    """What a node's snapshots need beyond what it holds: the directory at its fullest (two
    kept and one being written: the state saved once, and the part of every rank whose copy it
    keeps) and the ranks' arenas (the one holding the state saved once: once)."""
    needed = room.need(
        arena_growth=growth,
        once=once,
        per_rank=per_rank,
        once_growing=growing,
        ranks_here=here,
        nodes=nodes,
        held=held,
    )
    assert (needed.snapshots, needed.arenas) == (files, arenas)
    assert needed.memory == files + arenas


@pytest.mark.parametrize(
    "bad",
    [
        {"arena_growth": -1},
        {"once": -1},
        {"per_rank": -1},
        {"held": -1},
        {"ranks_here": 0},
        {"nodes": 0},
    ],
    ids=str,
)
def test_need_refuses_nonsense(bad: dict[str, int]) -> None:
    """Negative sizes, no rank, no node: a ValueError, not a figure."""
    args = {"arena_growth": 1, "once": 0, "per_rank": 1, "ranks_here": 1, "nodes": 1, "held": 0}
    with pytest.raises(ValueError, match="bad sizes"):
        room.need(once_growing=False, **(args | bad))


FITS = [
    # files, arenas, tmpfs free, memory free -> the start of the reason, or None
    (100 * MB, 50 * MB, None, None, None),  # nothing known: no bound
    (100 * MB, 50 * MB, 200 * MB, 300 * MB, None),  # exactly half of each
    (100 * MB, 50 * MB, 199 * MB, 10_000 * MB, "No space for snapshots in /shm"),
    (100 * MB, 50 * MB, 10_000 * MB, 299 * MB, "not enough memory for snapshots"),
    (100 * MB, 50 * MB, None, 299 * MB, "not enough memory for snapshots"),
    (0, 0, 0, 0, None),  # nothing needed fits anywhere
]


@pytest.mark.parametrize(("files", "arenas", "tmpfs", "memory", "why"), FITS, ids=str)
def test_shortfall(
    files: int, arenas: int, tmpfs: int | None, memory: int | None, why: str | None
) -> None:
    """The snapshots may take half of the tmpfs's free space (their files) and half of the
    memory left (files and arenas); otherwise the reason names what is short."""
    got = room.shortfall(Need(files, arenas), Room(tmpfs, memory, "the host"), Path("/shm"))
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(why), got


def test_the_reason_gives_the_figures() -> None:
    """The memory_tier_off reason says how much is needed, of which staging and files, what
    bounds the memory and how much it leaves."""
    why = room.shortfall(
        Need(1275 * MB, 425 * MB), Room(None, 707 * MB, "the memory limit of cgroup /x"), Path("/s")
    )
    assert why == (
        "not enough memory for snapshots: they need about 1,700 MiB more on this node (staging "
        "425 MiB, files 1,275 MiB), the memory limit of cgroup /x leaves 707 MiB (the tier "
        "takes at most 50% of it)"
    )


STAT_V1 = "cache 600\nrss 100\ntotal_cache 600\ntotal_inactive_file 500\ntotal_active_file 50\n"
STAT_V2 = "anon 100\nfile 600\nactive_file 50\ninactive_file 500\n"


@pytest.mark.parametrize(
    ("usage", "stat", "v2", "expected"),
    [
        (1000, STAT_V1, False, 500),  # v1: the hierarchy's total_inactive_file
        (1000, STAT_V2, True, 500),  # v2: inactive_file
        (1000, STAT_V2, False, 1000),  # v1 without its key: the whole usage
        (400, STAT_V2, True, 0),  # never below zero
        (1000, "inactive_file x\n", True, 1000),  # a value that is no number
    ],
    ids=str,
)
def test_working_set(usage: int, stat: str, v2: bool, expected: int) -> None:
    """The usage less the inactive file cache (the kernel reclaims it before it kills)."""
    assert room.working_set(usage, stat, v2=v2) == expected


def _group(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_left_in_reads_the_limits_of_v1_and_v2(tmp_path: Path) -> None:
    """A limit less the working set; no limit ("max", v1's huge number) or no files: None."""
    v2 = _group(
        tmp_path / "v2",
        {"memory.max": "2000\n", "memory.current": "1000\n", "memory.stat": STAT_V2},
    )
    v1 = _group(
        tmp_path / "v1",
        {
            "memory.limit_in_bytes": "2000\n",
            "memory.usage_in_bytes": "1000\n",
            "memory.stat": STAT_V1,
        },
    )
    unlimited2 = _group(
        tmp_path / "u2", {"memory.max": "max\n", "memory.current": "1", "memory.stat": ""}
    )
    unlimited1 = _group(
        tmp_path / "u1",
        {
            "memory.limit_in_bytes": "9223372036854771712\n",
            "memory.usage_in_bytes": "1",
            "memory.stat": "",
        },
    )
    assert room.left_in(v2, v2=True) == 1500
    assert room.left_in(v1, v2=False) == 1500
    assert room.left_in(unlimited2, v2=True) is None
    assert room.left_in(unlimited1, v2=False) is None
    assert room.left_in(tmp_path / "missing", v2=True) is None


def test_measure_looks_at_the_nearest_existing_folder(tmp_path: Path) -> None:
    """A snapshot directory not made yet: the free space of the file system it will be on."""
    got = room.measure(tmp_path / "not" / "yet")
    assert got.tmpfs_free is not None and got.tmpfs_free > 0
    assert got.memory_free is None or got.memory_free > 0


def test_bytes_in_counts_the_files_below(tmp_path: Path) -> None:
    """What a snapshot directory holds: every file below it; a folder not there holds 0."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x").write_bytes(b"1" * 10_000)
    (tmp_path / "a" / "b" / "y").write_bytes(b"1" * 20_000)
    assert room.bytes_in(tmp_path / "a") >= 30_000
    assert room.bytes_in(tmp_path / "nothing") == 0
