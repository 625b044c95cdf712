"""A Lightning resume in the middle of an epoch, made exact.

Lightning, resumed from a checkpoint saved mid-epoch, starts a plain ``DataLoader``'s epoch again
from its first batch while the step count goes on; it makes the epoch's iterators before the
sampler is told the epoch (an iterator with workers fetches its first indices at once, in the
order of epoch 0); and the iterators draw their seeds from the global generator just after the
checkpoint's RNG states were put back, so the training's random stream shifts. None of this
happens in the run the resume replaces.

So the callback keeps, for each epoch, the torch generator state the epoch's iterators were
made from (:class:`EpochStart`, saved in the callback's state in Lightning's checkpoint), and a
resume mid-epoch makes them again exactly as that run did (:class:`ResumedEpoch`): from that
state, once the sampler knows the epoch; then it fetches the batches the checkpoint had trained
on and gives the training back the RNG states of the checkpoint. A loader with a state of its
own (torchdata's ``StatefulDataLoader``) is left at the position Lightning restores; only the
RNG states are given back (docs/integrations.md: measured inexact under DDP).

Which state made an epoch's iterators is read off them, not guessed from Lightning's order of
hooks: the candidates (the states when the callback's ``setup`` ends, and at each
``on_train_epoch_start``) are replayed against the seed the first loader that draws one from the
global generator drew. A loader made with ``generator=`` draws nothing from it; where no loader
does, any candidate makes the same iterators.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["UNKNOWN_START_WARNING", "EpochStart", "ResumedEpoch"]

UNKNOWN_START_WARNING = (
    "rvsup: resumed in the middle of an epoch whose data loader iterators were made from "
    "random states rvsup could not identify (a hook drew from torch's generator just before "
    "Lightning made them): the epoch's batches are skipped, but their order and seeds may "
    "differ from the run this one replaces; the resume check says whether they did"
)


def _drawn_seeds(trainer: Any) -> tuple[int, int] | None:
    """(index, seed) of the first training loader whose iterator drew its seed from torch's
    global generator (a torch ``DataLoader`` without ``generator=``), or None."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    iterators = getattr(getattr(combined, "_iterator", None), "iterators", None)
    if combined is None or not iterators:
        return None
    for i, (loader, iterator) in enumerate(zip(combined.flattened, iterators, strict=False)):
        seed = getattr(iterator, "_base_seed", None)
        if isinstance(seed, int) and getattr(loader, "generator", True) is None:
            return i, seed
    return None


def _draws(state: torch.Tensor) -> int:
    """The seed a ``DataLoader`` iterator made from generator state ``state`` draws."""
    generator = torch.Generator()
    generator.set_state(state)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class EpochStart:
    """The torch generator state the current training epoch's loader iterators were made from."""

    def __init__(self) -> None:
        self.state: torch.Tensor | None = None
        """That state; None where it is not known (see :data:`UNKNOWN_START_WARNING`)."""
        self._candidates: list[torch.Tensor] = []

    def candidate(self) -> None:
        """A moment the epoch's iterators may be made right after: the state now."""
        self._candidates.append(torch.get_rng_state())

    def settle(self, trainer: Any) -> None:
        """At an epoch's first batch (its iterators made): which candidate made them."""
        if not self._candidates:
            return
        candidates, self._candidates = self._candidates, []
        drawn = _drawn_seeds(trainer)
        if drawn is None:  # no iterator drew from the global generator: any of them will do
            self.state = candidates[-1]
            return
        self.state = next((c for c in reversed(candidates) if _draws(c) == drawn[1]), None)

    def resumed(self, state: torch.Tensor | None) -> None:
        """A resume in the middle of the epoch whose iterators ``state`` made."""
        self.state = state
        self._candidates = []


class ResumedEpoch(Iterator[Any]):
    """Stands in for Lightning's training iterator (``fetcher.iterator``) until the first
    batch after a resume, then puts it back.

    By then the sampler knows the epoch, and the fetcher's count of the batches fetched is the
    number of the epoch's batches the checkpoint had trained on (Lightning adds them before the
    first fetch). The iterators of loaders without a state of their own are made again from the
    state that made them in the run this one replaces:

    - at an epoch's start, the state that made the ones Lightning made; the training goes on
      from the state making them leaves (Lightning's resume makes a validation loader's
      iterator meanwhile, to skip the validation the checkpoint preceded: a seed the replaced
      run had drawn and given back);
    - in the middle of one, the state ``made_from`` saved with the checkpoint; the batches
      trained on are fetched and dropped, and the checkpoint's RNG states put back
      (``put_back``). Where that state is not known, the iterators Lightning made are used,
      with a warning.

    A stateful loader's iterator, which Lightning put back at its position, is only given the
    checkpoint's RNG states.
    """

    def __init__(
        self,
        trainer: Any,
        epoch: EpochStart,
        made_from: torch.Tensor | None,
        put_back: Callable[[], None],
    ) -> None:
        self._trainer = trainer
        self._epoch = epoch
        self._made_from = made_from
        self._put_back = put_back
        self._fetcher = trainer.fit_loop._data_fetcher
        self._inner: Iterator[Any] = self._fetcher.iterator

    def __next__(self) -> Any:
        fetcher, inner = self._fetcher, self._inner
        done = int(fetcher.fetched)
        stateful = any(callable(getattr(dl, "load_state_dict", None)) for dl in _loaders(fetcher))
        if done == 0:
            self._epoch.settle(self._trainer)
            if self._epoch.state is not None and not stateful:
                torch.set_rng_state(self._epoch.state)
                inner = iter(fetcher.combined_loader)
        else:
            self._epoch.resumed(self._made_from)
            skip = 0 if stateful else done  # Lightning put a stateful one back at its position
            if self._made_from is not None and not stateful:
                torch.set_rng_state(self._made_from)
                inner = iter(fetcher.combined_loader)
            elif not stateful:
                warnings.warn(UNKNOWN_START_WARNING, RuntimeWarning, stacklevel=2)
            for _ in range(skip):
                next(inner)
            self._put_back()
        fetcher.iterator = inner
        return next(inner)


def _loaders(fetcher: Any) -> list[Any]:
    return list(getattr(fetcher.combined_loader, "flattened", []))
