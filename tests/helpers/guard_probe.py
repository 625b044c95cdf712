"""Tests the leftover guard must judge right under pytest-xdist: tests/test_process_guard.py
runs this file on two workers (``-n 2``; the suite never collects it: its name is not
``test_*.py``). With three tests on two workers xdist hands them out in turn: the first and the
third to one worker, the second to the other, and the first two wait for each other, so they
run at once. ``RVTEST_PROBE_DIR``: the folder they meet in; without it they skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.escape import gone, leak_an_escaped_process
from tests.helpers.harness import wait_for

PROBE = "RVTEST_PROBE_DIR"
pytestmark = pytest.mark.skipif(
    PROBE not in os.environ, reason="run by tests/test_process_guard.py"
)
WAIT_S = 120.0


def _meet(here: Path, me: str, other: str) -> None:
    (here / me).touch()
    wait_for((here / other).exists, timeout=WAIT_S, what=f"{other} on another worker")


@pytest.mark.process
def test_holds_a_process_while_the_other_worker_checks() -> None:
    """A sleeper of this test lives on through the check after the other worker's test (which
    ends that test's own leak): it is not taken for that worker's leftover."""
    here = Path(os.environ[PROBE])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        _meet(here, "held", "leaking")
        pid_file = here / "leaked.pid"
        leaked = int(
            wait_for(
                lambda: pid_file.exists() and pid_file.read_text(),
                timeout=WAIT_S,
                what="the other test's leak",
            )
        )
        wait_for(lambda: gone(leaked), timeout=WAIT_S, what="the other worker's check")
        assert sleeper.poll() is None, "the other worker's check ended this test's process"
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.process
def test_leaks_a_process(tmp_path: Path) -> None:
    """Leaves an escaped sleeper behind while the other worker's test runs: the check after
    this test must fail it, naming that sleeper only."""
    here = Path(os.environ[PROBE])
    _meet(here, "leaking", "held")
    leaked = leak_an_escaped_process(tmp_path)
    (here / "leaked.tmp").write_text(str(leaked))
    (here / "leaked.tmp").rename(here / "leaked.pid")


def test_leaks_a_process_until_the_end(tmp_path: Path) -> None:
    """Not marked ``process``, so checked only at the end of the session: leaves an escaped
    sleeper behind, which its worker's last check must find and the run's result report."""
    leaked = leak_an_escaped_process(tmp_path)
    (Path(os.environ[PROBE]) / "left-to-the-end.pid").write_text(str(leaked))
