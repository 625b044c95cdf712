"""Real torchrun, 2 ranks on CPU/gloo, ranks forked from the zygote (the default): a kill -9
restart is quick and bit-identical to a cold run, and ``zygote = false`` starts ranks cold."""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.harness import events, named, running, wait_progress, write_job
from tests.helpers.states import assert_same_state, load_final

pytestmark = pytest.mark.process


def _parents(st: dict[str, Any]) -> list[str]:
    """The command lines of the ranks' parents, from a status."""
    parents = [psutil.Process(r["pid"]).parent() for r in st["ranks"]]
    return [" ".join(p.cmdline()) if p is not None else "" for p in parents]


def _at(event: dict[str, object]) -> float:
    return datetime.datetime.fromisoformat(
        str(event["timestamp"]).replace("Z", "+00:00")
    ).timestamp()


@pytest.mark.serial  # resumed within 4 s
def test_kill9_restart_from_the_zygote_is_quick_and_bit_identical(
    tmp_path: Path, reference_final: Path
) -> None:
    """Both ranks are the zygote's children; after kill -9 of rank 1 the next attempt's ranks
    (forked again) load the checkpoint within 4 s of the kill (cold starts take 5-8 s here), no
    rank starts cold, and the final state equals the cold reference run's bit for bit."""
    final, slow = tmp_path / "final.pt", tmp_path / "slow"
    slow.touch()  # 0.1 s steps until the kill; the restarted attempt at full speed
    job = write_job(
        tmp_path, env={"FINAL": str(final), "STEP_SLEEP": "0.1", "SLOW_WHILE": str(slow)}
    )
    with running(job) as proc:
        st = wait_progress(job, min_step=15)
        victim = next(r for r in st["ranks"] if r["rank"] == 1)
        parents = _parents(st)  # before the kill: a reaped rank has no parent to ask for
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        slow.unlink()
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert all("worker_sdk.spawn.zygote" in p for p in parents), parents
    evs = events(tmp_path / "run")
    assert named(evs, "cold_start") == []
    assert [f["kind"] for f in named(evs, "failure_detected")] == ["crash"]
    loaded = [e for e in named(evs, "checkpoint_loaded") if e["attempt"] == 2]
    assert loaded and loaded[0]["resume_step"] > 0
    mttr = _at(loaded[0]) - killed_at
    print(f"resumed {mttr:.2f}s after the kill")
    assert mttr < 4.0, f"resumed {mttr:.2f}s after the kill"
    assert_same_state(load_final(reference_final), load_final(final))


def test_zygote_false_starts_ranks_cold(tmp_path: Path) -> None:
    """``[launch] zygote = false``: the launcher's command line has no ``--zygote`` and each
    rank is its launcher's child (the bootstrap exec'd the script)."""
    job = write_job(
        tmp_path,
        total=40,
        env={"STEP_SLEEP": "0.05"},
        launch='term_timeout = "3s"\nstop_timeout = "30s"\nzygote = false',
    )
    with running(job) as proc:
        parents = _parents(wait_progress(job, min_step=5))
        assert all("torch" in p and "worker_sdk.spawn.zygote" not in p for p in parents), parents
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    started = named(events(tmp_path / "run"), "attempt_started")
    assert "--zygote" not in started[0]["launcher"]
