"""The resume check under real torchrun (2 ranks, gloo, CPU): an exact resume is verified, one
made inexact on purpose (the script reshuffles with the global RNG after resume()) diverges at
the step it resumed at and is named, and under ``resume_check = "fail"`` the job stops there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.harness import events, named, rvsup, write_job

pytestmark = pytest.mark.process

# storage checkpoints every 10 steps, no snapshots: rank 1 killed at step 38 makes the next
# attempt redo steps 30-37. Steps of 0.1 s, heartbeats every 0.2 s: the first attempt sent its
# fingerprints of steps 30-35 (the losses, the parameters' checksum at the grid step 31) at
# its heartbeats before the kill, whatever the machine's load (a step is never shorter)
_CHECKPOINT = 'every_steps = 10\nmemory_every_steps = "off"'
_ENV = {"FAULT": "kill:1:38:1", "STEP_SLEEP": "0.1"}


@pytest.mark.parametrize("loss", ["float", ""], ids=["loss-and-parameters", "parameters-only"])
def test_an_exact_resume_is_verified(tmp_path: Path, loss: str) -> None:
    """Rank 1 killed at step 38, resumed at 30: one resume_verified comparing steps from 30 on
    both ranks bit for bit (the losses step() is given and the parameters' checksum at the grid
    step 31, or that checksum alone), no resume_diverged; the history's summary counts it."""
    job = write_job(tmp_path, env={**_ENV, "LOSS": loss}, checkpoint=_CHECKPOINT)
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert named(evs, "resume_diverged") == []
    [verified] = named(evs, "resume_verified")
    assert (verified["attempt"], verified["resume_step"], verified["ranks"]) == (2, 30, 2)
    assert verified["exact"] and verified["complete"]
    assert verified["first_step"] == (30 if loss else 31)
    if loss:  # at least the losses of 30-35 and the checksum, on each rank
        assert verified["values"] >= 2 * (6 + 1) and verified["last_step"] >= 35
    else:
        assert verified["values"] == 2 and verified["last_step"] == 31
    history = rvsup("history", str(job))
    assert "resumes: 1 verified" in history.stdout, history.stdout


@pytest.mark.parametrize("policy", ["warn", "fail"])
def test_a_resume_made_inexact_is_named_at_its_step(tmp_path: Path, policy: str) -> None:
    """The script reshuffles with the global RNG after resume(): after the kill at step 38
    the resumed attempt's first batch differs. resume_diverged names step 30 (the resume step),
    both losses, what is likely at fault and the fix; "warn" lets the job finish, "fail" stops
    it with exit 3 and a resume_diverged failure."""
    job = write_job(
        tmp_path,
        env={**_ENV, "LOSS": "float", "RESHUFFLE": "1"},
        checkpoint=f'{_CHECKPOINT}\nresume_check = "{policy}"',
    )
    res = rvsup("start", str(job), timeout=120)
    evs = events(tmp_path / "run")
    [diverged] = named(evs, "resume_diverged")
    assert (diverged["attempt"], diverged["resume_step"], diverged["step"]) == (2, 30, 30)
    assert diverged["what"] == "loss" and diverged["before"] != diverged["after"]
    assert diverged["likely"].startswith("the state loaded or the first batch")
    assert "resume()" in diverged["hint"] and diverged["policy"] == policy
    assert named(evs, "resume_verified") == []
    if policy == "warn":
        assert res.returncode == 0, res.stderr
        assert "resumes: 1 diverged" in rvsup("history", str(job)).stdout
    else:
        assert res.returncode == 3, res.stderr
        assert [f["kind"] for f in named(evs, "failure_detected")][-1] == "resume_diverged"
        assert "resume_check" in named(evs, "job_gave_up")[0]["reason"]
