"""A daemon killed with SIGKILL mid-attempt: its ranks die with it, and the next ``rvsup start``
closes the lost attempt in the history (``attempt_closed``) before going on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.helpers.harness import events, named, running, rvsup, wait_progress, write_job
from tests.helpers.states import assert_same_state, load_final

# kills a daemon; the next start ends what it left
pytestmark = [pytest.mark.process, pytest.mark.kills_daemon]


def test_a_killed_daemons_attempt_is_closed_by_the_next_start(
    tmp_path: Path, reference_final: Path
) -> None:
    """SIGKILL of the daemon at step >= 25: nothing of the job survives it (torchrun, the ranks,
    the zygote: parent-death signals); the next start logs attempt_closed for attempt 1
    ("supervisor lost", the ranks' last step from their step slots), charges no restart,
    resumes from the newest checkpoint and ends bit-identical; the history table shows no
    attempt left unknown and the summary counts the loss."""
    final, slow = tmp_path / "final.pt", tmp_path / "slow"
    slow.touch()  # 0.1 s steps until the kill; the next start's at full speed
    job = write_job(
        tmp_path, env={"FINAL": str(final), "STEP_SLEEP": "0.1", "SLOW_WHILE": str(slow)}
    )
    with running(job) as proc:
        wait_progress(job, min_step=25)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3, "the job's processes: torchrun and two ranks at least"
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert alive == [], "every rank and torchrun die with the daemon"
    slow.unlink()
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    (closed,) = named(evs, "attempt_closed")
    assert (closed["attempt"], closed["outcome"]) == (1, "supervisor lost")
    assert closed["last_step"] >= 25
    assert closed["last_seen"] is not None
    assert not [r for r in named(evs, "restart_scheduled") if r["charged"]]
    second = named(evs, "attempt_started")[-1]
    assert second["attempt"] == 2
    assert second["resume_step"] <= closed["last_step"] + 1
    assert_same_state(load_final(reference_final), load_final(final))
    table = rvsup("history", str(job)).stdout
    assert "unknown" not in table and "running" not in table
    summary, goodput = table.splitlines()[-2:]  # the summary, then the goodput by source
    assert "1 supervisor lost" in summary, table
    assert goodput.startswith("goodput "), table
