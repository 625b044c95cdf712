"""``python -m supervisor`` for real: exit codes, messages, and that refused starts launch nothing.

None of these start a training job: every call ends in well under a second when rvsup behaves.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import rvsup
from tests.helpers.jobs import write_job_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.process


def _job(tmp_path: Path, command: list[str] | None = None, extra: str = "") -> Path:
    """A valid job.toml in tmp_path (run_dir "run", checkpoint_dir "ckpt") with a cheap budget,
    so that a regression that does launch ends quickly."""
    argv = command if command is not None else [sys.executable, "train.py"]
    restart = 'max_restarts = 0\nbackoff = "0s"'
    return write_job_file(tmp_path, command=argv, tables={"restart": restart}, extra=extra)


def _event(at: str, name: str, attempt: int, **fields: Any) -> str:
    line = {"timestamp": at, "event": name, "level": "info", "job": "toy", "attempt": attempt}
    return json.dumps({**line, **fields})


def _write_history(run_dir: Path, *extra_lines: str) -> None:
    """A hand-written events.jsonl (every field as rvsup writes it): a crash in attempt 1, a
    success in attempt 2."""
    run_dir.mkdir(mode=0o700, exist_ok=True)
    started = {"config": "job.toml", "host": "h", "restarts_used": 0, "restart_count": None}
    launched = {"launcher": ["torchrun"], "nnodes": 1, "nproc_per_node": 2}
    launched |= {"slurm_job_id": None, "restart_count": None}
    lines = [
        _event("2026-01-01T00:00:00Z", "job_started", 0, pid=1, slurm_job_id=None, **started),
        _event(
            "2026-01-01T00:00:01Z", "attempt_started", 1, resume_step=0, checkpoint=None, **launched
        ),
        _event(
            "2026-01-01T00:00:10Z",
            "checkpoint_committed",
            1,
            step=9,
            path="c/step-9",
            seconds=0.1,
            bytes=100,
            source="sdk",
        ),
        _event(
            "2026-01-01T00:00:15Z",
            "failure_detected",
            1,
            kind="crash",
            ranks=[1],
            last_step=14,
            detail="rank 1 killed by SIGKILL",
        ),
        _event(
            "2026-01-01T00:00:15.500000Z",
            "restart_scheduled",
            1,
            backoff_s=0.5,
            restarts_left=2,
            charged=True,
            deterministic=False,
            note="",
        ),
        _event(
            "2026-01-01T00:00:17Z",
            "attempt_started",
            2,
            resume_step=10,
            checkpoint="c/step-9",
            **launched,
        ),
        _event("2026-01-01T00:00:30Z", "job_succeeded", 2, last_step=59),
        *extra_lines,
    ]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- validate


def test_validate_prints_resolved_toml(tmp_path: Path) -> None:
    """validate exits 0 and prints TOML with every default and absolute paths; it round-trips."""
    job = _job(tmp_path)
    res = rvsup("validate", str(job))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    resolved = tomllib.loads(res.stdout)
    assert set(resolved) == {
        "job",
        "launch",
        "checkpoint",
        "heartbeat",
        "restart",
        "slurm",
        "anomaly",
        "health",
        "metrics",
    }
    assert resolved["metrics"] == {"listen": "off", "textfile": "off", "interval": "5s"}
    assert resolved["health"] == {
        "enabled": True,
        "command": [],
        "timeout": "1m",
        "checkpoint_free": "auto",
        "shm_free": "auto",
        "memory_free": 1 << 30,
        "gpus": "auto",
        "exclude_after": 2,
        "exclude_stragglers": False,
    }
    assert resolved["job"]["name"] == "toy"
    assert resolved["job"]["command"] == [sys.executable, "train.py"]
    assert resolved["job"]["run_dir"] == str(tmp_path / "run")
    assert resolved["job"]["checkpoint_dir"] == str(tmp_path / "ckpt")
    assert resolved["restart"]["max_restarts"] == 0
    assert resolved["checkpoint"]["every_steps"] == 500  # a default, written out
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]  # validate creates nothing
    again = tmp_path / "again.toml"
    again.write_text(res.stdout)
    res2 = rvsup("validate", str(again))
    assert (res2.returncode, res2.stdout) == (0, res.stdout)


def test_validate_lists_every_error(tmp_path: Path) -> None:
    """validate of a bad file exits 2 and names every problem by its key, on stderr."""
    job = tmp_path / "bad.toml"
    job.write_text(
        '[job]\nname = "-bad"\ncommand = []\n\n'
        '[restart]\nmax_restarts = -1\nbackoff = "soon"\n\n'
        "[bogus]\nx = 1\n"
    )
    res = rvsup("validate", str(job))
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert lines[0] == f"rvsup: invalid job file {job}:"
    keys = {line.strip().split(":", 1)[0] for line in lines[1:]}
    assert keys == {"job.name", "job.command", "restart.max_restarts", "restart.backoff", "bogus"}
    assert "'-bad'" in res.stderr and "'soon'" in res.stderr


def test_validate_unparsable_toml(tmp_path: Path) -> None:
    """A file that is not TOML is one error about the file itself, exit 2."""
    job = tmp_path / "broken.toml"
    job.write_text("x = [\n")
    res = rvsup("validate", str(job))
    assert res.returncode == 2
    assert "(file): invalid TOML" in res.stderr


# ---------------------------------------------------------------- start refusals


def test_start_bad_file_launches_nothing(tmp_path: Path) -> None:
    """start of an invalid job file exits 2 before creating any directory."""
    job = _job(tmp_path, command=[])
    res = rvsup("start", str(job), timeout=30)
    assert res.returncode == 2
    assert "job.command" in res.stderr
    assert sorted(os.listdir(tmp_path)) == ["job.toml"]


def test_start_missing_program_is_one_line(tmp_path: Path) -> None:
    """start with a command whose program does not exist exits 2 with a one-line error."""
    job = _job(tmp_path, command=["no-such-program-rvsup-test", "train.py"])
    res = rvsup("start", str(job), timeout=30)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rvsup: job.command[0]:")
    assert "no-such-program-rvsup-test" in lines[0]
    assert not (tmp_path / "run" / "events.jsonl").exists()
    assert not (tmp_path / "run" / "daemon.json").exists()


def test_start_foreign_checkpoint_dir_deletes_nothing(tmp_path: Path) -> None:
    """start with a checkpoint_dir holding a foreign file exits 2 and leaves the file alone."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    (ckpt / "notes.txt").write_text("mine\n")
    (ckpt / "step-0000000001").mkdir()
    job = _job(tmp_path)
    res = rvsup("start", str(job), timeout=30)
    assert res.returncode == 2
    assert "job.checkpoint_dir" in res.stderr
    assert "notes.txt" in res.stderr
    assert sorted(os.listdir(ckpt)) == ["notes.txt", "step-0000000001"]
    assert (ckpt / "notes.txt").read_text() == "mine\n"
    assert not (tmp_path / "run" / "events.jsonl").exists()


# ---------------------------------------------------------------- status / stop without a daemon


def test_status_without_daemon_never_started(tmp_path: Path) -> None:
    """status of a job that never ran exits 1 and says it is not running (no traceback)."""
    job = _job(tmp_path)
    res = rvsup("status", str(job))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr, res.stderr
    assert "toy: not running" in res.stdout
    assert "never started" in res.stdout


def test_status_without_daemon_after_a_run(tmp_path: Path) -> None:
    """status with a history but no daemon exits 1 and names the last attempt's outcome."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("status", str(job))
    assert res.returncode == 1
    assert "toy: not running" in res.stdout
    assert "no rvsup daemon is running" in res.stdout
    assert "last attempt: succeeded" in res.stdout
    res = rvsup("status", str(job), "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout) == {
        "ok": False,
        "state": "not running",
        "last_outcome": "succeeded",
    }


def test_status_with_stale_daemon_file(tmp_path: Path) -> None:
    """A daemon.json left by a dead daemon (socket file nobody listens on) is 'not running'."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    dead = tmp_path / "run" / "c.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(dead))
    sock.close()
    info = {"pid": 1, "control": str(dead), "endpoint": "ipc://x"}
    (tmp_path / "run" / "daemon.json").write_text(json.dumps(info))
    res = rvsup("status", str(job))
    assert res.returncode == 1
    assert "not running" in res.stdout and "stale" in res.stdout
    res = rvsup("stop", str(job), "--no-wait")
    assert res.returncode == 1
    assert "no rvsup daemon is running" in res.stderr and "stale" in res.stderr


def test_stop_without_daemon(tmp_path: Path) -> None:
    """stop with no daemon exits 1 and says no daemon is running (not a raw file error)."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("stop", str(job))
    assert res.returncode == 1
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert "no rvsup daemon is running" in res.stderr, res.stderr


# ---------------------------------------------------------------- history


def test_history_without_events_file(tmp_path: Path) -> None:
    """history of a job that never ran exits 0 and says no attempts are recorded."""
    job = _job(tmp_path)
    res = rvsup("history", str(job))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0
    assert "toy: no attempts recorded" in res.stdout


def test_history_with_empty_events_file(tmp_path: Path) -> None:
    """history of an empty events.jsonl exits 0 and says no attempts are recorded."""
    job = _job(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text("")
    res = rvsup("history", str(job))
    assert res.returncode == 0
    assert res.stdout.startswith("toy: no attempts recorded in ")
    res = rvsup("history", str(job), "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout)["attempts"] == []
    assert json.loads(res.stdout)["summary"]["attempts"] == 0


def test_history_json_rows(tmp_path: Path) -> None:
    """history --json prints one row per attempt, folded from a hand-written events.jsonl, and
    the summary (failures by kind, steps redone, time lost)."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run", "this line is not JSON")
    res = rvsup("history", str(job), "--json")
    assert res.returncode == 0
    answer = json.loads(res.stdout)
    rows = answer["attempts"]
    assert [r["attempt"] for r in rows] == [1, 2]
    first, second = rows
    assert first["outcome"] == "crash"
    assert first["detail"] == "rank 1 killed by SIGKILL"
    assert (first["resume_step"], first["last_step"], first["checkpoint_step"]) == (0, 14, 9)
    assert first["steps_lost"] == 5  # steps 10..14 ran again
    assert first["seconds_lost"] == pytest.approx(5.5)  # commit -> failure, plus the backoff
    assert first["started"] == "2026-01-01T00:00:01.000000Z"
    assert first["ended"] == "2026-01-01T00:00:15.000000Z"
    assert second["outcome"] == "succeeded"
    assert (second["resume_step"], second["last_step"], second["steps_lost"]) == (10, 59, 0)
    assert "skipped 1 unreadable line(s)" in res.stderr
    total = answer["summary"]
    assert (total["attempts"], total["failures"], total["steps_redone"]) == (2, {"crash": 1}, 5)
    assert total["time_lost_s"] == pytest.approx(5.5)


def test_history_table(tmp_path: Path) -> None:
    """history without --json prints a header, one line per attempt and the summary."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("history", str(job))
    assert res.returncode == 0
    assert res.stderr == ""
    header, *rows, total, good = res.stdout.splitlines()
    assert header.split()[:2] == ["attempt", "started"]
    assert len(rows) == 2
    assert total.startswith("2 attempts (1 crash); 5 steps redone; 5.5s lost of ")
    assert good.startswith("goodput ") and "badput: " in good
    assert rows[0].split()[0] == "1" and "crash" in rows[0]
    assert rows[1].split()[0] == "2" and "succeeded" in rows[1]


def test_history_json_has_the_goodput_by_source_and_attempt(tmp_path: Path) -> None:
    """history --json carries the goodput: wall, goodput, badput by source (adding up to the
    wall time) and each attempt's steps redone."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("history", str(job), "--json")
    assert res.returncode == 0, res.stderr
    good = json.loads(res.stdout)["goodput"]
    assert good["wall_s"] == pytest.approx(good["goodput_s"] + sum(good["badput_s"].values()))
    assert [a["steps_redone"] for a in good["attempts"]] == [5, 0]


def test_history_plot_refuses_other_suffixes(tmp_path: Path) -> None:
    """--plot FILE.gif exits 2 naming the two formats and writes nothing."""
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("history", str(job), "--plot", str(tmp_path / "h.gif"))
    assert res.returncode == 2
    assert "must end in .png or .svg" in res.stderr
    assert not (tmp_path / "h.gif").exists()


def test_history_plot_draws_an_svg(tmp_path: Path) -> None:
    """--plot FILE.svg draws the history there and says where."""
    pytest.importorskip("matplotlib", reason="needs the extra rvsup[plot]")
    job = _job(tmp_path)
    _write_history(tmp_path / "run")
    res = rvsup("history", str(job), "--plot", str(tmp_path / "h.svg"))
    assert res.returncode == 0, res.stderr
    assert f"into {tmp_path / 'h.svg'}" in res.stdout
    assert 'id="failure-1"' in (tmp_path / "h.svg").read_text()


# ---------------------------------------------------------------- usage


@pytest.mark.parametrize("command", ["start", "validate", "status", "stop", "history"])
def test_missing_job_file(tmp_path: Path, command: str) -> None:
    """Every command exits 2 for a job file that does not exist, naming it."""
    missing = tmp_path / "nope.toml"
    res = rvsup(command, str(missing), timeout=30)
    assert res.returncode == 2
    assert str(missing) in res.stderr
    assert "Traceback" not in res.stderr
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("argv", [[], ["frobnicate", "job.toml"], ["status"]])
def test_usage_errors(argv: list[str]) -> None:
    """No command, an unknown command or a missing argument is a usage error (exit 2)."""
    res = rvsup(*argv)
    assert res.returncode == 2
    assert "usage: rvsup" in res.stderr
