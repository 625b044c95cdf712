"""Pure rules: no I/O, no clock, no process. Everything here is a function of its arguments.

- :mod:`.states` — the job lifecycle and its allowed transitions.
- :mod:`.observation` — what an attempt's end looks like: ``Observation``, ``Failure``, the kinds.
- :mod:`.failures` — ``classify(observation) -> Failure``.
- :mod:`.hangs` — when silence is a hang (the automatic timeout, the quiet ranks).
- :mod:`.culprits` — which ranks hung the group, from their stacks.
- :mod:`.budget` — the restart budget as one fold over the history's events.
- :mod:`.policy` — ``decide(budget, failure, policy) -> Restart | GiveUp | Requeue``.

A unit test (``tests/supervisor/test_architecture.py``) checks that nothing here imports a module that
does I/O.
"""

__all__ = ["budget", "culprits", "failures", "hangs", "observation", "policy", "states"]
