"""What the zygote's child and the ranks share across the standard-library boundary: the names of
the memory tier's environment variables; and the one-node rules the ranks apply."""

from __future__ import annotations

import pytest

from worker_sdk.contract import protocol
from worker_sdk.spawn import zygote_child
from worker_sdk.spawn.local_world import every_rank_here, ranks_here


@pytest.mark.parametrize(
    ("env", "world_size", "expected"),
    [
        ({}, None, True),  # a plain `python train.py`
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, None, True),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, None, False),  # two nodes
        ({"WORLD_SIZE": "4"}, None, True),  # not launched by torchrun: one node
        ({"LOCAL_WORLD_SIZE": "2"}, 2, True),  # the world size from torch.distributed
        ({"LOCAL_WORLD_SIZE": "2"}, 4, False),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "two"}, None, False),  # unreadable: not known
        ({"WORLD_SIZE": "", "LOCAL_WORLD_SIZE": ""}, None, True),
    ],
)
def test_every_rank_here(env: dict[str, str], world_size: int | None, expected: bool) -> None:
    """LOCAL_WORLD_SIZE against the world size; unset means one node, unreadable means not."""
    assert every_rank_here(env, world_size) is expected


@pytest.mark.parametrize(
    ("env", "world_size", "expected"),
    [
        ({"LOCAL_WORLD_SIZE": "2"}, 4, 2),  # two ranks of four here
        ({}, 4, 4),  # unset: a job of one node
        ({"LOCAL_WORLD_SIZE": ""}, 3, 3),
        ({"LOCAL_WORLD_SIZE": "8"}, 4, 4),  # never more than the world
        ({"LOCAL_WORLD_SIZE": "0"}, 4, 1),  # never fewer than this rank
        ({"LOCAL_WORLD_SIZE": "two"}, 4, 4),  # unreadable: the most a node can hold
    ],
)
def test_ranks_here(env: dict[str, str], world_size: int, expected: int) -> None:
    """LOCAL_WORLD_SIZE bounded by [1, world size]; unset or unreadable, the whole world (the
    snapshots a node holds are sized from it: an upper bound)."""
    assert ranks_here(env, world_size) == expected


def test_the_zygote_childs_names_are_the_protocols() -> None:
    """The zygote's child (standard library only, it cannot import the contract) spells the
    variables the ranks read from ``worker_sdk.contract.protocol`` the same way."""
    assert zygote_child.FORKED_WRITER == protocol.ENV_FORKED_WRITER
    assert zygote_child._MEMORY_DIR == protocol.ENV_MEMORY_DIR
