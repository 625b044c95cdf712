"""State that differs between ranks is saved per rank, never rank 0's for everyone; on another
world size rvsup says what happens to it. Two ranks without a process group, in one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import worker_sdk
from tests.helpers.states import make_checkpointer
from worker_sdk.contract.layout import MANIFEST, committed_name


class Position:
    """A per-rank object: where this rank is in its shard of the data."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def save_two_ranks(directory: Path, values: tuple[int, int], *, grouped: bool = False) -> None:
    """Rank 1's part, then rank 0's (which commits), of a checkpoint of a model and a Position;
    ``grouped``: as if in a process group (the collectives are the caller's fakes)."""
    for rank in (1, 0):
        torch.manual_seed(0)
        objects: list[Any] = [torch.nn.Linear(2, 2), Position(values[rank])]
        ck = make_checkpointer(directory, rank=rank, world_size=2)
        if grouped:
            ck._group_active = lambda: True  # type: ignore[method-assign]
            ck._agree_parts_written = lambda *a: ([], [])  # type: ignore[method-assign]
            ck._share_commit_outcome = lambda committed, nbytes: (True, nbytes)  # type: ignore[method-assign]
        ck.save(3, objects, extra=None)


def loaded_value(directory: Path, rank: int, world_size: int) -> tuple[int, tuple[str, ...]]:
    torch.manual_seed(0)
    position = Position(-1)
    result = make_checkpointer(directory, rank=rank, world_size=world_size).load_latest(
        [torch.nn.Linear(2, 2), position], None
    )
    return position.value, result.notes


def where_saved(directory: Path) -> list[str]:
    manifest = json.loads((directory / committed_name(3) / MANIFEST).read_text())
    return [entry["state"] for entry in manifest["objects"]]


def test_an_object_whose_state_differs_between_ranks_comes_back_to_each_rank(
    tmp_path: Path,
) -> None:
    """Two ranks whose Position differs (7 and 11): the manifest says the object is saved per
    rank, and each rank gets its own value back, not rank 0's."""
    save_two_ranks(tmp_path, (7, 11))
    assert where_saved(tmp_path) == ["shared", "rank"]
    assert loaded_value(tmp_path, 0, 2) == (7, ())
    assert loaded_value(tmp_path, 1, 2) == (11, ())


def test_the_ranks_compare_digests_and_keep_equal_state_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a process group the ranks compare digests of each object's state: an equal state is
    saved once (shared), a differing one per rank."""
    digests: list[list[int]] = []

    def gather(mine: list[int]) -> list[list[int]]:
        digests.append(mine)
        return [mine, digests[0]]  # this rank's digests and the first saver's (rank 1's)

    monkeypatch.setattr("worker_sdk.checkpoint.checkpointer.all_gather_ints", gather)
    save_two_ranks(tmp_path / "equal", (5, 5), grouped=True)
    assert where_saved(tmp_path / "equal") == ["shared", "shared"]
    digests.clear()
    save_two_ranks(tmp_path / "differ", (5, 6), grouped=True)
    assert where_saved(tmp_path / "differ") == ["shared", "rank"]


def test_per_rank_state_on_another_world_size_is_named(tmp_path: Path) -> None:
    """A 2-rank checkpoint with per-rank state: on 1 rank, rank 0 gets its own and is told that
    rank 1's is not used; on 3 ranks, the new rank 2 keeps its object as constructed and is told
    so."""
    save_two_ranks(tmp_path, (7, 11))
    value, notes = loaded_value(tmp_path, 0, 1)
    assert value == 7
    assert len(notes) == 1 and "the state of ranks 1..1 is not used" in notes[0], notes
    value, notes = loaded_value(tmp_path, 2, 3)
    assert value == -1
    assert len(notes) == 1 and "rank 2 is new, so it keeps them as constructed" in notes[0]
    assert "object 1 (Position) had per-rank state on 2 ranks" in notes[0]


def test_resume_warns_about_per_rank_state_on_another_world_size(tmp_path: Path) -> None:
    """worker_sdk.resume() on 1 rank from a 2-rank checkpoint with per-rank state warns that
    rank 1's state is not used, and gives rank 0 its own."""
    save_two_ranks(tmp_path, (7, 11))
    torch.manual_seed(0)
    position = Position(-1)
    try:
        with pytest.warns(RuntimeWarning, match=r"the state of ranks 1\.\.1 is not used"):
            start, _ = worker_sdk.resume(
                torch.nn.Linear(2, 2), position, checkpoint_dir=tmp_path, every_steps=100
            )
    finally:
        worker_sdk._reset_for_tests()
    assert (start, position.value) == (4, 7)


def test_split_raises_a_failed_state_dict_only_after_the_ranks_compared() -> None:
    """A state_dict() that raises on one rank is raised after the digests' collective, which
    every rank enters."""

    class Broken(Position):
        def state_dict(self) -> dict[str, Any]:
            raise OSError("no state")

    calls: list[list[int]] = []

    def gather(mine: list[int]) -> list[list[int]]:
        calls.append(mine)
        return [mine, mine]

    from worker_sdk.checkpoint import per_rank as _per_rank

    with pytest.raises(OSError, match="no state"):
        _per_rank.split(["other", "other"], [Position(1), Broken(2)], world_size=2, gather=gather)
    assert len(calls) == 1
