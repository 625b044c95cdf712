"""Stragglers named, with real torchrun (2 gloo ranks; DDP, FSDP1, FSDP2): a rank slowed on
purpose (a sleep inside its forward) is named within 60 s of the onset, on its node, and shown by
``rvsup status``; a job whose ranks are all equally slow, and a normal one, name none."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

from tests.helpers.harness import TRAINER, events, named, running, rvsup, wait_for, write_job

# serial: a rank named within 60 s; the time it loses per step is measured
pytestmark = [pytest.mark.process, pytest.mark.serial]

WORKER = Path(__file__).parents[1] / "helpers" / "straggler_worker.py"
HEARTBEAT = 'interval = "0.2s"\nstartup_timeout = "60s"'


def _job(tmp_path: Path, env: dict[str, str], health: str = "") -> Path:
    job = write_job(tmp_path, env=env, heartbeat=HEARTBEAT, checkpoint="every_steps = 0")
    text = job.read_text().replace(json.dumps(str(TRAINER)), json.dumps(str(WORKER)))
    job.write_text(text + (f"\n[health]\n{health}\n" if health else ""))
    return job


def _wall(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


# DDP (its reducer's reading) and FSDP2 (the collective timer); FSDP1 gets the same timer, which
# tests/worker_sdk/runtime/test_collective_wait.py shows it gets and reads
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_a_slowed_rank_is_named_within_60s(tmp_path: Path, kind: str) -> None:
    """From 4 s into the training rank 1 sleeps 60 ms more than rank 0 in each step's forward
    (every rank sleeps 20 ms): straggler_detected names rank 1 and this host, within 60 s of
    the onset (the latency is printed), never before it, at least 1.5x slower, the others
    waiting 10-80 ms of each step for it; with exclude_stragglers the event says the node is to
    be excluded and ``rvsup status`` shows both; the job goes on and succeeds (ended once seen)."""
    onset_file = tmp_path / "onset"
    env = {
        "KIND": kind,
        "DURATION_S": "18",
        "STEP_SLEEP": "0.02",
        "SLOW_RANK": "1",
        "SLOW_FROM_S": "4",
        "SLOW_S": "0.06",
        "ONSET_FILE": str(onset_file),
        "END_FILE": str(tmp_path / "end"),
    }
    job = _job(tmp_path, env, "exclude_stragglers = true")
    with running(job) as proc:
        found = wait_for(
            lambda: named(events(tmp_path / "run"), "straggler_detected"),
            timeout=70,
            what="straggler_detected",
            interval=0.2,
        )
        shown = rvsup("status", str(job), timeout=20)
        (tmp_path / "end").touch()  # nothing more to see: the training ends
        assert proc.wait(timeout=60) == 0
    assert len(found) == 1, found
    event = found[0]
    onset = float(onset_file.read_text())
    latency = _wall(event["timestamp"]) - onset
    print(f"{kind}: straggler detection latency: {latency:.1f} s; {event}", file=sys.stderr)
    assert 0 < latency <= 60, (latency, event)
    assert event["rank"] == 1 and event["node"], event
    assert event["exclude_node"] is True and event["slower"] >= 1.5, event
    assert 0.01 <= event["lost_per_step_s"] <= 0.08 and event["step_s"] >= 0.02, event
    assert event["lost_s"] >= 10 * event["lost_per_step_s"], event  # many steps in the window
    assert shown.returncode == 0, shown.stderr
    assert f"straggler: rank 1 on {event['node']}" in shown.stdout, shown.stdout
    assert f"excluded at the next restart: {event['node']}" in shown.stdout, shown.stdout
    evs = events(tmp_path / "run")
    assert len(named(evs, "straggler_detected")) == 1 and named(evs, "job_succeeded")


# Each timer (DDP's reducer, FSDP's wrapped collectives) names nobody where nobody is slow: DDP
# in a normal job, FSDP2 in a uniformly slow one (the judgment reads waits, whichever timer
# measured them; a normal FSDP2 job, which waits less, adds no path). FSDP1's timer is FSDP2's
# wrappers (the slowed case above measures it), and a uniformly slow DDP job adds no path.
@pytest.mark.parametrize(
    ("kind", "step_sleep"),
    [("ddp", "0"), ("fsdp2", "0.05")],
    ids=["ddp-normal", "fsdp2-uniformly-slow"],
)
def test_no_straggler_is_named(tmp_path: Path, kind: str, step_sleep: str) -> None:
    """Every rank sleeps 50 ms in each step's forward (a uniformly slow job), or none sleeps:
    over 15 s, no rank is named a straggler, and the job succeeds."""
    job = _job(tmp_path, {"KIND": kind, "DURATION_S": "15", "STEP_SLEEP": step_sleep})
    res = rvsup("start", str(job), timeout=90)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    assert named(evs, "job_succeeded")
    assert not named(evs, "straggler_detected"), named(evs, "straggler_detected")
