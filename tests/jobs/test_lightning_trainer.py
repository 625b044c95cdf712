"""A real Lightning ``Trainer`` (a tiny LightningModule, 2 CPU ranks, DDP over gloo) with
``RvsupCallback`` under rvsup: Lightning's own checkpoints, made durable and marked by rvsup,
are what a kill -9 and a stop resume from. The loader shuffles, with 2 worker processes that
add noise to every sample: from a checkpoint at an epoch's end or in the middle of one
(where Lightning alone would start the epoch's data again, docs/integrations.md), with a
validation loop or without, the final state equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.fixtures import built_once
from tests.helpers.harness import events, named
from tests.helpers.integration_jobs import framework_job, run_to_end, stop_and_resume
from tests.helpers.states import assert_same_state, load_final

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None,
        reason="needs lightning (the integrations extra)",
    ),
]

WORKER = "lightning_worker.py"
TOTAL = 30  # 12 steps an epoch (96 samples, 4 a batch, 2 ranks)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run's final state (one for the whole run: see built_once)."""

    def build(tmp: Path) -> Path:
        run_to_end(framework_job(tmp, WORKER, TOTAL))
        return tmp / "final.pt"

    return built_once(tmp_path_factory, "reference-lightning", build)


def test_a_kill_resumes_from_lightnings_checkpoint_at_an_epoch_end_bit_exactly(
    tmp_path: Path, reference: Path
) -> None:
    """A checkpoint every 12 steps (an epoch): rank 1 SIGKILLs itself after step 17, the next
    attempt loads out/rvsup/step-0000000011.ckpt (Lightning's own, marked), resumes at 12 and
    ends bit-identical."""
    _, evs = run_to_end(framework_job(tmp_path, WORKER, TOTAL, {"KILL_AT": "17"}, every=12))
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 12]
    commits = named(evs, "checkpoint_committed")
    assert [(c["step"], c["mode"]) for c in commits] == [(11, "external"), (23, "external")]
    assert commits[0]["external"] == "out/rvsup/step-0000000011.ckpt"
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_validation_leaves_the_training_and_its_resume_exact(
    tmp_path: Path, reference: Path
) -> None:
    """A validation loop at every half epoch (``val_check_interval`` 0.5, ``limit_val_batches``
    3) and the sanity check before the first step: the callback gives the training back the RNG
    states each validation began with (its loader's ``iter()`` draws from the global RNG, and
    the resumed run skips the sanity check and the validation its checkpoint was saved
    before). Killed after step 17 and resumed from the epoch's end (step 11, saved before that
    epoch's last validation), the final state equals the run without validation, bit for
    bit."""
    job = framework_job(tmp_path, WORKER, TOTAL, {"KILL_AT": "17", "VALIDATE": "0.5"}, every=12)
    _, evs = run_to_end(job)
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 12]
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_a_kill_resumes_mid_epoch_with_validation_bit_exactly(
    tmp_path: Path, reference: Path
) -> None:
    """A checkpoint every 7 steps and a validation every half epoch: rank 1 SIGKILLs itself
    after step 17, the next attempt resumes at 14, the third batch of the second epoch (where
    Lightning alone would start that epoch's batches again, from iterators made before the
    sampler knew the epoch, seeded from the checkpoint's RNG states), and ends bit-identical
    to the run without validation, every batch in its place."""
    env = {"KILL_AT": "17", "VALIDATE": "0.5"}
    _, evs = run_to_end(framework_job(tmp_path, WORKER, TOTAL, env, every=7))
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 14]
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_a_kill_mid_accumulation_resumes_bit_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``accumulate_grad_batches = 2``, 15 optimizer steps (30 batches), a checkpoint every 4:
    rank 1 SIGKILLs itself after the batch that follows optimizer step 9 (its gradients
    accumulated, not stepped); the next attempt resumes at 8 (the checkpoint of step 7 is
    batch 16, mid-epoch 1: the callback saves at optimizer steps only) and ends bit-identical
    to an uninterrupted run with the same accumulation."""

    def build(tmp: Path) -> Path:
        run_to_end(framework_job(tmp, WORKER, 15, {"ACCUMULATE": "2"}))
        return tmp / "final.pt"

    accumulated = built_once(tmp_path_factory, "reference-lightning-accumulated", build)
    env = {"ACCUMULATE": "2", "KILL_AT": "9"}
    _, evs = run_to_end(framework_job(tmp_path, WORKER, 15, env, every=4))
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 8]
    assert_same_state(load_final(accumulated), load_final(tmp_path / "final.pt"))


def test_sigterm_saves_lightnings_checkpoint_at_a_common_step_and_nothing_is_redone(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM to the daemon mid-epoch: both ranks save Lightning's checkpoint at the step rvsup
    chose, exit 75; `rvsup start` again resumes at the next step (in the middle of its epoch,
    unless the stop's step, 6 or later, came as late as the epoch's last), runs to the end,
    and ends bit-identical to the uninterrupted run."""
    job = framework_job(tmp_path, WORKER, TOTAL, {"STEP_SLEEP": "0.15"})
    at = stop_and_resume(job, min_step=6)
    stop = [c for c in named(events(tmp_path / "run"), "checkpoint_committed") if c["step"] == at]
    assert [c["external"] for c in stop] == [f"out/rvsup/step-{at:010d}.ckpt"]
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))
