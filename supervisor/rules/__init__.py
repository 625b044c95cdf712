"""Pure rules: no I/O, no clock, no process. Everything here is a function of its arguments.

- :mod:`.states` — the job lifecycle and its allowed transitions.
- :mod:`.failures` — ``classify(observation) -> Failure``.
- :mod:`.hangs` — when silence is a hang (the automatic timeout, the quiet ranks).
- :mod:`.policy` — ``decide(history, failure, policy) -> Restart | GiveUp | Requeue``.

A unit test (``tests/unit/test_architecture.py``) checks that nothing here imports a module that
does I/O.
"""
