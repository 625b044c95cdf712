"""Real torchrun, 2 ranks on CPU/gloo, the SDK without rvsup: DDP, FSDP1 and FSDP2 jobs survive
kill -9 bit-identically, and a checkpoint of 2 ranks resumes on 1 and on 3.

Each job is tests/process/sharded_worker.py. A restart is a second torchrun, as under rvsup
(torchrun's own ``--max-restarts`` round sometimes hangs in gloo's connectFullMesh on this host).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from worker_sdk.checkpoint import rng as _rng
from worker_sdk.contract import layout
from worker_sdk.contract.layout import committed_name

from .harness import assert_same_state

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("sharded_worker.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    """What one torchrun left behind."""

    out: Path  # rank 0's full state (torch.save); OUT.rank<r>.json beside it
    output: str  # torchrun's and the ranks' stdout and stderr
    world: int

    def state(self) -> Any:
        """The full (unsharded) model, optimizer and schedule state rank 0 wrote."""
        return torch.load(self.out, map_location="cpu", weights_only=True)

    def ranks(self) -> list[dict[str, Any]]:
        """Every rank's extra counter and next random draw."""
        return [json.loads(Path(f"{self.out}.rank{r}.json").read_text()) for r in range(self.world)]


def torchrun(
    tmp: Path,
    name: str,
    *,
    kind: str,
    nproc: int = 2,
    total: int = 16,
    ckpt: Path | None = None,
    fails: bool = False,
    **env: str,
) -> Run:
    """Run the worker on ``nproc`` ranks to completion (checkpoints every 4 steps), expecting
    success or (``fails``) a failure; every process of the run is SIGKILLed on the way out."""
    out = tmp / f"{name}.pt"
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RVSUP_")},
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "KIND": kind,
        "CKPT": str(ckpt or tmp / f"{name}-ckpt"),
        "OUT": str(out),
        "TOTAL": str(total),
        "EVERY": "4",
        **env,
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        str(WORKER),
    ]
    proc = subprocess.Popen(
        argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            for p in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    p.kill()
            proc.kill()
            proc.communicate(timeout=30)
    assert (proc.returncode != 0) == fails, _failure_text(proc.returncode, output)
    return Run(out, output, nproc)


def _failure_text(returncode: int, output: str) -> str:
    """Why a run ended unexpectedly: its exit code and the lines that say why first (a
    truncated report still shows them), then the end of its output."""
    telling = [
        line
        for line in output.splitlines()
        if any(word in line for word in ("Error", "error:", "exitcode", "Signal", "Killed"))
    ]
    summary = "\n".join(telling[:20])
    return f"torchrun exited {returncode}\n{summary}\n--- output:\n{output[-6000:]}"


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no child process alive."""
    yield
    assert psutil.Process().children(recursive=True) == []


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Uninterrupted 16-step runs, one per parallelism, computed when first needed."""
    return _References(tmp_path_factory.mktemp("reference"))


class _References(dict[str, Run]):
    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, kind: str) -> Run:
        run = torchrun(self.tmp, kind, kind=kind)
        self[kind] = run
        return run


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1", "ddp"])
def test_kill9_of_a_rank_resumes_bit_identical(
    tmp_path: Path, references: dict[str, Run], kind: str
) -> None:
    """SIGKILL of rank 1 at step 9: the next torchrun resumes both ranks from step 7's
    checkpoint, and the final full parameters, optimizer state, schedule, extra and RNG draws
    equal an uninterrupted run's bit for bit."""
    ckpt = tmp_path / "ckpt"
    killed = torchrun(tmp_path, "killed", kind=kind, ckpt=ckpt, fails=True, FAULT="kill:1:9")
    assert "exitcode: -9" in killed.output
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
    assert "exitcode: -9" in killed.output
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
