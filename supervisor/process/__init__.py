"""Processes the supervisor starts and ends.

- :mod:`.launcher` — the torchrun/srun command line and environment, spawning, the warm standby.
- :mod:`.proctree` — subreaper, teardown (SIGTERM, monotonic deadline, SIGKILL, reap).
"""

__all__ = ["launcher", "plan", "proctree", "tree"]
