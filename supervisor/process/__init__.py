"""Processes the supervisor starts, watches and ends, on this node, as the kernel shows them.

- :mod:`.launch_plan` — the torchrun/srun command line and environment of one attempt.
- :mod:`.launcher` — starting it, the warm standby.
- :mod:`.plan` — launch planning for one ``rvsup start`` (nodes, ports, the zygote, cold starts).
- :mod:`.tree` — one attempt's processes: start, watch, collect stacks, tear down.
- :mod:`.proctree` — subreaper, teardown (SIGTERM, monotonic deadline, SIGKILL, reap).
- :mod:`.cgroup` — one cgroup v2 group per attempt, and its teardown.
- :mod:`.exits` — how each rank process ended (pidfds, zombies, exit reports).
- :mod:`.diagnostics` — Python stacks and flight recorders of every rank before a hung attempt
  is killed.
- :mod:`.native` — native stacks by py-spy.
- :mod:`.activity` — what a rank's process is doing, from ``/proc``.
- :mod:`.zygote` — the per-node zygote the ranks are forked from.

This package never imports :mod:`supervisor.ranks` (what the ranks say over the channel) nor
:mod:`supervisor.service` (how the daemon is run and controlled): they are built on it, and it
takes from them only what they pass in (e.g. the environment variables a child must not inherit,
:func:`.launch_plan.build_plan`'s ``withheld_env``).
"""

__all__ = [
    "activity",
    "cgroup",
    "diagnostics",
    "exits",
    "launch_plan",
    "launcher",
    "native",
    "plan",
    "proctree",
    "tree",
    "zygote",
]
