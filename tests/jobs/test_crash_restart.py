"""Real torchrun, 2 ranks on CPU/gloo: crashes are survived, bit-exactly, and nothing is left behind."""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.harness import events, named, running, rvsup, wait_for, wait_progress, write_job
from tests.helpers.states import assert_same_state, load_final

pytestmark = pytest.mark.process


@pytest.mark.serial  # the crash noticed within 0.1 s, the checkpoint loaded within 4 s
def test_kill9_of_rank1_restarts_and_ends_bit_identical(
    tmp_path: Path, reference_final: Path
) -> None:
    """SIGKILL of rank 1 mid-run: noticed within 0.1 s, one crash and one restart in the history,
    and the final model and optimizer are bit-identical to an uninterrupted run with cold ranks.
    Both ranks are the zygote's children (the default); the next attempt's ranks, forked again,
    load the checkpoint within 4 s of the kill (cold starts take 5-8 s here), none starts cold."""
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
    failures = named(evs, "failure_detected")
    assert [f["kind"] for f in failures] == ["crash"]
    # the killed rank first; a peer that died of the broken connection may follow it
    assert failures[0]["ranks"][0] == 1
    assert failures[0]["signals"][0] == "SIGKILL"
    noticed = datetime.datetime.fromisoformat(failures[0]["noticed_at"]).timestamp()
    assert noticed - killed_at < 0.1, f"noticed {noticed - killed_at:.3f}s after the kill"
    assert len(named(evs, "restart_scheduled")) == 1
    attempts = named(evs, "attempt_started")
    assert len(attempts) == 2 and attempts[1]["resume_step"] > 0
    loaded = [e for e in named(evs, "checkpoint_loaded") if e["attempt"] == 2]
    assert loaded and loaded[0]["resume_step"] > 0
    mttr = _timestamp(loaded[0]) - killed_at
    print(f"resumed {mttr:.2f}s after the kill")
    assert mttr < 4.0, f"resumed {mttr:.2f}s after the kill"
    assert named(evs, "job_succeeded")
    assert_same_state(load_final(reference_final), load_final(final))


def _parents(st: dict[str, Any]) -> list[str]:
    """The command lines of the ranks' parents, from a status."""
    parents = [psutil.Process(r["pid"]).parent() for r in st["ranks"]]
    return [" ".join(p.cmdline()) if p is not None else "" for p in parents]


def _timestamp(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(
        str(event["timestamp"]).replace("Z", "+00:00")
    ).timestamp()


@pytest.mark.serial  # "deterministic" needs the same ranks named each time: timing
def test_rank_raising_every_attempt_spends_budget_and_exits_3(tmp_path: Path) -> None:
    """A rank that raises at the same step in every attempt: budget spent -> exit 3, job_gave_up,
    and the failure is named deterministic."""
    job = write_job(
        tmp_path,
        env={"FAULT": "raise:1:3:*"},
        restart='max_restarts = 2\nbackoff = "0.1s"\nmax_no_progress = 10',
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 3, res.stderr
    evs = events(tmp_path / "run")
    assert [f["kind"] for f in named(evs, "failure_detected")] == ["crash"] * 3
    assert len(named(evs, "restart_scheduled")) == 2
    gave_up = named(evs, "job_gave_up")
    assert len(gave_up) == 1 and "budget spent" in gave_up[0]["reason"]
    assert "deterministic" in gave_up[0]["reason"]


def test_budget_is_counted_across_starts(tmp_path: Path) -> None:
    """max_restarts is for the whole job: a second `rvsup start` continues the count."""
    job = write_job(
        tmp_path,
        env={"FAULT": "raise:0:2:*"},
        restart='max_restarts = 1\nbackoff = "0.1s"\nmax_no_progress = 10',
    )
    assert rvsup("start", str(job), timeout=180).returncode == 3
    assert rvsup("start", str(job), timeout=180).returncode == 3
    evs = events(tmp_path / "run")
    assert len(named(evs, "restart_scheduled")) == 1  # the second start had nothing left
    assert [e["attempt"] for e in named(evs, "attempt_started")] == [1, 2, 3]


def test_torn_checkpoint_from_a_kill_during_save_is_never_loaded(
    tmp_path: Path, reference_final: Path
) -> None:
    """Rank 0 killed while writing a checkpoint: the torn one is never loaded; the result is still
    bit-identical."""
    final = tmp_path / "final.pt"
    job = write_job(tmp_path, env={"FINAL": str(final), "STEP_SLEEP": "0.05", "BALLAST_MB": "300"})
    ckpt = tmp_path / "ckpt"
    with running(job) as proc:
        st = wait_progress(job, min_step=12)
        rank0 = next(r for r in st["ranks"] if r["rank"] == 0)
        torn = wait_for(
            lambda: sorted(ckpt.glob(".tmp-step-*")),
            timeout=60,
            what="a save in progress",
            interval=0.002,
        )
        os.kill(rank0["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    evs = events(tmp_path / "run")
    torn_steps = {int(p.name.split("-")[2]) for p in torn}
    never_committed = {s for s in torn_steps if not named_commit(evs, s)}
    resumed = [e["resume_step"] for e in named(evs, "attempt_started")][1:]
    assert resumed and all(r - 1 not in never_committed for r in resumed), (torn, resumed)
    assert not list(ckpt.glob(".tmp-step-*")), "the torn directory was cleaned up"
    assert_same_state(load_final(reference_final), load_final(final))


def named_commit(evs: list[dict[str, object]], step: int) -> bool:
    return any(e["event"] == "checkpoint_committed" and e["step"] == step for e in evs)


@pytest.mark.serial  # "deterministic" needs the same ranks named each time: timing
def test_crash_loop_without_progress_gives_up_and_says_so(tmp_path: Path) -> None:
    """A rank raising in step 15 every attempt: the first attempt committed step 9, the next ones
    commit nothing new -> give up after max_no_progress restarts in a row, named deterministic at
    step 14, the last step it finished."""
    job = write_job(
        tmp_path,
        env={"FAULT": "raise:1:15:*"},
        restart='max_restarts = 10\nbackoff = "0.1s"\nmax_no_progress = 2',
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 3, res.stderr
    evs = events(tmp_path / "run")
    assert len(named(evs, "attempt_started")) == 3
    reason = named(evs, "job_gave_up")[0]["reason"]
    assert "no progress: 2 restarts in a row without a new checkpoint" in reason
    assert "deterministic: rank 1 fails at step 14 every time" in reason, reason


def test_preemption_is_not_charged_to_the_budget(tmp_path: Path) -> None:
    """max_restarts = 0: a SIGTERM stop and a fresh start still complete; nothing was charged."""
    slow = tmp_path / "slow"  # 0.5 s steps from step 6 (the stop lands mid-run), then none
    slow.touch()
    env = {"STEP_SLEEP": "0.05", "TAIL_FROM": "6", "TAIL_SLEEP": "0.5", "SLOW_WHILE": str(slow)}
    job = write_job(tmp_path, env=env, total=40, restart="max_restarts = 0")
    with running(job) as proc:
        wait_progress(job, min_step=5)
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 75
    slow.unlink()
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert not named(evs, "restart_scheduled") and named(evs, "job_succeeded")


@pytest.mark.serial  # "deterministic" needs the same ranks named each time: timing
def test_deterministic_failure_is_recognised_across_starts(tmp_path: Path) -> None:
    """A rank failing at the same step before and after a requeue (a second `rvsup start`) is
    named deterministic: the last charged failure is folded from the history, not kept in memory."""
    job = write_job(
        tmp_path,
        total=8,
        env={"FAULT": "raise:1:3:1,raise:1:3:2"},
        restart=(
            'max_restarts = 5\nfirst_backoff = "4s"\nbackoff = "4s"\nbackoff_max = "4s"\n'
            "max_no_progress = 10"
        ),
    )
    with running(job) as proc:
        wait_for(
            lambda: named(events(tmp_path / "run"), "restart_scheduled"),
            timeout=90,
            what="a restart",
        )
        os.kill(proc.pid, signal.SIGTERM)  # stop during the backoff, as a requeue would
        proc.communicate(timeout=30)
    assert proc.returncode == 75
    first = named(events(tmp_path / "run"), "restart_scheduled")
    assert [r["deterministic"] for r in first] == [False]
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert [r["deterministic"] for r in named(evs, "restart_scheduled")] == [False, True]
    assert [e["attempt"] for e in named(evs, "attempt_started")] == [1, 2, 3]
