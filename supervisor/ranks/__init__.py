"""What the ranks tell the supervisor, and how it listens.

- :mod:`.channel` — the authenticated ZeroMQ endpoint and the per-rank table it fills.
- :mod:`.coordinated` — the save round: every rank checkpoints at one common step; an
  attempt's saves (timed, or for a stop).
- :mod:`.checkpoints` — commits seen on disk (watchdog) or announced by rank 0.
- :mod:`.silence` — which ranks went quiet, and since when.
- :mod:`.slow` — a silence judged: a stuck group, or a busy rank (a slow phase).
- :mod:`.hang_check` — the two above, at every tick of an attempt: when a silence is a hang.
- :mod:`.training` — the ranks' losses and anomaly reports, as events.

The dependency between this package and :mod:`supervisor.process` points one way: ``ranks`` may
use what ``process`` reads of a process (:mod:`supervisor.process.activity`), and ``process``
never imports ``ranks``. ``process`` deals with the processes of this node as the kernel shows
them (pidfds, zombies, signals, ``/proc``, ptrace), whoever they are; ``ranks`` with what the
ranks say over the channel. What the kernel says of a rank's process, how it exited or where it
is stuck, is therefore in ``process``.
"""

__all__ = [
    "channel",
    "checkpoints",
    "coordinated",
    "hang_check",
    "silence",
    "slow",
    "training",
]
