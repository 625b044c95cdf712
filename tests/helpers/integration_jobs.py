"""The jobs of the integration tests: a framework's real Trainer (tests/helpers/hf_worker.py,
lightning_worker.py) on 2 CPU ranks under rvsup, killed or stopped, compared with a run that
was not."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.helpers.harness import events, named, running, rvsup, wait_progress
from tests.helpers.jobs import write_job_file

__all__ = ["framework_job", "run_to_end", "stop_and_resume"]


def framework_job(
    tmp: Path, worker: str, total: int, env: Mapping[str, str] | None = None, *, every: int = 5
) -> Path:
    """``worker`` (a file of tests/helpers) for ``total`` steps, a checkpoint every ``every``
    steps; its output in ``tmp/out``, its final state in ``tmp/final.pt``."""
    return write_job_file(
        tmp,
        command=[sys.executable, str(Path(__file__).with_name(worker))],
        name="framework",
        env={
            "OMP_NUM_THREADS": "1",
            "TOTAL_STEPS": str(total),
            "OUT": "out",
            "FINAL": "final.pt",
            **(env or {}),
        },
        tables={
            "launch": 'nproc_per_node = 2\nterm_timeout = "5s"\nstop_timeout = "60s"',
            "checkpoint": f"every_steps = {every}",
            "heartbeat": 'interval = "0.2s"\nstartup_timeout = "180s"\nhang_timeout = "90s"',
            "restart": 'max_restarts = 2\nbackoff = "0.1s"\nbackoff_max = "1s"',
        },
    )


def run_to_end(job: Path) -> tuple[str, list[dict[str, Any]]]:
    """``rvsup start`` to success: the output and the history."""
    res = rvsup("start", str(job), timeout=280)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    return output, events(job.parent / "run")


def stop_and_resume(job: Path, *, min_step: int) -> int:
    """SIGTERM to the daemon once every rank finished ``min_step``: exit 75 after a marked
    checkpoint of the framework's at the step the stop names; then ``rvsup start`` again to the
    end, resuming at the next step with no failure. Returns that step."""
    with running(job) as proc:
        wait_progress(job, min_step=min_step, timeout=180)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    evs = events(job.parent / "run")
    stopped = named(evs, "job_stopped")
    assert len(stopped) == 1 and stopped[0]["reason"] == "preempted", stopped
    at: int = stopped[0]["step"]
    assert at is not None and at >= min_step
    last = named(evs, "checkpoint_committed")[-1]
    assert (last["step"], last["mode"]) == (at, "external"), last
    _, evs = run_to_end(job)
    assert named(evs, "attempt_started")[-1]["resume_step"] == at + 1
    assert not named(evs, "failure_detected")
    return at
