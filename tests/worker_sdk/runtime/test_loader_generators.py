"""A DataLoader that shuffles with a generator of its own, resumed in one process (no rvsup, a
checkpoint directory): its order in the resumed epoch is the run's, whether the loop starts at
the checkpoint's epoch or at epoch 0, whether the script seeds the generator at every epoch or
never (Accelerate's default sampler on 2 ranks: tests/worker_sdk/integrations/
test_accelerate_loaders.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import worker_sdk
from tests.helpers.states import assert_same_state
from worker_sdk.checkpoint.loader_generators import LEDGER, Ledger, generator_of
from worker_sdk.contract import layout
from worker_sdk.contract.layout import rank_file
from worker_sdk.runtime.startup import first_step

EPOCHS = 4
BATCH = 8
SAMPLES = 48  # 6 steps an epoch
SKIPPED = r"ignore:rvsup. \d+ batches were fetched:RuntimeWarning"  # a loop from epoch 0


def _loader() -> DataLoader[Any]:
    """A shuffling loader with a generator of its own (seeded by the script's global seed)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, 4), torch.randn(SAMPLES, 1))
    return DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator())


def script(
    ckpt: Path, *, from_zero: bool, reseed: bool, kill_before: int | None = None
) -> dict[str, Any] | None:
    """An epoch loop with the two calls; ``from_zero``: the loop starts at epoch 0 and skips
    the batches before ``start`` (else at the checkpoint's epoch, skipping the rest);
    ``reseed``: ``g.manual_seed(100 + epoch)`` at every epoch. A checkpoint every 4 steps.
    Returns the final state, or None when killed before ``kill_before``."""
    worker_sdk._reset_for_tests()
    loader = _loader()
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, _ = worker_sdk.resume(model, opt, checkpoint_dir=ckpt, every_steps=4)
    per_epoch = len(loader)
    g = generator_of(loader)
    assert g is not None
    for epoch in range(0 if from_zero else start // per_epoch, EPOCHS):
        if reseed:
            g.manual_seed(100 + epoch)
        for i, (x, y) in enumerate(loader):
            step = epoch * per_epoch + i
            if step < start:
                continue
            if step == kill_before:
                worker_sdk._reset_for_tests()
                return None
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            worker_sdk.step(step)
    worker_sdk._reset_for_tests()
    return {"model": model.state_dict(), "opt": opt.state_dict()}


@pytest.mark.filterwarnings(SKIPPED)
@pytest.mark.parametrize("from_zero", [False, True], ids=["from-checkpoint", "from-0"])
@pytest.mark.parametrize(
    "kill_before",
    [9, 12, 13, 7],
    ids=["mid-epoch-1", "epoch-1-over", "after-epoch-1", "mid-epoch-0"],
)
def test_a_loaders_own_generator_resumes_the_epochs_order(
    tmp_path: Path, from_zero: bool, kill_before: int
) -> None:
    """A generator seeded once (never again by the script): killed mid-epoch, after a
    checkpoint that ends an epoch, or just after one, with the loop starting at the
    checkpoint's epoch or at epoch 0, the resumed run ends with the uninterrupted run's weights
    (dropout draws from the global RNG too)."""
    reference = script(tmp_path / "ref", from_zero=from_zero, reseed=False)
    killed = script(tmp_path / "ckpt", from_zero=from_zero, reseed=False, kill_before=kill_before)
    assert killed is None and reference is not None
    resumed = script(tmp_path / "ckpt", from_zero=from_zero, reseed=False)
    assert resumed is not None
    assert_same_state(reference, resumed)


@pytest.mark.filterwarnings(SKIPPED)
@pytest.mark.parametrize("from_zero", [False, True], ids=["from-checkpoint", "from-0"])
@pytest.mark.parametrize("kill_before", [9, 13, 7], ids=["mid-epoch-1", "after-epoch-1", "mid-0"])
def test_a_generator_the_script_seeds_every_epoch_is_left_to_it(
    tmp_path: Path, from_zero: bool, kill_before: int
) -> None:
    """``g.manual_seed(100 + epoch)`` at every epoch (the advice for loaders without one):
    rvsup does not set it over the script's seed; the resumed run ends as the uninterrupted."""
    reference = script(tmp_path / "ref", from_zero=from_zero, reseed=True)
    script(tmp_path / "ckpt", from_zero=from_zero, reseed=True, kill_before=kill_before)
    resumed = script(tmp_path / "ckpt", from_zero=from_zero, reseed=True)
    assert reference is not None and resumed is not None
    assert_same_state(reference, resumed)


def test_without_the_saved_states_the_resumed_epoch_replays_epoch_0s_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect this fixes, shown: the same kill mid-epoch 1, the loop from the checkpoint's
    epoch, the checkpoint's loader entries not loaded (as from a checkpoint of before this
    change): the resumed run ends elsewhere. The entries are in the rank file: one loader, its
    lineage from epoch 0 to the epoch under way, that epoch not over."""
    reference = script(tmp_path / "ref", from_zero=False, reseed=False)
    script(tmp_path / "ckpt", from_zero=False, reseed=False, kill_before=9)
    info = layout.latest(tmp_path / "ckpt")
    assert info is not None and info.step == 7
    part = torch.load(info.path / rank_file(0), weights_only=True)
    (entry,) = part["loaders"]
    assert entry["epoch"] == 1 and len(entry["lineage"]) == 2 and entry["over"] == 0
    monkeypatch.setattr(LEDGER, "load", lambda entries: None)
    resumed = script(tmp_path / "ckpt", from_zero=False, reseed=False)
    assert reference is not None and resumed is not None
    with pytest.raises(AssertionError):
        assert_same_state(reference, resumed)


def test_the_ledger_is_empty_for_loaders_without_their_own_generator() -> None:
    """DataLoader(shuffle=True) without a generator (the global RNG's, handled by the loader
    window) and an unshuffled one: nothing is tracked, nothing added to a checkpoint."""
    data = TensorDataset(torch.arange(8.0))
    for loader in (DataLoader(data, shuffle=True), DataLoader(data)):
        assert generator_of(loader) is None
    LEDGER.reset()
    LEDGER.before_iter(DataLoader(data, shuffle=True))
    assert LEDGER.capture() == []


def test_a_rollback_past_the_checkpoint_says_where_the_order_may_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under rvsup, a resume after a rollback goes on past the steps it skips
    (``RVSUP_RESUME_AT``): the ledger is told how many, and a loader with a generator of its
    own whose iterator starts in the window gets a note naming the limit (its epoch under way
    keeps its order; one the skipped steps reach into does not) and the fix; without a
    rollback, none."""
    loaded = SimpleNamespace(step=7)
    monkeypatch.setenv("RVSUP_RESUME_AT", "20")
    assert first_step(loaded, supervised=True) == 20  # type: ignore[arg-type]
    assert LEDGER.skipped == 12

    def notes(skipped: int) -> list[str]:
        loader = _loader()
        g = generator_of(loader)
        assert g is not None
        state = g.get_state()
        ledger = Ledger()
        ledger.load([{"lineage": [state], "epoch": 0, "start": state, "now": state, "over": 0}])
        ledger.rolled_back(skipped)
        ledger.open_window()
        ledger.before_iter(loader)
        return ledger.close_window()

    (note,) = notes(12)
    assert note.startswith("rvsup: a rollback skipped 12 steps after the checkpoint")
    assert "use_seedable_sampler=True" in note
    assert notes(0) == []
    LEDGER.reset()
