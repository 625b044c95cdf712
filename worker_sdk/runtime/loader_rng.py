"""An epoch loop resumes bit-exactly: the DataLoader iterators a script creates after ``resume()``.

A script that loops by epochs creates a DataLoader iterator per epoch (``for batch in loader``).
Unless the loader has its own ``generator``, each ``iter()`` draws its base seed (and a
``RandomSampler`` without a generator, its permutation's seed) from the global torch RNG. In an
uninterrupted run, the checkpoint of step ``s`` is taken with the iterator of ``s``'s epoch
already made: the rest of the epoch's batches follow without a draw, and the next epoch's
``iter()`` draws. A resumed run makes the current epoch's iterator again (and, if the loop starts
at epoch 0, those of the epochs done), after ``resume()`` restored the RNGs: every draw shifts the
stream, and every dropout mask after it.

So from ``resume()`` until the first ``step()`` (the *window*), rvsup wraps the iterators that
DataLoaders make, and puts the checkpoint's RNG states back where the uninterrupted run had them:

- before each ``iter()``, the checkpoint's states: an iterator that starts the next epoch (the
  checkpoint ended an epoch) draws exactly what the uninterrupted run drew;
- before each batch, the checkpoint's states if the iterator had already yielded batches (its
  epoch was under way at the checkpoint: no ``iter()`` draw happened in between), else the states
  right after this iterator's ``iter()`` (the batch that starts an epoch).

The batch that the first resumed step trains on is fetched last before that step, so the step
sees the RNG stream the uninterrupted run saw. Unless the training is already under way: a
script that calls ``step()`` once every few batches (gradient accumulation, ``step()`` at each
optimizer step) trains on the window's first batches before it. A module's forward after a
batch of the window says so (a forward pre-hook on every module, for the window only): from
then on nothing is put back, the stream is the training's own. What cannot be made equal is
reported at the first ``step()``: an epoch under way at the checkpoint whose iterator was made
again from the global RNG, with a shuffling sampler or worker processes seeded from it (see
:func:`advice`), and a loop that read more than an epoch's batches to skip them (it iterates
over the epochs done: their data is read for nothing; the loop should start at the
checkpoint's epoch).
Outside the window an iterator costs one attribute test per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.hooks import RemovableHandle

from worker_sdk.checkpoint import rng as _rng
from worker_sdk.checkpoint.loader_generators import LEDGER

from .patches import Patch, undo_all

__all__ = ["WATCH", "GeneratorWatch", "LoaderWindow"]

_WHY: Final = "the checkpoint's RNG states for the loaders made before the first step()"

_FIX: Final = (
    "give the DataLoader a generator of its own, `DataLoader(..., generator=torch.Generator())` "
    "(rvsup's checkpoints keep its state at every epoch's start), or seed one at the top of "
    "every epoch, beside sampler.set_epoch(epoch): `g = torch.Generator(); loader = "
    "DataLoader(..., generator=g)`, then `g.manual_seed(seed + epoch)`; or use torchdata's "
    "StatefulDataLoader and pass it to worker_sdk.resume()"
)


class _ResumedIterator:
    """A DataLoader iterator made in the window; delegates everything to the real one."""

    __slots__ = ("after_iter", "it", "loader", "made_fresh", "window")

    def __init__(
        self, it: Any, loader: Any, window: LoaderWindow, after_iter: Callable[[], None]
    ) -> None:
        self.it = it
        self.loader = loader
        self.window = window
        self.after_iter = after_iter  # puts back the RNG states right after it was made
        self.made_fresh = _yielded(it) == 0  # False: a stateful loader resumed mid-epoch

    def __iter__(self) -> _ResumedIterator:
        return self

    def __next__(self) -> Any:
        w = self.window
        if not w.open:
            return next(self.it)
        if w.fetched and w.forwarded and not w.training:  # a module ran since the last batch
            w.training = True  # the training is under way: from the latest batch
            w.trained = (w.last, _yielded(w.last.it) if w.last is not None else 0, w.fetched)
        if not w.training:
            (self.after_iter if _yielded(self.it) == 0 else w.put_back)()
        try:
            batch = next(self.it)
        finally:
            LEDGER.fetched(self.loader)  # the generators' states after the draws, or the end's
        w.last = self
        w.fetched += 1
        w.forwarded = False
        return batch

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.it, name)


class LoaderWindow:
    """Installed by ``resume()`` when it loaded a checkpoint; closed by the first ``step()``."""

    def __init__(self, states: Any, resumed_objects: Sequence[Any]) -> None:
        self.put_back = _rng.prepare(states)  # the checkpoint's RNG states, as restored
        self.open = True
        self.training = False  # the training ran on a batch of the window: put nothing back
        self.forwarded = False  # a module's forward since the latest batch
        self._forward_hook: RemovableHandle | None = None
        self.trained: tuple[_ResumedIterator | None, int, int] | None = None  # the first
        # batch trained on: its iterator, the batches it had yielded, the window's fetched
        self.making = False  # inside a wrapped __iter__
        self.fetched = 0  # batches fetched in the window
        self.last: _ResumedIterator | None = None  # the iterator of the latest batch
        self._given = {id(o) for o in resumed_objects}
        self._patched: list[Patch] = []

    def install(self) -> None:
        """Wrap ``__iter__`` of DataLoader and of every loaded subclass that defines its own."""
        LEDGER.open_window()
        for cls, original in _own_iters():
            wrapped = self._wrap(original)
            self._patched.append(Patch(cls, "__iter__", wrapped, _WHY).apply())
        self._forward_hook = register_module_forward_pre_hook(self._forward)

    def _forward(self, _module: Any, _args: Any) -> None:
        self.forwarded = True

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        window = self

        def __iter__(loader: Any) -> Any:  # noqa: N807 - it replaces a class's __iter__
            if not window.open or window.making or window.training:
                return original(loader)
            window.put_back()
            window.making = True  # a subclass's __iter__ calling its base's: wrap once
            try:
                it = original(loader)
            finally:
                window.making = False
            return _ResumedIterator(it, loader, window, _rng.prepare(_rng.capture()))

        return __iter__

    def close(self) -> str | None:
        """At the first ``step()``: stop intervening; what diverges from an uninterrupted run."""
        self.open = False
        notes = LEDGER.close_window()
        undo_all(self._patched)
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        last, self.last = self.last, None
        yielded = None if last is None else _yielded(last.it)
        fetched = self.fetched
        if self.trained is not None:  # the batch trained on first, not the latest fetched
            last, yielded, fetched = self.trained
        if last is None:
            return " ".join(notes) or None  # no loader iterator made in the window
        try:
            per_epoch = len(last.loader)
        except TypeError:  # an IterableDataset without __len__
            per_epoch = 0
        if 0 < per_epoch < fetched:
            notes.append(
                f"rvsup: {fetched} batches were fetched between resume() and the first "
                "step(), more than an epoch's: the loop reads the data of the epochs the "
                "checkpoint had finished only to skip it. Start the epoch loop at the "
                "checkpoint's epoch: `for epoch in range(start // len(loader), epochs)`."
            )
        # exact: an iterator that began its epoch with this step, or a stateful loader restored
        # by resume(), which keeps its own seeds
        fresh = last.made_fresh and yielded is not None and yielded <= 1
        if not fresh and id(last.loader) not in self._given:
            notes.append(advice(last.loader) or "")
        return " ".join(n for n in notes if n) or None


class GeneratorWatch:
    """From ``resume()`` to the runtime's shutdown: every DataLoader iterator made is told to
    the ledger of the loaders' own generators (:mod:`worker_sdk.checkpoint.loader_generators`),
    before and after it is made. Costs a generator state copy per iterator (per epoch)."""

    def __init__(self) -> None:
        self._patched: list[Patch] = []
        self._making = False  # inside a wrapped __iter__ (a subclass's calling its base's)

    def install(self) -> None:
        if self._patched:
            return
        for cls, original in _own_iters():
            self._patched.append(Patch(cls, "__iter__", self._wrap(original), _LEDGER_WHY).apply())

    def undo(self) -> None:
        undo_all(self._patched)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def __iter__(loader: Any) -> Any:  # noqa: N807 - it replaces a class's __iter__
            if watch._making or not watch._patched:
                return original(loader)
            LEDGER.before_iter(loader)
            watch._making = True
            try:
                it = original(loader)
            finally:
                watch._making = False
            LEDGER.made(loader, it)
            return it

        return __iter__


_LEDGER_WHY: Final = "each epoch's start state of the loaders' own shuffling generators"

WATCH: Final = GeneratorWatch()


def _own_iters() -> list[tuple[type[Any], Callable[..., Any]]]:
    """DataLoader and every loaded subclass that defines its own ``__iter__``, with it."""
    out = []
    pending: list[type[Any]] = [DataLoader]
    seen: set[type[Any]] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        original = cls.__dict__.get("__iter__")
        if original is not None:
            out.append((cls, original))
    return out


def advice(loader: Any) -> str | None:
    """Why the epoch under way cannot resume exactly with ``loader`` (None: it can)."""
    if getattr(loader, "generator", None) is not None:
        return None
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, RandomSampler) and sampler.generator is None:
        return (
            "rvsup: the resumed epoch's DataLoader shuffles with a RandomSampler seeded from the "
            "global RNG when its iterator is made, so the rest of this epoch sees its samples in "
            "another order than the uninterrupted run would have (the result differs). To "
            f"resume bit-exactly, {_FIX}"
        )
    if getattr(loader, "num_workers", 0) > 0:
        return (
            "rvsup: the resumed epoch's DataLoader has worker processes seeded from the global "
            "RNG when its iterator is made: random draws in the workers (data augmentation) "
            "differ from the uninterrupted run's for the rest of this epoch. To resume "
            f"bit-exactly, {_FIX}"
        )
    return None


def _yielded(it: Any) -> int:
    """Batches the iterator has yielded (torch's and torchdata's iterators count them)."""
    n = getattr(it, "_num_yielded", 0)
    return n if isinstance(n, int) else 0
