"""Chaos campaigns: random fault schedules against real jobs, invariants checked after every run.

A program, not a test (``python -m tests.chaos``); the suite runs its smoke mode.
:mod:`.schedule` draws and parses schedules, :mod:`.execute` runs one, :mod:`.invariants` says
what broke.
"""
