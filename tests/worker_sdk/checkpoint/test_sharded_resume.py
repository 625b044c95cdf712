"""Real torchrun, 2 ranks on CPU/gloo, the SDK without rvsup: DDP, FSDP1 and FSDP2 jobs survive
kill -9 bit-identically, and a checkpoint of 2 ranks resumes on 1 and on 3.

Each job is tests/helpers/sharded_worker.py. A restart is a second torchrun, as under rvsup
(torchrun's own ``--max-restarts`` round sometimes hangs in gloo's connectFullMesh on this host).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers.sharded import Run, torchrun
from tests.helpers.states import assert_same_state
from worker_sdk.checkpoint import rng as _rng
from worker_sdk.contract import layout
from worker_sdk.contract.layout import committed_name

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no child process alive (those alive before it, such as the Slurm
    test cluster's daemons when it is up, excepted)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


# DDP only: for FSDP1 and FSDP2 the kill inside the sharded write (below) takes this path and more
# (rank 1 killed, both ranks resumed from step 7's checkpoint, bit-identical)
@pytest.mark.parametrize("kind", ["ddp"])
def test_kill9_of_a_rank_resumes_bit_identical(
    tmp_path: Path, references: dict[str, Run], kind: str
) -> None:
    """SIGKILL of rank 1 at step 9: the next torchrun resumes both ranks from step 7's
    checkpoint, and the final full parameters, optimizer state, schedule, extra and RNG draws
    equal an uninterrupted run's bit for bit."""
    ckpt = tmp_path / "ckpt"
    killed = torchrun(tmp_path, "killed", kind=kind, ckpt=ckpt, fails=True, FAULT="kill:1:9")
    assert killed.killed() == {1: "kill 9"}
    run = torchrun(tmp_path, "resumed", kind=kind, ckpt=ckpt)
    assert "rank 1 of 2 resumes at 8" in run.output
    reference = references[kind]
    assert_same_state(reference.state(), run.state())
    assert run.ranks() == reference.ranks()


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1"])
def test_kill9_inside_the_sharded_write_commits_nothing(
    tmp_path: Path, references: dict[str, Run], kind: str
) -> None:
    """SIGKILL of rank 1 once its DCP files of step 11 are written, before the ranks agree: step
    11 is never committed (its DCP .metadata notwithstanding), the next torchrun resumes from
    step 7, and the result is still bit-identical."""
    ckpt = tmp_path / "ckpt"
    killed = torchrun(tmp_path, "killed", kind=kind, ckpt=ckpt, fails=True, FAULT="killsave:1:11")
    assert killed.killed() == {1: "killsave 11"}
    [torn] = [p for p in ckpt.iterdir() if p.name.startswith(".tmp-step-0000000011-")]
    assert (torn / "dcp" / ".metadata").exists()
    assert layout.latest(ckpt) == layout.validate(ckpt / committed_name(7))
    run = torchrun(tmp_path, "resumed", kind=kind, ckpt=ckpt)
    assert "rank 0 of 2 resumes at 8" in run.output
    assert_same_state(references[kind].state(), run.state())
    assert run.ranks() == references[kind].ranks()
    assert sorted(p.name for p in ckpt.iterdir() if p.name != layout.MARKER) == [
        committed_name(7),
        committed_name(11),  # written again by the resumed run
        committed_name(15),
    ]


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Run]]:
    """Per parallelism, computed when first needed: a 2-rank job of 6 steps (checkpoints after
    steps 3 and 5) and what it held when it ended (= its step-5 checkpoint)."""
    return _SavedByTwo(tmp_path_factory.mktemp("saved"))


class _SavedByTwo(dict[str, tuple[Path, Run]]):
    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, kind: str) -> tuple[Path, Run]:
        ckpt = self.tmp / f"{kind}-ckpt"
        run = torchrun(self.tmp, kind, kind=kind, total=6, ckpt=ckpt, EVERY="3")
        self[kind] = (ckpt, run)
        return ckpt, run


@pytest.mark.parametrize(("kind", "nproc"), [("fsdp2", 1), ("fsdp2", 3), ("fsdp1", 3), ("ddp", 3)])
def test_resume_on_another_world_size(
    tmp_path: Path, saved_by_two: dict[str, tuple[Path, Run]], kind: str, nproc: int
) -> None:
    """A checkpoint of 2 ranks resumed on 1 or 3: right after resume() the full state equals the
    saved one; ranks 0 and 1 get their own extra and RNG back, a new rank 2 the given extra and
    RNGs seeded from (step 5, rank 2)."""
    ckpt, saved = saved_by_two[kind]
    info = layout.latest(ckpt)
    assert info is not None
    assert (info.step, info.world_size) == (5, 2)
    run = torchrun(tmp_path, "loaded", kind=kind, nproc=nproc, ckpt=ckpt, LOAD_ONLY="1", EVERY="3")
    for r in range(nproc):
        assert f"rank {r} of {nproc} resumes at 6" in run.output
    assert_same_state(saved.state(), run.state())
    before = saved.ranks()
    after = run.ranks()
    for r in range(min(nproc, 2)):
        assert after[r] == before[r]
    if nproc > 2:
        _rng.seed_all(_rng.derived_seed(5, 2))
        assert after[2] == {"seen": 0.0, "draw": torch.rand(1).item()}
