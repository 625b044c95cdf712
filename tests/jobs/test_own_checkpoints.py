"""Bring your own checkpoint under rvsup (real torchrun, 2 ranks on CPU/gloo): the example
examples/own_checkpoints saves its own checkpoints with torch.save; rvsup only marks them
durable (worker_sdk.checkpointed), restarts from them after kill -9 and stops at a common step
on SIGTERM, with the final weights of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.fixtures import built_once
from tests.helpers.harness import REPO, events, named, running, rvsup, wait_progress
from tests.helpers.jobs import write_job_file
from tests.helpers.states import assert_same_state, load_final

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "own_checkpoints" / "train.py"
STEPS = 40


def own_job(tmp: Path, *args: str) -> Path:
    """The example's job under ``tmp``: 40 steps, a checkpoint asked every 10."""
    command = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--save-final", "final.pt"]
    return write_job_file(
        tmp,
        command=[*command, "--own-dir", "own", *args],
        name="own",
        env={"OMP_NUM_THREADS": "1"},
        tables={
            "launch": 'nproc_per_node = 2\nterm_timeout = "3s"\nstop_timeout = "30s"',
            "checkpoint": "every_steps = 10",
            "heartbeat": 'interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "60s"',
            "restart": 'max_restarts = 2\nbackoff = "0.1s"\nbackoff_max = "1s"',
        },
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run's final state (one for the whole run: see built_once)."""

    def build(tmp: Path) -> Path:
        res = rvsup("start", str(own_job(tmp)), timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        return tmp / "final.pt"

    return built_once(tmp_path_factory, "reference-own-checkpoints", build)


def test_a_kill_resumes_from_the_scripts_own_checkpoint_bit_exactly(
    tmp_path: Path, reference: Path
) -> None:
    """Rank 1 SIGKILLs itself at step 25: the history has the markers of steps 9 and 19 (mode
    "external", naming the script's files), the next attempt resumes at 20 from the script's
    own step-19 file, and the final weights and optimizer equal the uninterrupted run's."""
    res = rvsup("start", str(own_job(tmp_path, "--kill-at-step", "25")), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "run")
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 20]
    commits = named(evs, "checkpoint_committed")
    assert [c["step"] for c in commits] == [9, 19, 29, 39]
    assert {c["mode"] for c in commits} == {"external"}
    assert [c["external"] for c in commits] == [f"own/own-{s:06d}.pt" for s in (9, 19, 29, 39)]
    assert "resumed from own/own-000019.pt at step 20" in res.stdout + res.stderr
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_sigterm_stops_at_a_common_step_the_script_checkpoints_and_nothing_is_redone(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM to the daemon mid-run: step() asks both ranks for a checkpoint at one step, the
    script saves its own, checkpointed() leaves, rvsup exits 75; `rvsup start` again resumes
    at the next step (0 steps lost) and ends equal to the uninterrupted run."""
    job = own_job(tmp_path, "--step-sleep", "0.2")  # 5.6 s of steps left after step 12
    with running(job) as proc:
        wait_progress(job, min_step=12)
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 75
    evs = events(tmp_path / "run")
    stopped = named(evs, "job_stopped")
    assert len(stopped) == 1 and stopped[0]["reason"] == "preempted"
    at = stopped[0]["step"]
    assert at is not None and 12 <= at < STEPS - 1
    last = named(evs, "checkpoint_committed")[-1]
    assert (last["step"], last["mode"], last["external"]) == (
        at,
        "external",
        f"own/own-{at:06d}.pt",
    )
    own_job(tmp_path)  # the same job, its steps at full speed
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "run")
    assert named(evs, "attempt_started")[-1]["resume_step"] == at + 1
    assert not named(evs, "failure_detected")
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))
