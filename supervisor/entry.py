"""The ``rvsup`` command (console script and ``python -m supervisor``).

For ``rvsup start`` the stop signals are caught before anything else is imported
(:mod:`supervisor.service.stop_signals`): a stop that arrives while the daemon is still starting
is kept and honoured once it can be, like any stop. The other commands keep the signals' default
actions.
"""

from __future__ import annotations

import sys

from supervisor.service import stop_signals

__all__ = ["main"]


def main() -> int:
    """Run the command line of this process (``sys.argv``); its exit status."""
    if sys.argv[1:2] == ["start"]:
        stop_signals.installed()
    from supervisor.cli import main as run_command  # after the signals: it imports the rest

    return run_command()
