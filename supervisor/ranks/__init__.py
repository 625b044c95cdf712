"""What the ranks tell the supervisor, and how it listens.

- :mod:`.channel` — the authenticated ZeroMQ endpoint and the per-rank table it fills.
- :mod:`.coordinated` — the save round: every rank checkpoints at one common step.
- :mod:`.exits` — how each rank process ended (pidfds, zombies, exit reports).
- :mod:`.checkpoints` — commits seen on disk (watchdog) or announced by rank 0.
- :mod:`.diagnostics` — Python stacks of every rank before a hung attempt is killed.
"""

__all__ = ["channel", "checkpoints", "coordinated", "diagnostics", "exits"]
