"""Checkpoints across two real processes joined by a gloo group (file:// rendezvous)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from worker_sdk.contract import layout
from worker_sdk.contract.layout import SHARED, committed_name, rank_file, temp_name

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[3]
WORKER = REPO / "tests" / "helpers" / "ckpt_worker.py"
WORLD = 2
GROUP_TIMEOUT_S = 120.0


@contextmanager
def launched() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes appended to the yielded list are SIGKILLed (whole session) and reaped on exit."""
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()


def spawn(
    procs: list[subprocess.Popen[str]],
    args: list[str],
    rank: int,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **(extra_env or {}))
    p = subprocess.Popen(
        [sys.executable, str(WORKER), *args[:3], str(rank), str(WORLD), *args[3:]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(p)
    return p


def run_group(args: list[str]) -> list[list[dict[str, Any]]]:
    """Run both ranks to completion; each rank's JSON lines."""
    with launched() as procs:
        for rank in range(WORLD):
            spawn(procs, args, rank)
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, err
            outputs.append([json.loads(line) for line in out.splitlines()])
        return outputs


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no child process alive (those alive before it, such as the Slurm
    test cluster's daemons when it is up, excepted)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def test_checkpoint_collectives_return_only_after_gloo_let_go(tmp_path: Path) -> None:
    """A checkpoint round's collective returns only once gloo's worker thread has dropped its
    tensors, while a plain all_gather often returns before (that late drop takes the GIL and
    aborts a process that is already exiting): the race is real here and the wrapper closes it."""
    rounds = 400
    results = run_group(
        ["release", str(tmp_path / "unused"), str(tmp_path / "store"), "r", str(rounds)]
    )
    for (counts,) in results:
        assert counts["wrapped"] == 0, counts
    assert sum(counts["raw"] for (counts,) in results) > 0, results


def test_two_ranks_save_then_load(tmp_path: Path) -> None:
    """Two ranks commit checkpoints together; fresh processes restore the newest one, each rank
    its own part, bit-exactly."""
    ck = tmp_path / "ckpt"
    saved = run_group(["save", str(ck), str(tmp_path / "store1"), "a1", "1,3,5"])
    assert [[(e["step"], e["committed"]) for e in rank] for rank in saved] == [
        [(1, True), (3, True), (5, True)],
        [(1, False), (3, False), (5, False)],
    ]
    assert sorted(p.name for p in ck.iterdir() if layout.is_rvsup_entry(p.name)) == [
        layout.MARKER,
        committed_name(3),
        committed_name(5),
    ]
    loaded = run_group(["load", str(ck), str(tmp_path / "store2"), "a2"])
    for rank, ((got,), saved_events) in enumerate(zip(loaded, saved, strict=True)):
        at_save = saved_events[-1]
        assert (got["step"], got["extra"], got["skipped"]) == (5, {"rank": rank, "step": 5}, [])
        assert got["digest"] == at_save["digest"]
        assert got["next_draw"] == at_save["next_draw"]


def test_rank_killed_before_agreement_commits_nothing(tmp_path: Path) -> None:
    """kill -9 of rank 1 after writing its part but before the ranks agree: the step is never
    committed, and the previous checkpoint is what a restart loads."""
    ck = tmp_path / "ckpt"
    hang_file = tmp_path / "rank1-hangs"
    tmp_dir = ck / temp_name(2, "a1")
    with launched() as procs:
        args = ["save", str(ck), str(tmp_path / "store1"), "a1", "1,2"]
        rank0 = spawn(procs, args, 0)
        rank1 = spawn(
            procs,
            args,
            1,
            {"CKPT_WORKER_HANG_AT": "2", "CKPT_WORKER_HANG_FILE": str(hang_file)},
        )
        parts = [tmp_dir / SHARED, tmp_dir / rank_file(0), tmp_dir / rank_file(1)]
        committed = ck / committed_name(2)
        wait_until(hang_file.exists, GROUP_TIMEOUT_S, "rank 1 to write its part")
        wait_until(
            lambda: all(p.exists() for p in parts) or committed.exists(),
            GROUP_TIMEOUT_S,
            "rank 0 to write its part",
        )
        time.sleep(0.5)  # rank 0 is waiting for rank 1 in the agreement
        assert not committed.exists()
        assert rank0.poll() is None
        os.kill(rank1.pid, signal.SIGKILL)
        assert rank1.wait(timeout=30) == -signal.SIGKILL
        try:
            rank0.wait(timeout=20)  # gloo notices the lost peer, or the test kills it
        except subprocess.TimeoutExpired:
            os.killpg(rank0.pid, signal.SIGKILL)
            rank0.wait(timeout=30)
        assert rank0.returncode != 0
        assert rank0.stdout is not None
        [first] = [json.loads(line) for line in rank0.stdout.read().splitlines()]
        assert (first["step"], first["committed"]) == (1, True)
    assert not (ck / committed_name(2)).exists()
    assert all(p.exists() for p in parts)  # every part was durable, yet nothing was committed
    newest = layout.latest(ck)
    assert newest is not None
    assert newest.step == 1
    loaded = run_group(["load", str(ck), str(tmp_path / "store2"), "a2"])
    for rank, (got,) in enumerate(loaded):
        assert (got["step"], got["extra"]) == (1, {"rank": rank, "step": 1})
        assert got["digest"] == first["digest"]
