"""examples/grad_accumulation under rvsup (real torchrun, 2 ranks on CPU/gloo): killed between
two optimizer steps, with ``step()`` after every micro-batch, the job resumes from a checkpoint
that holds the gradients summed so far and ends bit for bit as an uninterrupted run; a script
that never zeroes its gradients does too. rvsup's own resume check verifies both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, events, named, rvsup
from tests.helpers.states import assert_same_state, load_final

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "grad_accumulation"


def run_example(tmp: Path, *args: str, kill_at: int | None) -> list[dict[str, object]]:
    """The example's job.toml with its folders under ``tmp``, ``args`` added, rank 1's kill at
    ``kill_at`` (None: uninterrupted, at full speed); its history. Killed, steps of 0.1 s and
    heartbeats every 0.2 s: the first attempt sent the fingerprints of the steps it ran after
    the checkpoint before the kill, whatever the machine's load."""
    command = ["python", str(EXAMPLE / "train.py"), "--micro-batches", "48", "--save-final"]
    command += ["final", *args]
    if kill_at is not None:
        command += ["--kill-at", str(kill_at), "--step-sleep", "0.1"]
    text = (EXAMPLE / "job.toml").read_text()
    text = re.sub(r"(?m)^command = .*$", f"command = {json.dumps(command)}", text)
    # storage checkpoints alone: the resume is from step 29's, 2 micro-batches into an
    # accumulation (a memory snapshot, saved the same way, would make it a later one)
    text = text.replace("[checkpoint]\n", '[checkpoint]\nmemory_every_steps = "off"\n')
    text = text.replace('interval = "1s"', 'interval = "0.2s"')
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "job.toml").write_text(text)
    started = rvsup("start", str(tmp / "job.toml"), timeout=240)
    assert started.returncode == 0, started.stdout + started.stderr
    return events(tmp / "runs" / "grad-accumulation")


def assert_same_finals(reference: Path, resumed: Path) -> None:
    """Every rank's final model, optimizer and gradients are identical."""
    for rank in (0, 1):
        ref = load_final(reference / f"rank-{rank}.pt")
        got = load_final(resumed / f"rank-{rank}.pt")
        assert_same_state(ref, got, f"rank {rank}")


@pytest.mark.parametrize(
    "args",
    [("--accumulate", "4"), ("--accumulate", "1", "--never-zero")],
    ids=["accumulate", "never-zero"],
)
def test_a_kill_between_optimizer_steps_resumes_bit_exactly(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Accumulating 4 micro-batches with ``step()`` after each (checkpoints every 10 steps,
    so the step-29 checkpoint falls 2 micro-batches into an accumulation), or never zeroing
    the gradients: rank 1 killed at step 37, resumed at 30, ends with an uninterrupted run's
    weights, optimizer and gradients on both ranks; the resume check compared the redone
    steps bit for bit and found them equal."""
    evs = run_example(tmp_path / "ref", *args, kill_at=None)
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [47]
    evs = run_example(tmp_path / "killed", *args, kill_at=37)
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 30]
    assert named(evs, "resume_diverged") == []
    [verified] = named(evs, "resume_verified")
    assert verified["exact"] and verified["complete"] and verified["first_step"] == 30
    assert_same_finals(tmp_path / "ref" / "final", tmp_path / "killed" / "final")
