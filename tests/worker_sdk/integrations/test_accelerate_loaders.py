"""Accelerate's prepared data loaders (accelerate, in one process): one given to ``resume()`` is
refused there, with the fix; the fix, a seedable sampler with ``set_epoch``, gives a resumed
epoch the order of the run it replaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import worker_sdk
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
    naming the object and the seedable sampler with set_epoch; the same check in the plan."""
    loader = _prepared(accelerator, seedable=False)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AttributeError):
        loader.state_dict()
    with pytest.raises(TypeError, match=r"object 2 .* prepared by Accelerate") as refused:
        plan([model, opt, loader])
    assert "use_seedable_sampler=True" in str(refused.value)
    assert "set_epoch(epoch)" in str(refused.value)
    with pytest.raises(TypeError, match="prepared by Accelerate"):
        worker_sdk.resume(model, opt, loader, checkpoint_dir=tmp_path)


def test_a_seedable_sampler_with_set_epoch_resumes_an_epoch_in_its_order(
    accelerator: object,
) -> None:
    """The fix the refusal gives: epochs 0-2 of one run, then a new process's worth (a fresh
    Accelerator and loader) that resumes at epoch 2 with ``set_epoch(2)``: the same batches,
    in the same order, as the first run's epoch 2."""

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
