"""The benchmarks' record arithmetic (tables of cases) and a real ``python -m benchmarks --smoke``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import records
from benchmarks.records import Record
from benchmarks.table import Cell, ratio

REPO = Path(__file__).resolve().parents[2]


def rec(t: float, rank: int, pid: int, step: int, event: str = "step") -> Record:
    return Record(t, rank, pid, step, event)


# two ranks; a kill at t=10 (pids 1, 2 -> 3, 4); the new processes resume at step 50
TRIAL = [
    rec(1.0, 0, 1, 0, "start"),
    rec(1.0, 1, 2, 0, "start"),
    rec(2.0, 0, 1, 0),
    rec(2.1, 1, 2, 0),
    rec(9.0, 0, 1, 60),
    rec(9.1, 1, 2, 59),
    rec(9.9, 1, 2, 60, "fault"),
    rec(14.0, 0, 3, 50, "start"),
    rec(14.0, 1, 4, 50, "start"),
    rec(14.5, 1, 4, 50),
    rec(14.6, 0, 3, 50),
]


@pytest.mark.parametrize(
    ("after", "world", "expected"),
    [
        (0.0, 2, 2.1),  # cold start: the slower rank's first step
        (9.9, 2, 14.6),  # after the fault: only the new processes count
        (9.9, 3, None),  # a rank that never stepped
        (15.0, 2, None),  # nothing after the end
    ],
)
def test_all_ranks_stepped(after: float, world: int, expected: float | None) -> None:
    """The first step on every rank counts only processes started after the given time."""
    assert records.all_ranks_stepped(TRIAL, world, after=after) == expected


@pytest.mark.parametrize(
    ("t", "world", "expected"),
    [(9.95, 2, 59), (2.05, 2, None), (2.2, 2, 0), (9.05, 2, 0)],
)
def test_group_step_before(t: float, world: int, expected: int | None) -> None:
    """The step every rank had finished is the minimum over ranks; None until all reported."""
    assert records.group_step_before(TRIAL, t, world) == expected


@pytest.mark.parametrize(
    ("done", "resumed", "expected"),
    [(59, 50, 10), (63, 64, 0), (64, 64, 1), (70, 80, 0), (None, 5, None), (5, None, None)],
)
def test_lost_steps(done: int | None, resumed: int | None, expected: int | None) -> None:
    """Steps to redo are those finished at or after the resume step."""
    assert records.lost_steps(done, resumed) == expected


def test_resume_step_is_the_new_process_start() -> None:
    """The resume step comes from the first start record of a process born after the fault."""
    assert records.resume_step(TRIAL, 9.9) == 50
    assert records.resume_step(TRIAL, 20.0) is None


def test_useful_step_seconds_counts_each_step_once() -> None:
    """A redone step counts with its last execution only; restart gaps are not useful time."""
    rs = [
        rec(0.0, 0, 1, 0, "start"),
        rec(1.0, 0, 1, 0),
        rec(2.0, 0, 1, 1),
        rec(10.0, 0, 2, 1, "start"),
        rec(10.5, 0, 2, 1),
        rec(11.0, 0, 2, 2),
    ]
    assert records.useful_step_seconds(rs) == pytest.approx(1.0 + 0.5 + 0.5)


@pytest.mark.parametrize(
    ("line", "expected_count"),
    [
        ('{"t": 1.5, "rank": 0, "pid": 7, "step": 3, "event": "step"}', 1),
        ('{"t": 1.5, "rank": 0, "pid": 7, "step": 3, "ev', 0),  # torn by a kill -9
        ('{"t": "x", "rank": 0, "pid": 7, "step": 3, "event": "step"}', 0),
        ("not json", 0),
    ],
)
def test_parse_records_skips_torn_lines(line: str, expected_count: int) -> None:
    """A line torn by a kill, or foreign, is skipped rather than failing the trial."""
    assert len(records.parse_records([line])) == expected_count


def _local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            (
                "W1122 19:30:05.986000 28108 torch/distributed/elastic/multiprocessing/api.py:1028] "
                "Sending process 28121 closing signal SIGTERM"
            ),
            _local("2026-11-22 19:30:05") + 0.986,
        ),
        (
            (
                "E1122 19:30:06.051000 28108 torch/distributed/elastic/multiprocessing/api.py:1002] "
                "failed (exitcode: -9) local_rank: 1 (pid: 28122) of binary: python3"
            ),
            _local("2026-11-22 19:30:06") + 0.051,
        ),
        ("I1122 19:30:06.051000 28108 api.py:1] Starting worker group", None),
        ("[rank0]: RuntimeError: Connection closed by peer", None),
    ],
)
def test_torch_log_noticed(line: str, expected: float | None) -> None:
    """torchrun's agent lines about a failed or stopped worker are when it noticed."""
    found = records.torch_log_noticed([line], 2026)
    assert found == ([] if expected is None else [pytest.approx(expected)])


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            (
                "[2026-11-22 19:33:16,033] [ERROR] [ft_launcher29201@vm] failed (exitcode: -9) "
                "local_rank: 1"
            ),
            _local("2026-11-22 19:33:16") + 0.033,
        ),
        (
            (
                "[2026-11-22 19:33:16,500] [WARNING] [RankMonServer29214@vm:0] Did not get "
                "subsequent heartbeat. Waited 10.00 seconds."
            ),
            _local("2026-11-22 19:33:16") + 0.5,
        ),
        ("[2026-11-22 19:33:16,034] [INFO] [ft_launcher29201@vm] Using nproc_per_node=2.", None),
        (
            (
                "2026-11-26 06:42:08,445 [WARNING] [vm] [workload:?(0) infra:?(?)] "
                "rank_monitor_server.py:497 [Cycle 0] Did not get subsequent heartbeat. "
                "Waited 10.00 seconds."
            ),
            _local("2026-11-26 06:42:08") + 0.445,
        ),
        (
            (
                "2026-11-26 06:42:08,540 [INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:636 "
                "[default] Worker group FAILED. 3/3 attempts left; will restart worker group"
            ),
            None,
        ),
    ],
)
def test_ft_log_noticed(line: str, expected: float | None) -> None:
    """ft_launcher's failure lines and its rank monitor's missed-heartbeat lines are notices, in
    0.4.1's format and in 0.7.0's."""
    found = records.ft_log_noticed([line])
    assert found == ([] if expected is None else [pytest.approx(expected)])


def test_loop_noticed_ignores_success_and_noise() -> None:
    """Only the retry loop's lines for a failed torchrun count."""
    lines = ["torchrun-exit 1 100.25", "torchrun-exit 0 200.0", "torchrun-exit 1 x", "hello"]
    assert records.loop_noticed(lines) == [100.25]


def test_rvsup_noticed_reads_failure_events() -> None:
    """failure_detected's noticed_at (ISO, UTC) is rvsup's notice time; other events are not."""
    lines = [
        json.dumps({"event": "failure_detected", "noticed_at": "2026-11-22T19:30:05.500000Z"}),
        json.dumps({"event": "attempt_started", "noticed_at": "2026-11-22T19:30:07Z"}),
        "{torn",
    ]
    assert records.rvsup_noticed(lines) == [pytest.approx(1795375805.5)]


@pytest.mark.parametrize(
    ("values", "text"),
    [([2.0], "2.00 s, n=1"), ([3.0, 1.0, 2.0], "2.00 s (1.00\u20133.00), n=3"), ([], "-")],
)
def test_cell_render(values: list[float], text: str) -> None:
    """A cell prints median (min-max), n; an empty one prints its note or a dash."""
    assert Cell(values, " s").render() == text


def test_ratio_of_medians_and_missing() -> None:
    """Ratios are of medians; a missing or zero denominator gives None."""
    assert ratio(Cell([1.0, 3.0]), Cell([4.0])) == pytest.approx(0.5)
    assert ratio(Cell([1.0]), Cell([])) is None
    assert ratio(Cell([1.0]), Cell([0.0])) is None


@pytest.mark.kills_daemon  # each run's tree is SIGKILLed at its end (its figures are not checked)
@pytest.mark.process
def test_smoke_run_prints_tables_and_writes_json(tmp_path: Path) -> None:
    """``python -m benchmarks --smoke`` runs every smoke figure for real, prints each table and
    writes JSON with measured values for rvsup (a NaN rolled back and resumed among them, and the
    silent simulated rank caught as a hang)."""
    pytest.importorskip("torch")  # the benchmarks train real models
    out = tmp_path / "smoke.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--smoke",
            "--out",
            str(out),
            "--scratch",
            str(tmp_path / "scratch"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=480,  # ~1.5 min on 2 idle cores; 3.5 min seen under a load average of 15
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for title in (
        "1. Crash",
        "7. SDK cost",
        "8. Checkpoint",
        "9b. A real rvsup daemon",
        "11. Training gone wrong",
    ):
        assert title in res.stdout, res.stdout
    data = json.loads(out.read_text())
    figures = data["figures"]
    assert set(figures) == {"crash", "sdk", "checkpoint", "scale", "anomaly"}
    rollback = figures["anomaly"]["rows"]["total: anomalous step -> resumed step on all ranks"]
    assert rollback['NaN, defaults (backoff "5s")']["median"] > 0
    mttr = figures["crash"]["rows"]["MTTR (kill -> resumed step on all ranks)"]
    for col in ("rvsup (auto)", "rvsup (cold ranks)"):  # forked ranks, and cold ones beside
        assert mttr[col]["n"] == 1 and mttr[col]["median"] > 0, col
    assert figures["sdk"]["rows"]["step(), nothing due (median of batches)"]["rvsup SDK"]["n"] > 0
    silent = figures["scale"]["rows"]["one rank goes silent -> hang detected"]
    assert all(cell["n"] == 1 for cell in silent.values()), silent  # not waited out at the cap
    assert data["machine"]["cores"] >= 1


def test_checkpoint_writers_each_measured_and_their_files_removed(tmp_path: Path) -> None:
    """Figure 8 times every writer once per repetition (the atomic save, torch.save over one file
    with and without fsync, to a new file each time, dd) and leaves nothing on the disk."""
    pytest.importorskip("torch")
    from benchmarks import fig_checkpoint

    out = fig_checkpoint.measure(tmp_path / "ckpt", 1, 3)
    assert list(out) == fig_checkpoint.KEYS
    assert all(len(values) == 3 and min(values) > 0 for values in out.values())
    assert not (tmp_path / "ckpt").exists()


def test_a_rollback_is_split_into_detection_restart_restore_and_first_step() -> None:
    """Figure 11 splits anomalous step -> resumed step at the events and records that bound
    each phase: the step's record, anomaly_detected, the new ranks' boot, start and step."""
    from benchmarks.fig_anomaly import split
    from benchmarks.tools import Spec
    from benchmarks.trials import Outcome

    trial = [
        rec(1.0, 1, 2, 60, "fault"),
        rec(1.1, 1, 2, 60),
        rec(1.15, 0, 1, 60),
        rec(2.0, 0, 3, -1, "boot"),
        rec(2.2, 1, 4, -1, "boot"),
        rec(2.8, 0, 3, 61, "start"),
        rec(2.9, 1, 4, 61, "start"),
        rec(3.0, 1, 4, 61),
        rec(3.1, 0, 3, 61),
    ]
    events: list[dict[str, Any]] = [
        {"event": "anomaly_detected", "timestamp": "1970-01-01T00:00:01.300000Z"},
        {"event": "rolled_back", "to_step": 49, "from_step": 60, "onset": 60},
    ]
    o = Outcome(0, 0.0, 4.0, trial, [], Spec(steps=80, ckpt_every=25))
    s = split(o, events)
    got = [s.total, s.detection, s.restart, s.restore, s.first_step]
    assert got == pytest.approx([2.0, 0.2, 0.9, 0.7, 0.2])
    assert s.resumed_at == 61 and s.rolled_back is events[1]
