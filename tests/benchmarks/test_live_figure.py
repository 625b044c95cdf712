"""Figure 12's arithmetic (live recovery) from fake records, and its table without torchft."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from benchmarks import records
from benchmarks.fig_live import (
    MEMORY,
    TORCHFT,
    Column,
    Compared,
    reduce,
    relative_difference,
    table,
)
from benchmarks.records import Record
from benchmarks.tools import Rvsup, Spec
from benchmarks.torchft_tool import TorchFT
from benchmarks.trials import Outcome


def rec(t: float, rank: int, pid: int, step: int, event: str = "step") -> Record:
    return Record(t, rank, pid, step, event)


def steps(rank: int, pid: int, first: int, last: int, t0: float, dt: float = 0.1) -> list[Record]:
    return [rec(t0 + dt * (s - first), rank, pid, s) for s in range(first, last + 1)]


# torchft: rank 1 (pid 2) dies before step 60 at t=10; rank 0 (pid 1) discards its step 60, waits
# 5 s for the lighthouse, trains alone on steps 60..79, and rank 1's new process (pid 3) heals to
# step 80 and steps beside it from there (its batch unused in the step it healed in)
TORCHFT_TRIAL = sorted(
    [
        *steps(0, 1, 55, 59, 9.5),
        *steps(1, 2, 55, 59, 9.5),
        rec(10.0, 1, 2, 60, "fault"),
        rec(10.05, 0, 1, 60, "discarded"),
        *steps(0, 1, 60, 79, 15.0),
        rec(16.0, 1, 3, -1, "boot"),
        rec(16.9, 1, 3, 80, "start"),
        *steps(0, 1, 80, 99, 17.02),
        *steps(1, 3, 80, 99, 17.0),
        rec(17.001, 1, 3, 80, "unused"),
    ],
    key=lambda r: r.t,
)

# rvsup: both ranks restart at t=12 from a snapshot of step 54 and redo steps 55..59
RVSUP_TRIAL = sorted(
    [
        *steps(0, 1, 50, 59, 9.0),
        *steps(1, 2, 50, 59, 9.0),
        rec(10.0, 1, 2, 60, "fault"),
        rec(12.0, 0, 3, 55, "start"),
        rec(12.0, 1, 4, 55, "start"),
        *steps(0, 3, 55, 99, 12.5),
        *steps(1, 4, 55, 99, 12.52),
    ],
    key=lambda r: r.t,
)


def outcome(trial: list[Record]) -> Outcome:
    return Outcome(0, 0.0, 30.0, trial, [], Spec(steps=100, ckpt_every=25))


def test_torchft_trial_reduces_to_a_heal_beside_the_running_group() -> None:
    """torchft: recovered when both ranks finish the job's step 80; nothing redone, one step
    discarded, 21 steps without rank 1's batch (20 alone, 1 healing), the healthy rank's 5 s wait
    is its stall."""
    got = reduce(outcome(TORCHFT_TRIAL))
    assert got.mttr_s == pytest.approx(17.02 - 10.0)
    assert got.redone == (0, 0)
    assert got.discarded == (1, 0)
    assert got.missed == 21
    assert got.stall_s == pytest.approx(15.0 - (9.5 + 0.4))
    assert got.resumed_at == 80


def test_restart_trial_reduces_to_steps_redone_by_every_rank() -> None:
    """rvsup: recovered at the first resumed step of both new processes; each rank redid 55..59
    and the healthy rank made no progress from its step 59 until its step 60."""
    got = reduce(outcome(RVSUP_TRIAL))
    assert got.mttr_s == pytest.approx(12.52 - 10.0)
    assert got.redone == (5, 5)
    assert got.discarded == (0, 0)
    assert got.missed == 0
    assert got.stall_s == pytest.approx((12.5 + 0.5) - (9.0 + 0.9))
    assert got.resumed_at == 55


@pytest.mark.parametrize(
    ("trial", "expected"),
    [
        (RVSUP_TRIAL, 12.52),  # the restart's first common step equals figure 1's reading
        (TORCHFT_TRIAL, 17.02),
        ([rec(11.0, 0, 1, 60)], None),  # one rank never came back
    ],
)
def test_rejoined(trial: list[Record], expected: float | None) -> None:
    """A common step finished by every rank after the fault marks the recovery."""
    assert records.rejoined(trial, 2, after=10.0) == expected


def floats(*values: float) -> bytes:
    return struct.pack(f"{len(values)}f", *values)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (floats(1.0, 2.0), floats(1.0, 2.0), 0.0),
        (floats(3.0, 4.0), floats(0.0, 4.0), 0.75),
        (floats(1.0), floats(1.0, 2.0), None),  # different sizes
        (b"", b"", None),
    ],
)
def test_relative_difference(a: bytes, b: bytes, expected: float | None) -> None:
    """||a - b|| / ||b|| of the float32 parameter vectors."""
    assert relative_difference(a, b) == (None if expected is None else pytest.approx(expected))


def test_compared_counts_identical_runs_and_reports_the_difference() -> None:
    """Bit-identical runs are counted; differing ones report their worst rank's relative L2."""
    ref = [floats(0.0, 4.0), floats(0.0, 4.0)]
    c = Compared()
    c.add(list(ref), ref)
    c.add([floats(3.0, 4.0), floats(0.0, 4.0)], ref)
    c.add(None, ref)  # a run that left no final state is not compared
    assert (c.identical, c.compared) == (1, 2)
    assert c.render() == "bit-identical 1/2; differ: relative L2 7.5e-01 (7.5e-01\u20137.5e-01)"


def test_table_says_torchft_is_not_installed(tmp_path: Path) -> None:
    """Without a torchft virtualenv its column says so in every row, and the notes say what is
    not like for like."""
    tools = {TORCHFT: TorchFT(venv=None), MEMORY: Rvsup(memory_every_steps=5)}
    cols = {TORCHFT: Column(), MEMORY: Column()}
    cols[MEMORY].add(reduce(outcome(RVSUP_TRIAL)), "memory@55")
    t = table(tools, cols, 100, 25)
    for _, cells in t.rows:
        assert str(cells[TORCHFT]).startswith("n/a (torchft not installed")
    assert t.cell("MTTR (kill -> every rank finished a common step)", MEMORY) is not None
    assert any(n.startswith("NOT like for like") for n in t.notes)
    assert TorchFT(venv=str(tmp_path)).unavailable() == f"n/a (no torchft_lighthouse in {tmp_path})"
