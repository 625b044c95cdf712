"""Every change the SDK makes to objects it does not own, in one place.

The SDK replaces a few attributes of other libraries' objects, each for a scope that ends, and
nothing else (a test fails when another module assigns one: tests/worker_sdk/runtime/
test_patches.py). Each is a :class:`Patch`: applied at the start of its scope and undone at its
end, and undone only while it is still the attribute in place. When something else wrapped over
it meanwhile (a framework's own patch of the same function), the undo leaves that wrapper, which
still calls ours: taking ours out from under it would drop the other's. So a replacement stays
harmless after its scope: the loader wrapper passes calls through once its window is closed,
the collective timer only adds to a total nobody reads any more, the exception hooks call the
hook they replaced.

The SDK's patches, what for, and for how long:

=============================  ===================================  ==================================
attribute                      what for                             scope
=============================  ===================================  ==================================
``sys.excepthook``             report an uncaught exception (OOM)   ``resume()`` to the runtime's
                               before the rank dies                 shutdown (exit_hooks)
``sys.excepthook``             a ``UsageError`` before a runtime    the rest of the process
                               exists ends the rank with            (exit_hooks)
                               EXIT_USAGE
``torch.distributed.<coll>``   the time waited in collectives, for  ``resume()`` to the runtime's
(:data:`.stragglers.TIMED`)    stragglers (FSDP)                    shutdown (stragglers)
``DataLoader.__iter__`` (and   the checkpoint's RNG states for the  ``resume()`` to the first
subclasses defining their own) loaders an epoch loop makes again    ``step()`` (loader_rng)
``DataLoader.__iter__`` (and   each epoch's start state of the      ``resume()`` to the runtime's
subclasses defining their own) loaders' own shuffling generators    shutdown (loader_rng.WATCH)
=============================  ===================================  ==================================

And one hook, not an attribute: a forward pre-hook on every ``nn.Module``
(``register_module_forward_pre_hook``), from ``resume()`` to the first ``step()``, that tells the
loader window the training ran on one of its batches (loader_rng).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["Patch", "active", "undo_all"]

_MISSING: Final = object()
_ACTIVE: list[Patch] = []  # applied and not yet undone, oldest first


class Patch:
    """``owner.name`` replaced by ``replacement`` between :meth:`apply` and :meth:`undo`.

    ``owner`` is a module or a class (a class attribute it only inherits is set on the class
    and deleted again at the undo, so that the inherited one shows through as before).
    """

    __slots__ = ("_own", "applied", "name", "original", "owner", "replacement", "why")

    def __init__(self, owner: Any, name: str, replacement: Any, why: str) -> None:
        self.owner = owner
        self.name = name
        self.replacement = replacement
        self.why = why
        self.applied = False
        self.original: Any = None  # what owner.name was when applied (what the replacement wraps)
        self._own = True  # owner.name was the owner's own (not inherited from a base class)

    def apply(self) -> Patch:
        """Put the replacement in place; returns the patch. Applying twice is an error."""
        if self.applied:
            raise RuntimeError(f"{self!r} is applied already")
        self.original = getattr(self.owner, self.name)
        self._own = not isinstance(self.owner, type) or self.name in vars(self.owner)
        setattr(self.owner, self.name, self.replacement)
        self.applied = True
        _ACTIVE.append(self)
        return self

    def undo(self) -> bool:
        """End the scope: put the original back when the replacement is still in place; True
        then. False when something replaced it meanwhile (left as it is: see the module) or
        when the patch was not applied."""
        if not self.applied:
            return False
        self.applied = False
        _ACTIVE.remove(self)
        if getattr(self.owner, self.name, _MISSING) is not self.replacement:
            return False
        if self._own:
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)
        return True

    def __repr__(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", "?")
        return f"Patch({owner}.{self.name}: {self.why})"


def active() -> tuple[Patch, ...]:
    """The patches applied and not undone, oldest first."""
    return tuple(_ACTIVE)


def undo_all(patches: list[Patch]) -> None:
    """Undo ``patches`` newest first (each puts back what the one before it wrapped) and empty
    the list."""
    for patch in reversed(patches):
        patch.undo()
    patches.clear()
