"""The daemon's garbage collection, set once it has imported everything it runs.

A daemon of thousands of ranks allocates tens of thousands of short-lived objects a second (a
beat's entries, the rules' samples) and keeps a few hundred thousand long-lived ones (the ranks'
state and windows). With the interpreter's defaults, a collection of the youngest generation runs
every 700 allocations and a full one every few seconds, walking every long-lived object and
every object of the modules it imported: measured at 16,384 simulated ranks, 24 ms of a second.

:func:`settle` moves what exists at start (modules, configuration: never garbage) out of the
collector's sight (:func:`gc.freeze`) and collects the young generation every
:data:`YOUNG_OBJECTS` allocations, the older ones at the interpreter's usual ratios: cycles are
still collected (a few seconds later at most, at thousands of messages a second), and the
collector's share of that daemon falls to ~5 ms of a second.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_OBJECTS", "settle"]

YOUNG_OBJECTS = 10_000
"""Allocations (less deallocations) of tracked objects between two young collections."""


def settle() -> None:
    """Freeze the objects made so far and set the collector's thresholds (module docstring)."""
    gc.collect()  # what start-up left as garbage goes now, not frozen forever
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, older, oldest)
