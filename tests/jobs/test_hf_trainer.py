"""A real Hugging Face ``transformers.Trainer`` (tiny GPT-2 from a config, 2 CPU ranks, gloo)
with ``RvsupCallback`` under rvsup: the Trainer's own ``checkpoint-N`` folders, made durable
and marked by rvsup, are what a kill -9 and a stop resume from, and the final weights and
optimizer equal an uninterrupted run's, bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.fixtures import built_once
from tests.helpers.harness import named
from tests.helpers.integration_jobs import framework_job, run_to_end, stop_and_resume
from tests.helpers.states import assert_same_state, load_final

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None
        or importlib.util.find_spec("torch") is None,
        reason="needs transformers and torch (the integrations extra)",
    ),
]

WORKER = "hf_worker.py"
TOTAL = 30


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run's final state (one for the whole run: see built_once)."""

    def build(tmp: Path) -> Path:
        run_to_end(framework_job(tmp, WORKER, TOTAL))
        return tmp / "final.pt"

    return built_once(tmp_path_factory, "reference-hf", build)


def test_a_kill_resumes_from_the_trainers_newest_marked_checkpoint_bit_exactly(
    tmp_path: Path, reference: Path
) -> None:
    """Rank 1 SIGKILLs itself after optimizer step 17: the next attempt resumes at step 15 from
    out/checkpoint-15 (the Trainer's own, marked), and ends bit-identical. The resume check
    compared the model's parameters (the callback's fingerprint: it is given no loss) at the
    redone step 15 on both ranks and found them equal (steps of at least 0.25 s, heartbeats
    every 0.2 s: the first attempt sent its checksum before the kill)."""
    job = framework_job(tmp_path, WORKER, TOTAL, {"KILL_AT": "17", "STEP_SLEEP": "0.25"})
    _, evs = run_to_end(job)
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 15]
    [verified] = named(evs, "resume_verified")
    assert (verified["first_step"], verified["values"], verified["exact"]) == (15, 2, True)
    commits = named(evs, "checkpoint_committed")
    assert [(c["step"], c["external"]) for c in commits] == [
        (s - 1, f"out/checkpoint-{s}") for s in (5, 10, 15, 20, 25, 30)
    ]
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_a_resume_at_an_epoch_boundary_is_bit_exact(tmp_path: Path, reference: Path) -> None:
    """A checkpoint every 6 steps, rank 1 killed after step 14: the next attempt resumes from
    out/checkpoint-12, the end of the first epoch, where the Trainer makes the next epoch's
    iterator itself (accelerate's, which fetches a batch ahead), and ends bit-identical. rvsup
    leaves the Trainer's RNG states alone: put back over them, the run differed."""
    job = framework_job(tmp_path, WORKER, TOTAL, {"KILL_AT": "14"}, every=6)
    _, evs = run_to_end(job)
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 12]
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_sigterm_saves_the_trainers_checkpoint_at_a_common_step_and_nothing_is_redone(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM to the daemon: the callback makes the Trainer save at the step rvsup chose on
    both ranks, rvsup exits 75; `rvsup start` again resumes at the next step and ends
    bit-identical."""
    job = framework_job(tmp_path, WORKER, TOTAL, {"STEP_SLEEP": "0.15"})
    at = stop_and_resume(job, min_step=6)
    assert (tmp_path / "out" / f"checkpoint-{at + 1}").is_dir()
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))
