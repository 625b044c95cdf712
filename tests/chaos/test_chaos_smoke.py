"""The chaos campaign's smoke mode, as CI runs it: the regression schedules (each a defect a
campaign found) and one seeded draw, every invariant checked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.harness import REPO, rvsup_env

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]  # ~2-3 min on 2 idle cores


def test_chaos_smoke_holds_every_invariant() -> None:
    """``python -m tests.chaos --smoke`` exits 0: for a corrupted stop checkpoint, a SIGSTOPped
    rank then a kill aimed at a save that spends the budget, two ranks failing at once, a full
    disk and a killed daemon with its checkpoint truncated, a rank stuck in a receive twice, a
    stopped rank's hang before a full disk, a killed daemon whose ranks committed what it never
    logged, a NaN rolled back then a crash before the next save, and a drawn schedule, the exit
    codes, the resumes, the failures named, the budget and the final state are all as
    injected."""
    res = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--smoke", "--seed", "1"],
        cwd=REPO,
        env=rvsup_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert "failed_runs            0" in res.stdout, res.stdout
