"""examples/epoch_ddp under rvsup (real torchrun, 2 ranks on CPU/gloo): an epoch loop with
DistributedSampler, bf16 autocast and a GradScaler, killed mid-epoch or after a checkpoint that
ends an epoch, ends with the weights of an uninterrupted run; each rank's own state comes back."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, events, named, rvsup
from tests.helpers.states import assert_same_state, load_final

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "epoch_ddp"
WARNING = re.compile(r"^[WE]\d{4} \d\d:\d\d:\d\d|Warning\b", re.MULTILINE)


def run_example(
    tmp: Path,
    *args: str,
    every_steps: int = 10,
    kill_at: int | None = 37,
    async_save: bool = False,
) -> tuple[str, list[dict[str, object]]]:
    """The example's job.toml with its folders under ``tmp``, ``args`` added to the command and
    rank 1's kill at ``kill_at`` (None: uninterrupted); the output and the history."""
    text = (EXAMPLE / "job.toml").read_text()
    command = ["python", str(EXAMPLE / "train.py"), "--epochs", "4", "--save-final", "final"]
    if kill_at is not None:
        command += ["--kill-at-step", str(kill_at)]
    text = re.sub(r"(?m)^command = .*$", f"command = {json.dumps([*command, *args])}", text)
    text = re.sub(r"(?m)^every_steps = \d+$", f"every_steps = {every_steps}", text)
    # a loaded machine can take seconds to write a checkpoint: no hang is mistaken for one
    text = text.replace('hang_timeout = "auto"', 'hang_timeout = "60s"')
    if async_save:
        text = text.replace("[checkpoint]\n", "[checkpoint]\nasync = true\n")
    tmp.mkdir(parents=True, exist_ok=True)
    job = tmp / "job.toml"
    job.write_text(text)
    started = rvsup("start", str(job), timeout=240)
    output = started.stdout + started.stderr
    assert started.returncode == 0, output
    return output, events(tmp / "runs" / "epoch-ddp")


def assert_same_finals(reference: Path, resumed: Path) -> None:
    """Every rank's final model, optimizer, GradScaler and per-rank RunningLoss are identical."""
    for rank in (0, 1):
        ref, got = (
            load_final(reference / f"rank-{rank}.pt"),
            load_final(resumed / f"rank-{rank}.pt"),
        )
        assert_same_state(ref, got, f"rank {rank}")
    ranks = [load_final(reference / f"rank-{r}.pt")["running"]["total"] for r in (0, 1)]
    assert ranks[0] != ranks[1]  # the RunningLoss is per-rank state indeed


def test_the_epoch_example_survives_a_kill_mid_epoch_and_at_an_epoch_end_bit_exactly(
    tmp_path: Path,
) -> None:
    """The example as shipped: rank 1 SIGKILLs itself at step 37 (epoch 2, 16 steps an epoch),
    rvsup resumes from the step-29 checkpoint (mid-epoch 1), and the final weights, optimizer,
    GradScaler and each rank's RunningLoss equal an uninterrupted run's, with no warning. A loop
    over every epoch from 0 (skipping the steps before the checkpoint's), with an asynchronous
    checkpoint every 16 steps, killed at the epoch boundary (step 32, the first of epoch 2),
    resumes at epoch 2's start from step 31's checkpoint and ends equal too; each rank warns
    that it read the 2 epochs done only to skip them."""
    _, evs = run_example(tmp_path / "ref", kill_at=None)
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [63]
    output, evs = run_example(tmp_path / "mid")
    assert not WARNING.search(output), WARNING.findall(output)
    assert "[default1]:rank 1: killing itself at step 37" in output, output
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 30]
    assert_same_finals(tmp_path / "ref" / "final", tmp_path / "mid" / "final")
    # model, optimizer and GradScaler are the same on both ranks, the RunningLoss is not
    manifest = tmp_path / "mid" / "checkpoints" / "epoch-ddp" / "step-0000000059" / "MANIFEST.json"
    objects = json.loads(manifest.read_text())["objects"]
    assert [o["state"] for o in objects] == ["shared", "shared", "shared", "rank"], objects
    output, evs = run_example(
        tmp_path / "end", "--from-epoch-0", every_steps=16, kill_at=32, async_save=True
    )
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 32]
    assert {c["mode"] for c in named(evs, "checkpoint_committed")} == {"async"}
    # the one warning: the loop read epochs 0 and 1 again only to skip them
    assert len(WARNING.findall(output)) == 2, WARNING.findall(output)  # one a rank
    assert output.count("rvsup: 33 batches were fetched between resume() and the first") == 2
    assert_same_finals(tmp_path / "ref" / "final", tmp_path / "end" / "final")


@pytest.mark.skipif(importlib.util.find_spec("torchdata") is None, reason="needs torchdata")
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_bit_exactly(tmp_path: Path) -> None:
    """The example with torchdata's StatefulDataLoader and 2 worker processes per rank, given to
    resume(): killed at step 37, resumed from step 29's checkpoint where each rank's loader left
    its shard, it ends bit-identical to an uninterrupted run on both ranks."""
    args = ("--loader", "stateful", "--workers", "2")
    run_example(tmp_path / "ref", *args, kill_at=None)
    _, evs = run_example(tmp_path / "mid", *args)
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 30]
    assert_same_finals(tmp_path / "ref" / "final", tmp_path / "mid" / "final")
