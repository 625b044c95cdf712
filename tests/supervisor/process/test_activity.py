"""What the daemon reads of a rank in /proc (supervisor.process.activity): the fields after a
command name that holds spaces and parentheses, and a live process's threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from supervisor.process import activity


def test_the_fields_start_after_the_last_parenthesis(tmp_path: Path) -> None:
    """A command name may hold ") " itself: the state is the field after the last ")"; a
    file that is gone gives no fields."""
    stat = tmp_path / "stat"
    stat.write_text("4242 (evil) R (x) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0\n")
    fields = activity._stat_fields(str(stat))
    assert fields[0] == "S" and (fields[11], fields[12]) == ("250", "50")
    assert activity._stat_fields(str(tmp_path / "gone")) == []


def test_a_live_process_and_its_waiting_thread_are_read() -> None:
    """This process: a state letter, its CPU time so far; with ``threads``, a thread waiting
    on an event is listed sleeping. A process that is gone reads as None."""
    release = threading.Event()
    waiter = threading.Thread(target=release.wait, daemon=True)
    waiter.start()
    try:
        sample = activity.read(os.getpid(), threads=True)
        assert sample is not None and sample.state in "RS" and sample.cpu_s > 0
        assert any(t.state == "S" for t in sample.threads), sample.threads
    finally:
        release.set()
        waiter.join()
    assert activity.read(2**22 + 1) is None  # above pid_max's default ceiling
