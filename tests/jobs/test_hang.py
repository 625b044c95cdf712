"""Hangs: ranks alive but no step finished. Caught within the timeout, stacks collected first."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from supervisor.process import native
from tests.helpers.harness import events, named, rvsup, write_job
from worker_sdk.contract import protocol as p

# serial: hangs are caught within stated seconds
pytestmark = [pytest.mark.process, pytest.mark.serial]

HANG_TIMEOUT = 4.0


def _run_hanging_job(tmp_path: Path, fault: str, hang_timeout: str) -> list[dict[str, object]]:
    job = write_job(
        tmp_path,
        env={"FAULT": fault, "STEP_SLEEP": "0.02"},
        total=40,
        heartbeat=f'interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = {hang_timeout}',
        restart='max_restarts = 1\nbackoff = "0.1s"',
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 0, res.stderr
    return events(tmp_path / "run")


def _check_hang(
    evs: list[dict[str, object]], *, timeout_s: float, culprit: int
) -> dict[str, object]:
    hangs = [f for f in named(evs, "failure_detected") if f["kind"] == "hang"]
    assert len(hangs) == 1, named(evs, "failure_detected")
    hang = hangs[0]
    assert isinstance(hang["detect_s"], float)
    assert timeout_s <= hang["detect_s"] <= timeout_s + 1.0, hang
    ranks = hang["ranks"]
    assert isinstance(ranks, list) and culprit in ranks, hang
    diag = Path(str(hang["diagnostics"]))
    stacks = {p.name: p.read_text() for p in diag.glob("rank-*.stacks")}
    assert set(stacks) == {"rank-00000.stacks", "rank-00001.stacks"}, diag
    assert all("File " in text for text in stacks.values())
    assert named(evs, "job_succeeded")
    return hang


@pytest.mark.parametrize(
    ("fault", "culprit", "where"),
    [
        (
            "sigstop:1:12:1",
            1,
            None,
        ),  # a stopped process: cannot even answer; still killed and reaped
        ("deadlock:1:12:1", 1, "inject"),  # a Python deadlock on a lock inside the loop
        ("mismatch:0:12:1", 0, None),  # mismatched collectives: recv vs all-reduce
    ],
)
def test_hang_is_detected_within_the_timeout_with_stacks(
    tmp_path: Path, fault: str, culprit: int, where: str | None
) -> None:
    """SIGSTOP, a deadlock on a lock in the loop, mismatched collectives (a real gloo hang): each is
    caught within
    hang_timeout + 1 s, every rank's Python and native stacks and flight recorder are on disk (a
    stopped rank's Python stacks read by py-spy without continuing it: no flight recorder of its
    own), no rank finishes a step after the hang was caught, the restarted job completes, and the culprit
    is named first: the rank outside any collective while the other
    waits in one or, where both wait inside torch (a receive, an all-reduce), the rank that the
    flight recorders show a collective behind. The native stacks of the ranks that run are taken
    while the hang is confirmed (so that the restart does not wait for py-spy)."""
    evs = _run_hanging_job(tmp_path, fault, f'"{HANG_TIMEOUT}s"')
    hang = _check_hang(evs, timeout_s=HANG_TIMEOUT, culprit=culprit)
    diag = Path(str(hang["diagnostics"]))
    py_spy = native.find_py_spy() is not None  # the test extra installs it: the daemon finds it too
    # a stopped rank read by py-spy is never continued: it dumps no flight recorder of its own
    stopped_read = py_spy and "sigstop" in fault  # rank 1 is the stopped one
    flights = {"rank-00000.flight.json"} | (set() if stopped_read else {"rank-00001.flight.json"})
    assert {f.name for f in diag.glob("rank-*.flight.json")} == flights, diag
    if py_spy:
        stacks = {f.name: f.read_text() for f in diag.glob("rank-*.native")}
        assert set(stacks) == {"rank-00000.native", "rank-00001.native"}, diag
        # py-spy may miss its 3 s deadline for one rank on a loaded machine (a reason line)
        assert any("Thread" in text for text in stacks.values()), stacks
        # taken while the hang was confirmed, except a stopped rank's (py-spy cannot read it)
        early = {name for name, text in stacks.items() if text.startswith("(native stacks taken")}
        assert early == ({"rank-00000.native"} if "sigstop" in fault else set(stacks)), stacks
    if fault.startswith("mismatch"):  # both wait in c10d: the stacks cannot tell
        assert hang["ranks"] == [0, 1], hang
        assert "flight recorder: rank 0 enqueued collective" in str(hang["detail"]), hang
        assert "rank 1 waits in collective" in str(hang["detail"]), hang
    else:
        assert hang["ranks"] == [1, 0], hang
        detail = str(hang["detail"])
        named_first = "rank 1 was stopped by a signal" if "sigstop" in fault else "rank 1 is not"
        assert named_first in detail, detail
        assert "rank 0 waits in" in detail, detail
    if where is not None:
        assert where in (Path(str(hang["diagnostics"])) / "rank-00001.stacks").read_text()
    # nothing trains on once the hang is caught (a stopped rank continued to dump included)
    slots = {r: p.read_step_slot(diag / p.step_slot_file(r)) for r in (0, 1)}
    assert all(s is not None and s <= int(str(hang["last_step"])) for s in slots.values()), (
        slots,
        hang,
    )


def test_ranks_spinning_on_collectives_nobody_completes_are_a_hang_at_the_timeout(
    tmp_path: Path,
) -> None:
    """Both ranks poll a gloo all-reduce the other never joins (``Work.is_completed()`` in a
    loop: a full core each, their stacks at the script's line, as hosts spinning in CUDA's wait
    behind a hung NCCL kernel are): their flight recorders show the collectives under way, so the
    group is stuck at the timeout, not a busy one given up to hang_timeout_max (30 min here)."""
    evs = _run_hanging_job(tmp_path, "pollwait:*:12:1", f'"{HANG_TIMEOUT}s"')
    hang = _check_hang(evs, timeout_s=HANG_TIMEOUT, culprit=1)
    assert "gloo:all_reduce" in str(hang["detail"]), hang
    assert not named(evs, "slow_phase"), named(evs, "slow_phase")


def test_automatic_hang_timeout_catches_a_fast_job_in_seconds(tmp_path: Path) -> None:
    """hang_timeout = "auto" on a ~20 ms/step job: the learned timeout is the 5 s floor, and the hang
    is caught within it + 1 s."""
    evs = _run_hanging_job(tmp_path, "deadlock:1:25:1", '"auto"')
    hang = _check_hang(evs, timeout_s=5.0, culprit=1)
    assert hang["hang_timeout_s"] == 5.0
    noticed = datetime.datetime.fromisoformat(str(hang["noticed_at"]))
    started = datetime.datetime.fromisoformat(str(named(evs, "attempt_started")[0]["timestamp"]))
    assert (noticed - started).total_seconds() < 30


def test_a_declared_phase_longer_than_the_hang_timeout_is_not_a_hang(tmp_path: Path) -> None:
    """Every rank spends 6 s inside worker_sdk.phase("eval") with hang_timeout = 3 s: no hang."""
    job = write_job(
        tmp_path,
        env={"FAULT": "phase:*:10", "PHASE_S": "6", "STEP_SLEEP": "0.02"},
        total=20,
        heartbeat='interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "3s"',
    )
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert not named(evs, "failure_detected")
    assert len(named(evs, "attempt_started")) == 1


def test_the_same_silence_without_a_phase_is_a_hang(tmp_path: Path) -> None:
    """Control for the test above: the same silence, undeclared, with every rank deadlocked on a
    lock (no work, no collective) is caught as a hang."""
    job = write_job(
        tmp_path,
        env={"FAULT": "deadlock:*:10:1", "STEP_SLEEP": "0.02"},
        total=20,
        heartbeat='interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "3s"',
    )
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 0, res.stderr
    assert [f["kind"] for f in named(events(tmp_path / "run"), "failure_detected")] == ["hang"]


def test_a_hang_right_after_start_is_not_left_to_the_startup_timeout(tmp_path: Path) -> None:
    """SIGSTOP of rank 1 at its third step (well inside the first heartbeat interval): the first
    finished step is reported at once, so the automatic timeout applies, not startup_timeout."""
    job = write_job(
        tmp_path,
        env={"FAULT": "sigstop:1:2:1", "STEP_SLEEP": "0.02"},
        total=20,
        heartbeat='interval = "1s"\nstartup_timeout = "120s"\nhang_timeout = "auto"',
        restart='max_restarts = 1\nbackoff = "0.1s"',
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 0, res.stderr
    hangs = [f for f in named(events(tmp_path / "run"), "failure_detected") if f["kind"] == "hang"]
    assert len(hangs) == 1
    assert isinstance(hangs[0]["detect_s"], float)
    assert hangs[0]["detect_s"] < 60, hangs[0]
