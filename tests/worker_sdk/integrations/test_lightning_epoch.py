"""The Lightning callback's resume in the middle of an epoch, on real DataLoaders and a
stand-in for Lightning's fetcher: which generator state made an epoch's iterators, and the first
batch after a resume (tests/jobs/test_lightning_trainer.py runs it under rvsup)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from worker_sdk.integrations._lightning_epoch import (
    UNKNOWN_START_WARNING,
    EpochStart,
    ResumedEpoch,
)

DATA = TensorDataset(torch.arange(24.0))


class Combined:
    """What the callback uses of Lightning's CombinedLoader: its loaders, ``iter()`` (which
    makes their iterators) and ``next()``."""

    def __init__(self, *loaders: Any) -> None:
        self.flattened = list(loaders)
        self._iterator = SimpleNamespace(iterators=[])

    def __iter__(self) -> Combined:
        self._iterator.iterators = [iter(loader) for loader in self.flattened]
        return self

    def __next__(self) -> list[Any]:
        return [next(it) for it in self._iterator.iterators]


def _trainer(combined: Combined, fetched: int = 0) -> Any:
    fetcher = SimpleNamespace(combined_loader=combined, iterator=iter(combined), fetched=fetched)
    return SimpleNamespace(
        fit_loop=SimpleNamespace(_combined_loader=combined, _data_fetcher=fetcher)
    )


def _values(batch: list[Any]) -> list[float]:
    return batch[0][0].tolist()  # type: ignore[no-any-return]


def test_the_state_that_made_the_iterators_is_the_candidate_their_seed_was_drawn_from() -> None:
    """Of the candidates noted, the one an iterator's seed replays from is kept, even when it
    is not the newest; where none does (a draw came between), the state is unknown."""
    epoch = EpochStart()
    torch.manual_seed(1)
    epoch.candidate()
    combined = Combined(DataLoader(DATA, batch_size=4, shuffle=True))
    trainer = _trainer(combined)  # the iterators made from the first candidate
    expected = epoch._candidates[0]
    epoch.candidate()  # a later moment, after they were made
    epoch.settle(trainer)
    assert epoch.state is not None and torch.equal(epoch.state, expected)

    torch.manual_seed(2)
    epoch.candidate()
    torch.rand(1)  # something drew before the iterators were made
    epoch.settle(_trainer(Combined(DataLoader(DATA, batch_size=4, shuffle=True))))
    assert epoch.state is None


def test_loaders_with_their_own_generator_leave_any_candidate_right() -> None:
    """A loader made with ``generator=`` draws nothing from the global generator: the newest
    candidate is taken."""
    epoch = EpochStart()
    epoch.candidate()
    torch.rand(3)
    epoch.candidate()
    newest = epoch._candidates[-1]
    loader = DataLoader(DATA, batch_size=4, shuffle=True, generator=torch.Generator())
    epoch.settle(_trainer(Combined(loader)))
    assert epoch.state is not None and torch.equal(epoch.state, newest)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_mid_epoch_gives_the_batches_and_the_random_stream_of_the_replaced_run(
    workers: int,
) -> None:
    """An uninterrupted epoch's third batch and the random numbers after it, against a resume
    after its second: Lightning made its iterators from the checkpoint's states and counts two
    batches fetched; the first batch through ResumedEpoch is the third, the numbers drawn
    after it the same."""
    loader = DataLoader(DATA, batch_size=4, shuffle=True, num_workers=workers)
    torch.manual_seed(3)
    made_from = torch.get_rng_state()
    uninterrupted = iter(Combined(loader))
    next(uninterrupted), next(uninterrupted)
    checkpoint = torch.get_rng_state()  # the states a save after the second batch keeps
    third = _values(next(uninterrupted))
    after = torch.rand(2)

    torch.set_rng_state(checkpoint)
    trainer = _trainer(Combined(loader), fetched=2)  # Lightning's, made from the checkpoint's
    epoch = EpochStart()
    fetcher = trainer.fit_loop._data_fetcher
    fetcher.iterator = ResumedEpoch(
        trainer, epoch, made_from, lambda: torch.set_rng_state(checkpoint)
    )
    assert _values(next(fetcher.iterator)) == third
    assert torch.equal(torch.rand(2), after)
    assert fetcher.iterator is trainer.fit_loop._combined_loader  # put back
    assert epoch.state is made_from


def test_an_unknown_start_skips_the_batches_and_warns() -> None:
    """Without the state that made the epoch's iterators, the ones Lightning made are used: the
    batches trained on are still skipped, and a warning says the order may differ."""
    loader = DataLoader(DATA, batch_size=4)
    trainer = _trainer(Combined(loader), fetched=2)
    fetcher = trainer.fit_loop._data_fetcher
    fetcher.iterator = ResumedEpoch(trainer, EpochStart(), None, lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _values(next(fetcher.iterator)) == [8.0, 9.0, 10.0, 11.0]
    assert [str(w.message) for w in caught] == [UNKNOWN_START_WARNING]
