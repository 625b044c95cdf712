"""Real torchrun, 2 ranks on CPU/gloo, the SDK without rvsup: the memory tier's snapshots of DDP,
FSDP1 and FSDP2 jobs resume kill -9 bit-identically and later than storage would; a torn snapshot
is never used; a damaged one is passed over for the one before it.

The test plays the daemon's part: it names the newest complete snapshot (``RVSUP_MEMORY_RESUME``)
after reading the manifests, as supervisor/ranks/snapshots.py does. Each job is
tests/helpers/sharded_worker.py (storage checkpoints after steps 3, 7, 11, 15).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.sharded import Run, torchrun
from tests.helpers.states import assert_same_state
from worker_sdk.contract import layout
from worker_sdk.contract.layout import committed_name, rank_file

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no child process alive (those alive before it excepted)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def _memory(tmp: Path) -> dict[str, Any]:
    return {"RVSUP_MEMORY_DIR": str(tmp / "shm"), "RVSUP_MEMORY_EVERY": "1", "STEP_SLEEP": "0.1"}


def _resumed_at(run: Run) -> int:
    line = next(x for x in run.output.splitlines() if "rank 0 of 2 resumes at" in x)
    return int(line.rsplit(" ", 1)[1])


# FSDP1's state takes the same staging arena as FSDP2's sharded state (its asynchronous save is
# resumed bit-identical in test_async_save.py); the tier adds nothing per parallelism. DDP's
# resume from memory is the torn and flipped-byte tests' path (below), with their checks.
@pytest.mark.parametrize("kind", ["fsdp2"])
def test_kill9_resumes_from_memory_bit_identical(
    tmp_path: Path, references: dict[str, Run], kind: str
) -> None:
    """SIGKILL of rank 1 at step 10, once a snapshot of step 8 or later is complete: the next
    run resumes from the newest complete snapshot (later than step 8, where storage's step-7
    checkpoint would resume), and the final state and RNG draws equal an uninterrupted run's."""
    ckpt, memory = tmp_path / "ckpt", _memory(tmp_path)
    killed = torchrun(
        tmp_path,
        "killed",
        kind=kind,
        ckpt=ckpt,
        fails=True,
        FAULT="kill:1:10",
        SNAPSHOT_BEFORE_KILL="8",
        **memory,
    )
    assert killed.killed() == {1: "kill 10"}
    newest = layout.latest(tmp_path / "shm")
    assert newest is not None and newest.step >= 8, killed.output[-3000:]
    run = torchrun(
        tmp_path, "resumed", kind=kind, ckpt=ckpt, RVSUP_MEMORY_RESUME=str(newest.step), **memory
    )
    assert _resumed_at(run) == newest.step + 1 > 8
    assert_same_state(references[kind].state(), run.state())
    assert run.ranks() == references[kind].ranks()


def test_a_torn_snapshot_is_never_used(tmp_path: Path, references: dict[str, Run]) -> None:
    """SIGKILL of rank 1 while its writer is writing the snapshot of step 10 (its part written,
    rank 0 not told): step 10 is never committed, and even when it is the one named, the ranks
    resume from an older complete snapshot, bit-identically."""
    ckpt, memory = tmp_path / "ckpt", _memory(tmp_path)
    killed = torchrun(
        tmp_path, "killed", kind="ddp", ckpt=ckpt, fails=True, FAULT="killwriting:1:10", **memory
    )
    assert killed.killed() == {1: "killwriting 10"}
    shm = tmp_path / "shm"
    assert [p for p in shm.iterdir() if p.name.startswith(".tmp-step-0000000010-")]
    assert not (shm / committed_name(10)).exists()
    run = torchrun(tmp_path, "resumed", kind="ddp", ckpt=ckpt, RVSUP_MEMORY_RESUME="10", **memory)
    assert 8 <= _resumed_at(run) <= 10
    assert_same_state(references["ddp"].state(), run.state())
    assert run.ranks() == references["ddp"].ranks()


def test_a_flipped_byte_is_skipped_and_the_previous_snapshot_used(
    tmp_path: Path, references: dict[str, Run]
) -> None:
    """One byte flipped in the middle of rank 1's file of the newest snapshot: its checksum
    fails, the ranks report it skipped and resume from the snapshot before it, bit-identically."""
    ckpt, memory = tmp_path / "ckpt", _memory(tmp_path)
    torchrun(
        tmp_path,
        "killed",
        kind="ddp",
        ckpt=ckpt,
        fails=True,
        FAULT="kill:1:11",
        SNAPSHOT_BEFORE_KILL="9",
        **memory,
    )
    valid, _ = layout.scan(tmp_path / "shm")
    # the two newest snapshots, 9 or 10 and the one before it (or two before: a snapshot is put
    # off while the writer is still busy on a loaded machine), and a third, older one where the
    # kill came between the newest one's commit and the removal of the oldest (commit, then
    # prune: contract/layout.py)
    steps = [v.step for v in valid]
    assert len(valid) in (2, 3) and valid[0].step >= 9 and valid[1].step >= 7, steps
    newest, older = valid[0], valid[1]
    damaged = newest.path / rank_file(1)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    run = torchrun(
        tmp_path,
        "resumed",
        kind="ddp",
        ckpt=ckpt,
        RVSUP_MEMORY_RESUME=str(newest.step),
        **memory,
    )
    assert _resumed_at(run) == older.step + 1
    assert_same_state(references["ddp"].state(), run.state())
    assert run.ranks() == references["ddp"].ranks()
