"""When the training goes wrong: a NaN or a spike is rolled back and its batch skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.harness import events, named, rvsup, write_job
from worker_sdk.contract.layout import committed_name

pytestmark = pytest.mark.process


def _rank_logs(run_dir: Path, attempt: int) -> str:
    logs = sorted((run_dir / "logs" / f"attempt-{attempt}").glob("**/stdout.log"))
    return "\n".join(p.read_text() for p in logs)


def test_poisoned_batch_is_rolled_back_and_skipped(tmp_path: Path) -> None:
    """A float loss that is NaN at step 25 only (rank 1's batch): caught at that step, the job
    goes back to the checkpoint of step 19, skips step 25 and finishes with a finite loss."""
    env = {"LOSS": "float", "FAULT": "nan:1:25", "STEP_SLEEP": "0.05"}
    job = write_job(tmp_path, env=env, total=40)
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    [anomaly] = named(evs, "anomaly_detected")
    assert (anomaly["kind"], anomaly["step"], anomaly["onset"], anomaly["rank"]) == (
        "nonfinite_loss",
        25,
        25,
        1,
    )
    assert anomaly["value"] is None
    [back] = named(evs, "rolled_back")
    assert (back["from_step"], back["to_step"], back["resume_step"]) == (25, 19, 26)
    assert back["skipped_steps"] == 6 and all(s >= 25 for s in back["discarded"])
    assert [f["kind"] for f in named(evs, "failure_detected")] == ["nonfinite_loss"]
    loaded = named(evs, "checkpoint_loaded")[-1]
    assert loaded["resume_step"] == 26 and Path(loaded["checkpoint"]).name == committed_name(19)
    logs = _rank_logs(tmp_path / "run", 2)
    assert "resumes at 26" in logs and "skipped 6" in logs and "final loss nan" not in logs
    assert named(evs, "job_succeeded")
    history = rvsup("history", str(job))
    assert "rolled back to step 19" in history.stdout and "nonfinite_loss" in history.stdout


def test_nan_whatever_the_data_gives_up_as_deterministic(tmp_path: Path) -> None:
    """Every loss from step 25 on is NaN: after one rollback it comes back right after the
    skipped step, so the job gives up (exit 3) saying it does not come from the data."""
    env = {"LOSS": "float", "NAN_FROM": "25", "STEP_SLEEP": "0.05"}
    job = write_job(tmp_path, env=env, total=40)
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 3, res.stderr
    evs = events(tmp_path / "run")
    assert [a["onset"] for a in named(evs, "anomaly_detected")] == [25, 26]
    assert len(named(evs, "rolled_back")) == 1
    assert "deterministic" in named(evs, "job_gave_up")[0]["reason"]


def test_spike_of_a_tensor_loss_is_caught_after_patience(tmp_path: Path) -> None:
    """A tensor loss scaled 1000x over steps 40-47: caught after 3 high heartbeats, rolled back
    past the window (skip_steps = 10), and the job finishes."""
    env = {"LOSS": "tensor", "SPIKE": "40:48:1000", "STEP_SLEEP": "0.05"}
    job = write_job(
        tmp_path,
        env=env,
        total=70,
        heartbeat='interval = "0.1s"\nstartup_timeout = "60s"',
        anomaly="window = 10\npatience = 3\nskip_steps = 10",
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    [anomaly] = named(evs, "anomaly_detected")
    assert anomaly["kind"] == "loss_spike" and anomaly["value"] > 10 * anomaly["baseline"]
    assert 38 <= anomaly["onset"] <= 41 and anomaly["step"] > anomaly["onset"]
    [back] = named(evs, "rolled_back")
    assert back["to_step"] < anomaly["onset"] and back["resume_step"] >= 48
    assert named(evs, "job_succeeded")


def test_a_flipped_bit_in_one_replica_is_named_and_rolled_back(tmp_path: Path) -> None:
    """3 DDP ranks compare their parameters every 10 steps: a bit flipped in rank 1's weights
    before step 25 is caught at step 29 (rank 1 named, the majority being ranks 0 and 2), the
    job goes back to the checkpoint of step 19 (the last check that agreed) and finishes."""
    env = {"FAULT": "bitflip:1:25", "STEP_SLEEP": "0.02"}
    job = write_job(tmp_path, env=env, total=40, nproc=3, anomaly="verify_every_steps = 10")
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    [anomaly] = named(evs, "anomaly_detected")
    assert (anomaly["kind"], anomaly["step"], anomaly["onset"], anomaly["rank"]) == (
        "replicas_diverged",
        29,
        20,
        1,
    )
    [failure] = named(evs, "failure_detected")
    assert failure["ranks"] == [1] and "rank(s) 1:" in failure["detail"]
    [back] = named(evs, "rolled_back")
    assert (back["to_step"], back["resume_step"]) == (19, 30)
    assert named(evs, "job_succeeded")


def test_spike_confirmed_after_later_commits_still_rolls_back_before_its_onset(
    tmp_path: Path,
) -> None:
    """keep_last = 1 and a checkpoint every 5 steps: a spike from step 40 needs 8 high
    heartbeats, and checkpoints after the onset are committed meanwhile; pruning keeps the one
    of step 39, so the rollback goes back to it (not to the start) and the job finishes.

    The protection follows the heartbeats: when the one of step 39 reaches the supervisor only
    after the ranks committed step 44 (a loaded machine: the window is about 0.3 s), the prune
    of step 44 still keeps the one before, of step 34, and the rollback goes back to that one.
    Either is right; going back to the start or giving up is not."""
    env = {"LOSS": "tensor", "SPIKE": "40:70:1000", "STEP_SLEEP": "0.05"}
    job = write_job(
        tmp_path,
        env=env,
        total=90,
        checkpoint="every_steps = 5\nkeep_last = 1",
        heartbeat='interval = "0.1s"\nstartup_timeout = "60s"',
        anomaly="window = 10\npatience = 8\nskip_steps = 35",
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    [anomaly] = named(evs, "anomaly_detected")
    assert anomaly["kind"] == "loss_spike" and 38 <= anomaly["onset"] <= 41
    committed = [e["step"] for e in named(evs, "checkpoint_committed")]
    assert any(anomaly["onset"] <= s < anomaly["step"] for s in committed), committed
    [back] = named(evs, "rolled_back")
    before_onset = sorted(s for s in committed if s < anomaly["onset"])
    assert back["to_step"] in before_onset[-2:], (back, committed)
    assert back["resume_step"] == max(anomaly["step"] + 1, anomaly["onset"] + 35)
    assert back["skipped_steps"] < 50  # not back to the start
    assert named(evs, "job_succeeded")
