"""The generators DataLoaders shuffle with, saved per epoch, so that a resumed epoch keeps its order.

A DataLoader whose sampler shuffles with a generator of its own draws each epoch's order from
it when the epoch's iterator starts: ``DataLoader(..., shuffle=True, generator=g)`` where the
script never seeds ``g`` again, and every loader ``accelerate``'s ``prepare()`` returns for a
shuffling one (it gives the sampler a generator, seeded once from the global RNG, and hands
rank 0's state to every rank at each epoch). The generator moves on by one epoch's draws per
epoch, and no checkpoint held it: a resumed run, whose loader starts from the generator's first
state, replayed epoch 0's order in the epoch under way (a loop that starts at the checkpoint's
epoch), and the result differed.

So the :class:`Ledger` keeps, per such loader, the generator's state at the start of each of
its epochs (at its ``__iter__``, before any draw: the *lineage*, the first
:data:`LINEAGE_KEPT`), its state now, and whether the epoch under way was over. A checkpoint
holds them in each rank's file. Between ``resume()`` and the first ``step()`` the loader's
iterators start from them (:meth:`Ledger.before_iter`): the first one from the start of the
epoch that was under way, or from the state after it when it was over; a second one in that
window means the loop went back to epoch 0 to skip the epochs done, and each epoch then starts
from its own state in the lineage. After an epoch that was over, torch's iterator still had
one draw of its sampler to make: it is made again (:func:`_set_after`). A generator the script
seeds itself (``g.manual_seed(seed + epoch)`` at every epoch) is left alone: its state when the
window's first iterator starts is not its first one, or it changed between two iterators.
Loaders are matched by the order in which their generators were first iterated (a loader
Accelerate's ``skip_first_batches`` makes shares the prepared one's). The cost outside a
resume: one generator state copied per epoch and loader, nothing per batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch.utils.data import RandomSampler

__all__ = ["LEDGER", "LINEAGE_KEPT", "Ledger", "generator_of"]

LINEAGE_KEPT: Final = 256  # epochs' start states kept per loader (5 KB each on the CPU)


def generator_of(loader: Any) -> torch.Generator | None:
    """The generator ``loader`` shuffles with, when it has one of its own: Accelerate's
    synchronised one, or a ``RandomSampler``'s (the loader's ``generator`` argument becomes its
    sampler's), looked for through batch samplers that wrap others; None otherwise."""
    synced = getattr(loader, "synchronized_generator", None)
    if isinstance(synced, torch.Generator):
        return synced
    pending = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    for _ in range(4):  # BatchSamplerShard(BatchSampler(RandomSampler)): a few levels at most
        found = []
        for sampler in pending:
            if isinstance(sampler, RandomSampler) and isinstance(
                sampler.generator, torch.Generator
            ):
                return sampler.generator
            for name in ("sampler", "batch_sampler"):
                inner = getattr(sampler, name, None)
                if inner is not None and inner is not sampler:
                    found.append(inner)
        pending = found
    return None


def _over(loader: Any, iterator: Any) -> bool | None:
    """Whether the epoch of ``loader``'s latest ``iterator`` was over (its last batch given);
    None when that cannot be told."""
    flag = getattr(loader, "end_of_dataloader", None)  # Accelerate's, set with the last batch
    if isinstance(flag, bool) and iterator is not None:
        return flag
    yielded = getattr(iterator, "_num_yielded", None)  # torch's and torchdata's iterators
    if not isinstance(yielded, int):
        return None
    try:
        return yielded >= len(iterator)
    except TypeError:
        return None


@dataclass
class _Saved:
    """A loader's entry in the checkpoint a run resumed from."""

    epoch: int  # the lineage index of the epoch under way (or just over) at the checkpoint
    start: torch.Tensor  # that epoch's start state
    now: torch.Tensor  # the state at the checkpoint
    over: bool | None  # whether that epoch was over (None: unknown)
    lineage: list[torch.Tensor]  # the first epochs' start states
    replay: bool  # the epoch over, its sampler's last draw still to come (torch's iterator)

    def state(self, epoch: int) -> torch.Tensor | None:
        """The generator's state at the start of ``epoch`` in the run it resumes, if known
        (the epoch after an epoch that was over: see :func:`_set_after`)."""
        if epoch == self.epoch:
            return self.start
        if epoch == self.epoch + 1 and self.over:
            return self.now
        return self.lineage[epoch] if epoch < len(self.lineage) else None


@dataclass
class _Tracked:
    """One loader with a generator of its own, in the order of their first iterators."""

    loader: weakref.ref[Any]
    generator: torch.Generator
    start: torch.Tensor  # the latest iterator's epoch's start state
    lineage: list[torch.Tensor] = field(default_factory=list)  # each epoch's start state
    epoch: int = -1  # the lineage index of the latest iterator's epoch
    iterator: Any = None  # a weak reference to the latest iterator, or None
    saved: _Saved | None = None  # from the checkpoint resumed from, for the window
    window_iterators: int = 0
    managed: bool = True  # False: the script seeds the generator itself, or it cannot be told
    drawn: torch.Tensor | None = None  # in the window: the state after the iterator's latest
    # batch, or its end (its epoch's draws done)

    def latest_iterator(self) -> Any:
        return None if self.iterator is None else self.iterator()


class Ledger:
    """The process's loaders with generators of their own (see the module)."""

    def __init__(self) -> None:
        self._tracked: list[_Tracked] = []
        self._by_generator: dict[int, _Tracked] = {}
        self._inner: weakref.WeakSet[Any] = weakref.WeakSet()  # loaders inside others
        self._loaded: list[_Saved | None] = []  # a checkpoint's entries, by first iteration
        self.window = False  # between resume() and the first step()
        self.notes: list[str] = []
        self.skipped = 0  # steps a rollback skips after the checkpoint resumed from

    def reset(self) -> None:
        """Forget every loader and saved state (a new ``resume()`` in this process)."""
        self._tracked.clear()
        self._by_generator.clear()
        self._inner = weakref.WeakSet()
        self._loaded = []
        self.window = False
        self.notes = []
        self.skipped = 0

    def rolled_back(self, skipped: int) -> None:
        """The resumed run goes on ``skipped`` steps past the checkpoint (a rollback): the
        window's first iterators get a note on the epochs those steps may reach into."""
        self.skipped = skipped

    def load(self, entries: Iterable[Any]) -> None:
        """A checkpoint's entries (:meth:`capture` of the run it resumes), for the loaders'
        iterators made in the window."""
        self._loaded = [_saved(e) for e in entries]

    def before_iter(self, loader: Any) -> None:
        """``loader.__iter__`` is about to run: record (and in the window, set) its generator's
        state at the start of the epoch."""
        inner = getattr(loader, "base_dataloader", None)  # Accelerate's, iterated inside it
        if inner is not None:
            self._inner.add(inner)
        g = None if loader in self._inner else generator_of(loader)
        if g is None:
            return
        t = self._by_generator.get(id(g))
        if t is not None:
            t.loader = weakref.ref(loader)  # another loader with the same generator: one
            # that Accelerate's skip_first_batches made, or the prepared one again
        else:
            t = _Tracked(weakref.ref(loader), g, g.get_state())
            index = len(self._tracked)
            t.saved = self._loaded[index] if index < len(self._loaded) else None
            if t.saved is not None:
                t.lineage = list(t.saved.lineage)
                t.epoch = t.saved.epoch
                t.managed = torch.equal(g.get_state(), t.saved.lineage[0])
            self._tracked.append(t)
            self._by_generator[id(g)] = t
        if self.window and t.saved is not None:
            self._in_window(t, t.saved)
        else:
            t.epoch += 1
        t.start = g.get_state()
        if t.epoch == len(t.lineage) and t.epoch < LINEAGE_KEPT:
            t.lineage.append(t.start)
        t.iterator = None

    def made(self, loader: Any, iterator: Any) -> None:
        """``loader.__iter__`` returned ``iterator`` (kept weakly, to tell at a save whether
        its epoch was over)."""
        t = self._entry(loader)
        if t is not None:
            try:
                t.iterator = weakref.ref(iterator)
            except TypeError:  # an object without weak references: its epoch cannot be told
                t.iterator = None

    def capture(self) -> list[dict[str, Any]]:
        """What a checkpoint keeps, per tracked loader (tensors and ints only)."""
        out: list[dict[str, Any]] = []
        for t in self._tracked:
            loader = t.loader()
            over = _over(loader, t.latest_iterator())
            # torch's own iterator draws once more from the sampler after its last batch
            replay = bool(over) and getattr(loader, "end_of_dataloader", None) is None
            out.append(
                {
                    "lineage": list(t.lineage),
                    "epoch": t.epoch,
                    "start": t.start,
                    "now": t.generator.get_state(),
                    "over": -1 if over is None else int(over),
                    "replay": int(replay),
                }
            )
        return out

    def open_window(self) -> None:
        """``resume()`` loaded a checkpoint: the loaders' iterators until the first ``step()``
        start where the run left them."""
        self.window = True

    def close_window(self) -> list[str]:
        """The first ``step()``: the window ends; what it could not set, as notes."""
        self.window = False
        notes, self.notes = self.notes, []
        return notes

    def fetched(self, loader: Any) -> None:
        """In the window, a batch of ``loader``'s iterator came, or its end: the generator's
        state then (a generator the script leaves alone is in that state at the next
        iterator)."""
        if not self._tracked:  # no loader shuffles with a generator of its own
            return
        t = self._entry(loader)
        if t is not None:
            t.drawn = t.generator.get_state()

    def _entry(self, loader: Any) -> _Tracked | None:
        """The entry whose latest iterator ``loader`` made (None: another loader's, or none)."""
        g = None if loader in self._inner else generator_of(loader)
        t = None if g is None else self._by_generator.get(id(g))
        return t if t is not None and t.loader() is loader else None

    def _in_window(self, t: _Tracked, saved: _Saved) -> None:
        """Set the generator of a loader whose iterator starts in the window (see the module):
        the first iterator is the checkpoint's epoch (or the next, when it was over); a second
        one means the loop went back to epoch 0, and the n-th is then epoch n - 1. A generator
        whose state the script changed between two iterators is its own: left alone."""
        t.window_iterators += 1
        if t.window_iterators == 1:
            if saved.over is None:
                t.managed = False
                self.notes.append(
                    "rvsup: a DataLoader shuffles with a generator of its own, and whether its "
                    "epoch was over at the checkpoint could not be told (its iterator is not "
                    "torch's nor Accelerate's): the resumed epoch's order may not be the run's"
                )
            t.epoch = saved.epoch + (1 if saved.over else 0)
            if self.skipped and t.managed:
                self.notes.append(_ROLLBACK_NOTE.format(self.skipped))
        else:
            t.epoch = t.window_iterators - 1
            if t.drawn is None or not torch.equal(t.generator.get_state(), t.drawn):
                t.managed = False  # seeded by the script between epochs, or not seen drawing
        t.drawn = None
        if not t.managed:
            return
        loader = t.loader()
        if t.epoch == saved.epoch + 1 and saved.over and saved.replay and loader is not None:
            _set_after(loader, t.generator, saved.start)
            return
        state = saved.state(t.epoch)
        if state is None:
            self.notes.append(
                f"rvsup: the loop went back over {t.epoch} epochs of a DataLoader that shuffles "
                f"with a generator of its own; rvsup keeps the first {LINEAGE_KEPT} epochs' "
                "orders: start the loop at the checkpoint's epoch"
            )
            return
        t.generator.set_state(state)


_ROLLBACK_NOTE: Final = (
    "rvsup: a rollback skipped {} steps after the checkpoint resumed from; a DataLoader that "
    "shuffles with a generator of its own starts in the order of the epoch under way at the "
    "checkpoint, so where the skipped steps reach into a later epoch, that epoch's order is not "
    "the one the run would have had: an order that is a function of the epoch alone (Accelerate's "
    "use_seedable_sampler=True with loader.set_epoch(epoch), or the generator seeded at every "
    "epoch) makes any resume keep it"
)


def _set_after(loader: Any, g: torch.Generator, start: torch.Tensor) -> None:
    """Set ``g`` to its state after the epoch that began at ``start``: what torch's iterator
    draws from it, done again without loading a batch (its base seed, when ``g`` is the
    loader's own generator, then every index of its sampler, with the draw after the last)."""
    g.set_state(start)
    if getattr(loader, "generator", None) is g:
        torch.empty((), dtype=torch.int64).random_(generator=g)
    batches = getattr(loader, "batch_sampler", None)  # torch iterates it when there is one
    for _ in batches if batches is not None else loader.sampler:
        pass


def _saved(entry: Any) -> _Saved | None:
    """A checkpoint's entry, checked (None: not one rvsup wrote)."""
    if not isinstance(entry, Mapping):
        return None
    lineage, start, now = entry.get("lineage"), entry.get("start"), entry.get("now")
    epoch, over = entry.get("epoch"), entry.get("over")
    if not (isinstance(lineage, list) and lineage and isinstance(epoch, int)):
        return None
    if not (isinstance(start, torch.Tensor) and isinstance(now, torch.Tensor)):
        return None
    replay = entry.get("replay", 0)
    if not all(isinstance(s, torch.Tensor) for s in lineage) or not isinstance(over, int):
        return None
    if not isinstance(replay, int):
        return None
    return _Saved(epoch, start, now, None if over < 0 else bool(over), list(lineage), bool(replay))


LEDGER: Final = Ledger()
"""The process's ledger: written by the DataLoader wrapper (``worker_sdk.runtime.loader_rng``),
read by the checkpoint's capture and restore."""
