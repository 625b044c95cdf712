"""The warm standby launcher: a restart hands its command line to a torchrun started (and done
importing) while the previous attempt ran; with warm_standby = false every attempt starts its own."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.helpers.harness import (
    events,
    launcher_of_ranks,
    named,
    running,
    wait_progress,
    write_job,
)

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]


def _restart_launcher(job: Path, daemon: int) -> tuple[psutil.Process, set[int], int]:
    """Kill rank 1 at step >= 15, wait for the next attempt past step 32; return that attempt's
    torchrun (the parent of its rank 0), the daemon's descendants alive just before the kill
    (process start times from psutil are too coarse to compare with the clock) and its rank 0."""
    st = wait_progress(job, min_step=15)
    victim = next(r for r in st["ranks"] if r["rank"] == 1)
    before = {p.pid for p in psutil.Process(daemon).children(recursive=True)}
    os.kill(victim["pid"], signal.SIGKILL)
    st = wait_progress(job, min_step=32)
    rank0 = next(r for r in st["ranks"] if r["rank"] == 0)["pid"]
    return launcher_of_ranks(daemon, rank0), before, rank0


@pytest.mark.parametrize("zygote", [True, False])
def test_restart_runs_on_the_warm_launcher(tmp_path: Path, zygote: bool) -> None:
    """After a crash the next attempt's torchrun is the standby: a process started before the
    crash (while attempt 1 ran), running worker_sdk.spawn.standby, forked from the zygote (which
    imported torchrun) when there is one; the job completes, and the standby prepared during
    attempt 2 is gone when rvsup ends (the suite checks no process is left). With ``zygote =
    false`` no launcher is given ``--zygote`` and each rank is its launcher's child (the
    bootstrap exec'd the script). The first attempt's torchrun, with a zygote, is forked from
    it as well (a standby made at the start, in place of a torchrun importing torch itself);
    without one it is started cold."""
    launch = f'term_timeout = "3s"\nstop_timeout = "30s"\nzygote = {str(zygote).lower()}'
    # slower from step 33: the status that shows step 32 comes before the job's end on a
    # loaded machine; at full speed once the checks are done
    slow = tmp_path / "slow"
    slow.touch()
    env = {"STEP_SLEEP": "0.05", "TAIL_FROM": "33", "TAIL_SLEEP": "0.2", "SLOW_WHILE": str(slow)}
    job = write_job(tmp_path, env=env, launch=launch)
    with running(job) as proc:
        st = wait_progress(job, min_step=3)
        first = launcher_of_ranks(proc.pid, next(r for r in st["ranks"] if r["rank"] == 0)["pid"])
        first_parent = first.parent()
        assert first_parent is not None
        if zygote:
            assert first.cmdline()[-1].endswith("worker_sdk/spawn/standby.py"), first.cmdline()
            assert "worker_sdk.spawn.zygote" in " ".join(first_parent.cmdline())
        else:
            assert "worker_sdk.spawn.standby" not in " ".join(first.cmdline()), first.cmdline()
            assert first_parent.pid == proc.pid
        launcher, before, rank0 = _restart_launcher(job, proc.pid)
        assert launcher.pid in before and launcher.pid != first.pid
        parent = launcher.parent()
        assert parent is not None
        if zygote:
            assert launcher.cmdline()[-1].endswith("worker_sdk/spawn/standby.py"), (
                launcher.cmdline()
            )
            assert "worker_sdk.spawn.zygote" in " ".join(parent.cmdline()), parent.cmdline()
        else:
            assert "worker_sdk.spawn.standby" in " ".join(launcher.cmdline())
            assert parent.pid == proc.pid  # the bootstrap exec'd into it
            assert psutil.Process(rank0).ppid() == launcher.pid  # a cold rank
        slow.unlink()
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    evs = events(tmp_path / "run")
    launchers = [a["launcher"] for a in named(evs, "attempt_started")]
    assert zygote or not any("--zygote" in argv for argv in launchers), launchers
    assert [f["kind"] for f in named(evs, "failure_detected")] == ["crash"]
    assert named(evs, "job_succeeded")


def test_without_warm_standby_each_attempt_starts_its_launcher(tmp_path: Path) -> None:
    """warm_standby = false: the restarted attempt's torchrun starts after the crash."""
    job = write_job(
        tmp_path,
        env={"STEP_SLEEP": "0.05"},
        launch='term_timeout = "3s"\nstop_timeout = "30s"\nwarm_standby = false',
    )
    with running(job) as proc:
        launcher, before, _ = _restart_launcher(job, proc.pid)
        assert launcher.pid not in before
        assert "worker_sdk.spawn.standby" not in " ".join(launcher.cmdline())
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
