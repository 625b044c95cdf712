"""A stop honoured at any moment of ``rvsup start``: SIGTERM while it starts (from the moment it
catches the signal, through reading its configuration, to its first attempt's launch) and while it
finishes ends like every stop, or with the outcome already reached; nothing is left behind (the
suite's guard checks every case).

Each moment is found by watching the daemon (the signal mask in /proc, its run directory, its
events), not by sleeping; from that moment on SIGTERM is sent every few milliseconds until the
daemon exits, so that its whole way out is hit too."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import events, kill_tree, named, rvsup_env, write_job

# serial: signals aimed at moments of start-up; caught within 2 s
pytestmark = [pytest.mark.process, pytest.mark.serial]

_EVERY_S = 0.005  # between two SIGTERMs of the barrage
_POLL_S = 0.001


def _catches_sigterm(pid: int) -> bool:
    """The process has a handler for SIGTERM (``SigCgt`` in /proc/PID/status)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@contextlib.contextmanager
def _daemon(job: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``rvsup start JOB`` (its stderr in the job's folder); its whole tree killed on exit."""
    with (job.parent / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "start", str(job)],
            env=rvsup_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            yield proc
        finally:
            kill_tree(proc.pid)
            proc.wait(timeout=10)


def _poll(proc: subprocess.Popen[bytes], moment: Callable[[], Any], what: str) -> None:
    """Wait for ``moment()`` (the daemon must still run), polling every millisecond."""
    deadline = time.monotonic() + 120
    while not moment():
        assert proc.poll() is None, f"rvsup exited {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} after 120 s"
        time.sleep(_POLL_S)


def _terminate_until_it_ends(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM now and every few milliseconds until the daemon exits; its exit status."""
    deadline = time.monotonic() + 120
    while proc.poll() is None:
        assert time.monotonic() < deadline, "rvsup did not end within 120 s of the stop"
        proc.send_signal(signal.SIGTERM)
        time.sleep(_EVERY_S)
    return proc.returncode


def _logged(run_dir: Path, name: str) -> Callable[[], bool]:
    return lambda: bool(named(events(run_dir), name))


def _assert_stopped(run_dir: Path, code: int, stderr: str) -> None:
    """Exit 75, the stop requested once (by SIGTERM, preemption) and the job stopped once."""
    assert code == 75, stderr[-3000:]
    evs = events(run_dir)
    requested = named(evs, "stop_requested")
    assert [(e["reason"], e["source"]) for e in requested] == [("preempted", "signal SIGTERM")]
    assert [e["reason"] for e in named(evs, "job_stopped")] == ["preempted"]
    assert not named(evs, "job_succeeded")
    assert evs.index(requested[0]) > evs.index(named(evs, "job_started")[0])


# the moments of start-up, each found by watching the daemon: it catches SIGTERM (the first
# instruction of rvsup), then some milliseconds later (importing, reading the job file), its
# run directory exists, it logged job_started, it logged its first attempt's start
_STARTUP: dict[str, tuple[Callable[[int, Path], Any], float]] = {
    "catches SIGTERM": (lambda pid, run: _catches_sigterm(pid), 0.0),
    "catches SIGTERM +20ms": (lambda pid, run: _catches_sigterm(pid), 0.02),
    "catches SIGTERM +100ms": (lambda pid, run: _catches_sigterm(pid), 0.1),
    "catches SIGTERM +250ms": (lambda pid, run: _catches_sigterm(pid), 0.25),
    "run directory made": (lambda pid, run: run.is_dir(), 0.0),
    "job_started": (lambda pid, run: _logged(run, "job_started")(), 0.0),
    "attempt_started": (lambda pid, run: _logged(run, "attempt_started")(), 0.0),
}


@pytest.mark.parametrize("moment", list(_STARTUP))
def test_sigterm_while_starting_stops_the_job(tmp_path: Path, moment: str) -> None:
    """SIGTERM at a moment of start-up: exit 75, the stop recorded once (stop_requested by
    SIGTERM after job_started, job_stopped "preempted"), no job_succeeded, nothing left."""
    job = write_job(tmp_path, total=100000, env={"STEP_SLEEP": "0.02"})
    run_dir = tmp_path / "run"
    reached, then_s = _STARTUP[moment]
    with _daemon(job) as proc:
        _poll(proc, lambda: reached(proc.pid, run_dir), moment)
        time.sleep(then_s)
        code = _terminate_until_it_ends(proc)
    _assert_stopped(run_dir, code, (tmp_path / "stderr.txt").read_text())


def test_rvsup_start_catches_sigterm_soon_after_it_began(tmp_path: Path) -> None:
    """The only time a stop cannot be honoured is before the interpreter ran rvsup's first
    instruction: rvsup start catches SIGTERM before it has begun any work (no event log yet),
    within 2 s of being started even on a loaded machine (the interpreter's own start;
    docs/stopping.md quotes it), and a stop then ends like any other."""
    job = write_job(tmp_path, total=100000)
    started = time.monotonic()
    with _daemon(job) as proc:
        _poll(proc, lambda: _catches_sigterm(proc.pid), "SIGTERM caught")
        took = time.monotonic() - started
        assert not (tmp_path / "run" / "events.jsonl").exists(), "caught before it starts work"
        code = _terminate_until_it_ends(proc)
    assert code == 75
    assert took < 2.0, f"rvsup caught SIGTERM only {took:.3f} s after it was started"


@pytest.mark.parametrize("moment", ["final state written", "job_succeeded"])
def test_sigterm_while_finishing_ends_with_the_outcome_reached_or_a_stop(
    tmp_path: Path, moment: str
) -> None:
    """SIGTERM from the moment the last step's state is written (rank 0 wrote the final state)
    or the job's success is logged, until the daemon exits: exit 0 with job_succeeded and no
    stop (the outcome was reached), or, when the stop came first, exit 75 with the stop
    recorded; never both, never a death by the signal."""
    final = tmp_path / "final.pt"
    job = write_job(tmp_path, total=8, env={"STEP_SLEEP": "0.05", "FINAL": str(final)})
    run_dir = tmp_path / "run"
    with _daemon(job) as proc:
        if moment == "job_succeeded":
            _poll(proc, _logged(run_dir, "job_succeeded"), moment)
        else:
            _poll(proc, final.exists, moment)
        code = _terminate_until_it_ends(proc)
    evs = events(run_dir)
    stderr = (tmp_path / "stderr.txt").read_text()
    if code == 0:
        assert len(named(evs, "job_succeeded")) == 1, stderr[-3000:]
        assert not named(evs, "job_stopped")
    else:
        assert moment != "job_succeeded", f"exit {code} after the job succeeded: {stderr[-3000:]}"
        _assert_stopped(run_dir, code, stderr)
