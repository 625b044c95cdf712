"""Busy is not hung: a rank that works outside collectives for longer than the hang timeout, while
the others wait for it, is a slow phase (recorded), not a hang; a busy loop is one at
hang_timeout_max, a rank asleep forever at hang_timeout_idle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.harness import events, named, rvsup, write_job
from tests.helpers.states import assert_same_state, load_final

# serial: a phase's length and the detection time are bounded in seconds
pytestmark = [pytest.mark.process, pytest.mark.serial]

AUTO = 'interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "auto"'


@pytest.mark.parametrize(
    ("kind", "eval_s", "zygote", "doing"),
    [
        ("eval", 8, "true", "rank 0 is working (trainer.py:"),
        ("eval", 15, "false", "rank 0 is working (trainer.py:"),
        ("threadwait", 12, "true", "rank 0 is waiting on a thread of its own (trainer.py:"),
    ],
    ids=["8s-forked-ranks", "15s-cold-ranks", "12s-on-a-thread"],
)
def test_rank_zero_evaluating_alone_is_not_a_hang(
    tmp_path: Path, reference_final: Path, kind: str, eval_s: int, zygote: str, doing: str
) -> None:
    """Rank 0 alone evaluates for 8 s (ranks forked from the zygote) or 15 s (cold ranks), or
    waits 12 s on the future of a thread of its own that sleeps (an upload, a logger's flush),
    at step 20, without worker_sdk.phase(), under the automatic 5 s timeout; rank 1 waits for it
    in the next all-reduce. No failure, one attempt, one slow_phase event naming rank 0, what it
    does and where, with the phase's length and the phase() hint, and the final weights are
    bit-identical to a run without it."""
    final = tmp_path / "final.pt"
    job = write_job(
        tmp_path,
        env={"FAULT": f"{kind}:0:20", "EVAL_S": str(eval_s), "FINAL": str(final)},
        heartbeat=AUTO,
        launch=f'term_timeout = "3s"\nstop_timeout = "30s"\nzygote = {zygote}',
    )
    res = rvsup("start", str(job), timeout=120 + eval_s)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert not named(evs, "failure_detected"), named(evs, "failure_detected")
    assert len(named(evs, "attempt_started")) == 1
    slow = named(evs, "slow_phase")
    assert len(slow) == 1, slow
    phase = slow[0]
    assert phase["ranks"] == [0] and phase["finished"] is True, phase
    assert "in evaluate" in phase["where"] or kind != "eval", phase
    assert doing in phase["detail"], phase
    assert eval_s - 1 <= phase["seconds"] <= eval_s + 5, phase
    assert "rank 1 waits for it" in phase["detail"], phase
    assert "worker_sdk.phase" in phase["hint"], phase
    assert named(evs, "job_succeeded")
    assert_same_state(load_final(reference_final), load_final(final))


@pytest.mark.parametrize(
    ("fault", "bounds", "declared_s", "says"),
    [
        ("spin:1:12:1", 'hang_timeout_max = "12s"', 12.0, "ran for hang_timeout_max (12s)"),
        (
            "sleep:1:12:1",
            'hang_timeout_max = "60s"\nhang_timeout_idle = "8s"',
            8.0,
            "for hang_timeout_idle (8s)",
        ),
    ],
    ids=["busy-loop-at-max", "asleep-at-idle"],
)
def test_a_silence_that_never_ends_is_a_hang_at_its_bound(
    tmp_path: Path, fault: str, bounds: str, declared_s: float, says: str
) -> None:
    """Rank 1 never finishes a step, outside any collective: it spins in an infinite loop (it
    works), or sleeps forever (its own wait, no CPU: a wait on a dead service looks the same).
    The automatic 5 s timeout does not end either; the busy loop is declared a hang at
    hang_timeout_max (12 s here), the sleep at hang_timeout_idle (8 s, hang_timeout_max 60 s),
    + 1 s at the latest, rank 1 named first and the bound said, one unfinished slow_phase; the
    restarted job completes."""
    job = write_job(
        tmp_path,
        env={"FAULT": fault, "STEP_SLEEP": "0.02"},
        total=40,
        heartbeat=f"{AUTO}\n{bounds}",
        restart='max_restarts = 1\nbackoff = "0.1s"',
    )
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    hangs = named(evs, "failure_detected")
    assert [f["kind"] for f in hangs] == ["hang"], hangs
    hang = hangs[0]
    assert declared_s <= hang["detect_s"] <= declared_s + 1.0, hang
    assert hang["ranks"][0] == 1, hang
    assert says in hang["detail"], hang
    slow = named(evs, "slow_phase")
    assert len(slow) == 1 and slow[0]["ranks"] == [1] and slow[0]["finished"] is False, slow
    assert named(evs, "job_succeeded")
