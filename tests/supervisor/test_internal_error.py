"""A bug in the daemon never freezes it: the error is recorded, the job's processes are torn down,
and ``rvsup start`` exits 1."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.harness import events, named, rvsup_env, write_job

pytestmark = pytest.mark.process

_INJECT = """
import sys
from supervisor import attempt
original = attempt.Attempt._maybe_schedule_save
def tick_with_a_bug(self, now):
    if any(st.last_step >= 3 for st in self.ranks):
        raise RuntimeError("injected bug in the tick")
    original(self, now)
attempt.Attempt._maybe_schedule_save = tick_with_a_bug
from supervisor.cli import main
sys.exit(main(["start", sys.argv[1]]))
"""


def test_a_raising_loop_exits_1_with_supervisor_error(tmp_path: Path) -> None:
    """The tick loop raising mid-run ends the daemon with exit 1 and a supervisor_error event
    carrying the traceback, and no rank is left running (the suite checks for leftovers)."""
    job = write_job(tmp_path, total=100_000)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", _INJECT, str(job)],
        env=rvsup_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stderr[-2000:]
    evs = events(tmp_path / "run")
    (error,) = named(evs, "supervisor_error")
    assert "injected bug in the tick" in error["traceback"]
    assert "tick" in error["error"]
    assert evs[-1]["event"] == "supervisor_error"
    assert not named(evs, "restart_scheduled")
    assert took < 60
