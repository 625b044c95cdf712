"""The stop signals kept from the first instruction of ``rvsup start``, then handed to the loop."""

from __future__ import annotations

import asyncio
import signal

from supervisor.daemon import STOP_SIGNALS
from supervisor.service.stop_signals import SIGNALS, StopSignals


def test_every_signal_caught_early_has_a_stop_reason() -> None:
    """The signals the entry point catches are exactly those the daemon maps to a stop."""
    assert set(SIGNALS) == set(STOP_SIGNALS)


def test_signals_are_kept_then_handed_to_the_loop_then_kept_again() -> None:
    """Before the loop takes them, signals are kept in order; deliver_to hands those over at
    once and the later ones through the loop; after hold() they are kept again."""
    stops = StopSignals()
    stops._on_signal(signal.SIGTERM, None)
    stops._on_signal(signal.SIGINT, None)
    assert stops.pending() == [signal.SIGTERM, signal.SIGINT]
    got: list[signal.Signals] = []

    async def main() -> None:
        stops.deliver_to(asyncio.get_running_loop(), got.append)
        assert got == [signal.SIGTERM, signal.SIGINT]
        assert stops.pending() == []
        stops._on_signal(signal.SIGUSR1, None)
        assert got == [signal.SIGTERM, signal.SIGINT], "enqueued, not run in the handler"
        await asyncio.sleep(0)
        assert got[-1] is signal.SIGUSR1
        stops.hold()

    asyncio.run(main())
    stops._on_signal(signal.SIGTERM, None)
    assert stops.pending() == [signal.SIGTERM]
    assert len(got) == 3
