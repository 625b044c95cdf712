"""Stopping with nothing lost: `rvsup stop`, SIGTERM/SIGUSR1 (what Slurm sends), and stops that go wrong."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.harness import events, named, running, rvsup, wait_for, wait_progress, write_job
from tests.helpers.states import assert_same_state, load_final

# serial: stops end within stated seconds; heartbeat ages bounded
pytestmark = [pytest.mark.process, pytest.mark.serial]


def _slow_from(step: int, tmp: Path) -> dict[str, str]:
    """The trainer's environment for a job that is still training when a stop aimed just
    before ``step`` lands, on a loaded machine too: steps of 0.05 s, of 0.4 s from ``step`` on,
    and no sleep at all once the test removes ``tmp / "slow"`` (the resumed run)."""
    (tmp / "slow").touch()
    return {
        "STEP_SLEEP": "0.05",
        "TAIL_FROM": str(step),
        "TAIL_SLEEP": "0.4",
        "SLOW_WHILE": str(tmp / "slow"),
    }


def _resume_and_finish(job: Path) -> None:
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr


def test_rvsup_stop_checkpoints_at_a_common_step_and_resumes_with_nothing_redone(
    tmp_path: Path, reference_final: Path
) -> None:
    """`rvsup stop`: every rank saves at one step, the daemon exits 75, status showed the ranks,
    and the resumed run redoes zero steps and ends bit-identical."""
    final = tmp_path / "final.pt"
    job = write_job(tmp_path, env={"FINAL": str(final), **_slow_from(15, tmp_path)})
    with running(job) as proc:
        st = wait_progress(job, min_step=14)
        assert st["state"] == "running" and {r["rank"] for r in st["ranks"]} == {0, 1}
        assert all(r["heartbeat_age_s"] < 5 for r in st["ranks"])
        res = rvsup("stop", str(job), timeout=60)
        assert res.returncode == 0, res.stderr
        proc.communicate(timeout=30)
    assert proc.returncode == 75
    (tmp_path / "slow").unlink()
    evs = events(tmp_path / "run")
    stopped = named(evs, "job_stopped")
    assert len(stopped) == 1 and stopped[0]["reason"] == "stopped"
    stop_step = stopped[0]["step"]
    assert stop_step is not None
    assert stop_step >= 14, "the stop saves where the ranks are, not at an older periodic save"
    assert any(e["step"] == stop_step for e in named(evs, "checkpoint_committed"))
    _resume_and_finish(job)
    evs = events(tmp_path / "run")
    assert named(evs, "attempt_started")[-1]["resume_step"] == stop_step + 1
    assert not named(evs, "failure_detected")
    assert_same_state(load_final(reference_final), load_final(final))


@pytest.mark.parametrize(
    ("sig", "reason"), [(signal.SIGTERM, "preempted"), (signal.SIGUSR1, "timelimit")]
)
def test_slurm_signals_stop_cleanly_well_inside_the_grace_window(
    tmp_path: Path, sig: signal.Signals, reason: str
) -> None:
    """SIGTERM / SIGUSR1 to the daemon: checkpoint, exit 75 within a few seconds (Slurm gives 30),
    not charged to the restart budget."""
    job = write_job(tmp_path, env={"STEP_SLEEP": "0.02"}, total=100000)
    with running(job) as proc:
        wait_progress(job, min_step=5)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        proc.communicate(timeout=30)
        took = time.monotonic() - t0
    assert proc.returncode == 75
    assert took < 10, f"stop took {took:.1f}s"
    evs = events(tmp_path / "run")
    stopped = named(evs, "job_stopped")
    assert stopped[0]["reason"] == reason and stopped[0]["step"] is not None
    assert not named(evs, "restart_scheduled")


def test_a_rank_that_never_answers_the_stop_is_killed_at_the_deadline(tmp_path: Path) -> None:
    """A rank stuck (sleeping forever) when the stop arrives: the stop gives up at its deadline,
    the tree is killed, exit 75, and the previous checkpoint is still the newest valid one."""
    job = write_job(
        tmp_path,
        env={"STEP_SLEEP": "0.05", "FAULT": "sleep:1:25"},
        total=100000,
        launch='term_timeout = "2s"\nstop_timeout = "4s"',
        heartbeat='interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "120s"',
    )
    with running(job) as proc:
        wait_progress(job, min_step=20)
        time.sleep(2.0)  # rank 1 is asleep at step 25, rank 0 blocks in the next all-reduce
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 75
    assert took < 4 + 2 + 3
    stopped = named(events(tmp_path / "run"), "job_stopped")
    assert stopped[0]["step"] is None and "previous" in stopped[0]["note"]
    assert max(p.name for p in (tmp_path / "ckpt").glob("step-*")) == "step-0000000019"


def test_a_second_signal_during_the_stop_does_not_break_it(tmp_path: Path) -> None:
    """SIGTERM then SIGINT 0.1 s later (Slurm and an impatient user): one stop, one checkpoint, 75."""
    job = write_job(tmp_path, env={"STEP_SLEEP": "0.02"}, total=100000)
    with running(job) as proc:
        wait_progress(job, min_step=5)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 75
    evs = events(tmp_path / "run")
    assert len(named(evs, "stop_requested")) == 1
    assert named(evs, "job_stopped")[0]["step"] is not None


def test_a_rank_dying_mid_stop_leaves_the_previous_checkpoint_valid(
    tmp_path: Path, reference_final: Path
) -> None:
    """Rank 1 killed right after the stop request: the stop ends at once (exit 75), the job resumes
    from the previous checkpoint and still ends bit-identical."""
    final = tmp_path / "final.pt"
    job = write_job(tmp_path, env={"FINAL": str(final), **_slow_from(15, tmp_path)})
    with running(job) as proc:
        st = wait_progress(job, min_step=14)
        rank1 = next(r for r in st["ranks"] if r["rank"] == 1)
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(rank1["pid"], signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == 75
    (tmp_path / "slow").unlink()
    _resume_and_finish(job)
    assert_same_state(load_final(reference_final), load_final(final))


def test_time_based_saves_are_coordinated_and_resumable(
    tmp_path: Path, reference_final: Path
) -> None:
    """checkpoint.every = "1s" (no step rule): the supervisor schedules saves at a common step; a
    crash after one resumes from it, bit-identically."""
    final = tmp_path / "final.pt"
    job = write_job(
        tmp_path,
        env={"FINAL": str(final), "STEP_SLEEP": "0.05"},
        checkpoint='every_steps = 0\nevery = "1s"',
    )
    with running(job) as proc:
        wait_for(
            lambda: len(named(events(tmp_path / "run"), "checkpoint_committed")) >= 2,
            timeout=90,
            what="two time-based checkpoints",
        )
        st = wait_progress(job, min_step=0)
        rank1 = next(r for r in st["ranks"] if r["rank"] == 1)
        os.kill(rank1["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    evs = events(tmp_path / "run")
    assert named(evs, "attempt_started")[1]["resume_step"] > 0
    assert_same_state(load_final(reference_final), load_final(final))
