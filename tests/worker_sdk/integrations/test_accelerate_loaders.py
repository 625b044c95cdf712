"""Accelerate's prepared data loaders: one given to ``resume()`` is refused there, with the fix;
the fix, a seedable sampler with ``set_epoch``, gives a resumed epoch the order of the run it
replaces (in one process); the default sampler on 2 ranks resumes bit-exactly with the two
calls alone (torchrun)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import worker_sdk
from tests.helpers.harness import REPO, reaped
from tests.helpers.states import assert_same_state
from worker_sdk.checkpoint.parallel import plan

accelerate = pytest.importorskip("accelerate")


@pytest.fixture
def accelerator() -> Iterator[object]:
    """A fresh Accelerator on the CPU (its state is a process-wide singleton: reset after)."""
    yield accelerate.Accelerator
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


def _prepared(make: object, *, seedable: bool) -> Any:
    """The loader as ``prepare()`` gives it (a ``DataLoaderShard``, typed as scripts hold it)."""
    torch.manual_seed(0)  # the script seeds before it builds (initial_seed() seeds the sampler)
    config = accelerate.DataLoaderConfiguration(use_seedable_sampler=seedable)
    acc = make(cpu=True, dataloader_config=config)  # type: ignore[operator]
    loader = DataLoader(TensorDataset(torch.arange(24.0)), batch_size=4, shuffle=True)
    return acc.prepare(loader)


def test_a_prepared_loader_given_to_resume_is_refused_with_the_fix(
    accelerator: object, tmp_path: Path
) -> None:
    """``resume(model, optimizer, loader)`` with a loader Accelerate prepared (not stateful):
    refused before anything is restored or saved (its state_dict() fails at every save),
    naming the object and how to skip the batches done; the same check in the plan."""
    loader = _prepared(accelerator, seedable=False)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AttributeError):
        loader.state_dict()
    with pytest.raises(TypeError, match=r"object 2 .* prepared by Accelerate") as refused:
        plan([model, opt, loader])
    assert "Do not pass it to resume()" in str(refused.value)
    assert "skip_first_batches(loader, n)" in str(refused.value)
    with pytest.raises(TypeError, match="prepared by Accelerate"):
        worker_sdk.resume(model, opt, loader, checkpoint_dir=tmp_path)


def test_a_seedable_sampler_with_set_epoch_resumes_an_epoch_in_its_order(
    accelerator: object,
) -> None:
    """The seedable sampler (docs/integrations.md): epochs 0-2 of one run, then a new process's
    worth (a fresh Accelerator and loader) that resumes at epoch 2 with ``set_epoch(2)``: the
    same batches, in the same order, as the first run's epoch 2."""

    def epochs(loader: Any, which: range) -> list[list[float]]:
        out = []
        for epoch in which:
            loader.set_epoch(epoch)
            out.append([v for (batch,) in loader for v in batch.tolist()])
        return out

    first = epochs(_prepared(accelerator, seedable=True), range(3))
    assert first[0] != first[2]  # shuffled anew every epoch
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    assert epochs(_prepared(accelerator, seedable=True), range(2, 3)) == first[2:]


WORKER = Path(__file__).parents[2] / "helpers" / "accelerate_worker.py"


def _torchrun(
    tmp: Path,
    name: str,
    ckpt: Path,
    kill_at: str,
    *,
    fails: bool,
    split_uneven: bool = False,
    accumulate: int = 1,
) -> Path:
    """tests/helpers/accelerate_worker.py on 2 ranks (torchrun, no rvsup); its final state."""
    out = tmp / f"{name}.pt"
    env = {
        "SPLIT_UNEVEN": "1" if split_uneven else "0",
        "ACCUMULATE": str(accumulate),
        **{k: v for k, v in os.environ.items() if not k.startswith("RVSUP_")},
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "CKPT": str(ckpt),
        "OUT": str(out),
        "KILL_AT": kill_at,
        "EPOCHS": "4",
        "EVERY": "4",
    }
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    argv += ["--max-restarts=0", "--monitor-interval=0.1", str(WORKER)]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with reaped(proc):
        output, _ = proc.communicate(timeout=150)
    assert (proc.returncode != 0) == fails, output[-4000:]
    return out


def killed_twice_ends_as_uninterrupted(
    tmp: Path, kills: str, *, split_uneven: bool = False, accumulate: int = 1
) -> None:
    """The worker (with those switches) run uninterrupted, then killed at each batch of
    ``kills`` in one start after another, then started again to its end: the same weights."""
    ran = functools.partial(_torchrun, split_uneven=split_uneven, accumulate=accumulate)
    reference = ran(tmp, "ref", tmp / "ref-ckpt", "", fails=False)
    ckpt = tmp / "ckpt"
    for n in range(len(kills.split(","))):
        ran(tmp, f"killed-{n}", ckpt, kills, fails=True)
    resumed = ran(tmp, "resumed", ckpt, kills, fails=False)
    assert_same_state(
        torch.load(reference, weights_only=True), torch.load(resumed, weights_only=True)
    )


@pytest.mark.process
@pytest.mark.timeout(300)
@pytest.mark.parametrize("split_uneven", [False, True], ids=["default", "split-uneven"])
def test_the_default_sampler_resumes_mid_epoch_and_at_an_epochs_end_bit_exactly(
    tmp_path: Path, split_uneven: bool
) -> None:
    """Accelerate's default sampler on 2 ranks (a generator of its own, seeded once, handed
    from rank 0 to every rank at each epoch), the loop starting at the checkpoint's epoch with
    skip_first_batches, as Accelerate's examples write it: rank 1 killed at step 9 (the
    checkpoint of step 7 is mid-epoch 1), then at step 19 of the next start (the checkpoint of
    step 17 ends epoch 2); the third start ends with the uninterrupted run's weights. (Without
    the loaders' generators in the checkpoint, the resumed epoch replayed epoch 0's order.)
    The same with ``split_batches`` and ``even_batches=False`` (global batches split between
    the ranks, each epoch's last one short on rank 1)."""
    killed_twice_ends_as_uninterrupted(tmp_path, "9,19", split_uneven=split_uneven)


@pytest.mark.process
@pytest.mark.timeout(300)
def test_accumulate_resumes_from_the_optimizer_step_killed_mid_accumulation(
    tmp_path: Path,
) -> None:
    """``gradient_accumulation_steps=2`` with ``accelerator.accumulate(model)`` and ``step()``
    at each optimizer step (docs/integrations.md): rank 1 killed before batch 11, with batch
    10's gradients accumulated and not stepped (the checkpoint of optimizer step 3 ends batch
    7), then before batch 21 of the next start (the checkpoint of step 7 ends batch 15,
    mid-epoch 2); the third start ends with the uninterrupted run's weights."""
    killed_twice_ends_as_uninterrupted(tmp_path, "11,21", accumulate=2)
