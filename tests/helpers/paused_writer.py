"""rvsup's background writer, frozen (SIGSTOP) at one milestone of one save so that a test can
kill its rank there: ``RVSUP_TEST_WRITER_PAUSE=MILESTONE:STEP`` (``written`` or ``rename``).
A rank runs it instead of rvsup's writer by setting ``AsyncSaver.writer_module``."""

from __future__ import annotations

import os
import signal
import sys

from worker_sdk.checkpoint.background import writer

PAUSE_ENV = "RVSUP_TEST_WRITER_PAUSE"


def pause_at(milestone: str, step: int) -> None:
    """Stop this process at the milestone and step the environment names."""
    if os.environ.get(PAUSE_ENV) == f"{milestone}:{step}":
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    sys.exit(writer.main(sys.argv[1:], reached=pause_at))
