"""Nothing outlives its attempt: what a rank starts ends with the attempt, forked ranks or cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import marked_processes
from tests.helpers.harness import (
    TRAINER,
    events,
    named,
    running,
    rvsup,
    rvsup_env,
    wait_for,
    wait_progress,
    write_job,
)
from tests.helpers.spawning_worker import marked, still_running

# kills daemons and checks what they left
pytestmark = [pytest.mark.process, pytest.mark.kills_daemon]
WORKER = TRAINER.with_name("spawning_worker.py")


def _spawning_job(
    tmp: Path, mark: str, out: Path, *, total: int, zygote: bool, kill_at: int = -1
) -> Path:
    """A job.toml running spawning_worker.py on 2 ranks."""
    job = write_job(
        tmp,
        total=total,
        env={"SPAWN_MARK": mark, "SPAWN_DIR": str(out), "KILL_AT": str(kill_at)},
        launch=f'term_timeout = "3s"\nzygote = {"true" if zygote else "false"}',
    )
    text = job.read_text().replace(json.dumps(str(TRAINER)), json.dumps(str(WORKER)))
    job.write_text(text)
    return job


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "cold"])
def test_nothing_a_rank_starts_outlives_its_attempt(tmp_path: Path, zygote: bool) -> None:
    """Every rank starts a child, a grandchild in a new session, a double-forked daemon and
    DataLoader workers (persistent and not); rank 1 is killed with SIGKILL at step 5 of attempt
    1, attempt 2 finishes: none of attempt 1's processes exists at attempt 2's first step, none
    of any attempt's after ``rvsup start`` returns, and the history counts what was ended."""
    mark = f"spawn-{uuid.uuid4().hex}"
    out = tmp_path / "spawned"
    out.mkdir()
    job = _spawning_job(tmp_path, mark, out, total=20, zygote=zygote, kill_at=5)
    res = rvsup("start", str(job), timeout=240)
    left = marked(mark)
    workers = [line for path in out.glob("workers-a*") for line in still_running(path)]
    assert res.returncode == 0, res.stdout + res.stderr
    alive_before = json.loads((out / "alive-before-a2.json").read_text())
    assert (alive_before, left, workers) == ([], {}, [])
    evs = events(tmp_path / "run")
    started = named(evs, "job_started")[-1]
    assert started["containment"].startswith("cgroup v2"), started
    ended = {e["attempt"]: e for e in named(evs, "processes_ended") if e["scope"] == "attempt"}
    assert set(ended) == {1, 2}
    # attempt 1: the helpers (a child, a setsid grandchild, a daemon) and 2 DataLoader workers
    # of each rank, the surviving rank, torchrun (and, forked, the ranks' clients)
    assert ended[1]["ended"] >= 12, ended[1]
    assert not named(evs, "processes_left")
    assert evs[-1]["event"] == "job_succeeded"  # nothing was left for the job's end


def test_what_a_killed_rvsup_left_ends_at_the_next_start(tmp_path: Path) -> None:
    """rvsup is killed with SIGKILL while its ranks' helpers run (the ranks die with it; their
    children, setsid grandchildren and double-forked daemons outlive it, re-parented to init):
    the next ``rvsup start`` ends them before its first attempt's first step, and says so
    (``processes_ended``, scope previous). While it trained, with ranks forked from the zygote,
    the suite's leftover guard found the zygote and every rank, though a forked rank shows the
    zygote's environment."""
    mark = f"spawn-{uuid.uuid4().hex}"
    out = tmp_path / "spawned"
    out.mkdir()
    job = _spawning_job(tmp_path, mark, out, total=400, zygote=True)
    with running(job) as proc:
        ranks = [r["pid"] for r in wait_progress(job, min_step=11)["ranks"]]  # saved at 9
        parents = {psutil.Process(pid).parent() for pid in ranks}
        assert len(parents) == 1
        zygote = parents.pop()
        assert zygote is not None and "worker_sdk.spawn.zygote" in " ".join(zygote.cmdline())
        assert {zygote.pid, *ranks} <= set(marked_processes(exempt_daemons=True))
        proc.kill()
        proc.wait()
        wait_for(
            lambda: not any(psutil.pid_exists(pid) for pid in ranks),
            timeout=20,
            what="the ranks to die with rvsup",
        )
        survivors = sorted(label.split("-")[1] for label in marked(mark).values())
    assert survivors == ["child", "child", "daemon", "daemon", "setsid", "setsid"]
    job.write_text(job.read_text().replace('TOTAL_STEPS = "400"', 'TOTAL_STEPS = "14"'))
    res = rvsup("start", str(job), timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((out / "alive-before-a2.json").read_text()) == []
    assert marked(mark) == {}
    previous = [
        e for e in named(events(tmp_path / "run"), "processes_ended") if e["scope"] == "previous"
    ]
    assert len(previous) == 1 and previous[0]["ended"] >= 6, previous


def test_a_node_group_ends_what_its_command_left(tmp_path: Path) -> None:
    """What srun runs on each node of a multi-node attempt (``worker_sdk.spawn.node_group``) runs
    torchrun in a group of its own: once the command has ended, its child, setsid grandchild
    and double-forked daemon are gone and it ends like the command; what a wrapper killed with
    SIGKILL left is ended by the next one on the node."""
    mark = f"spawn-{uuid.uuid4().hex}"
    wrapper = [sys.executable, "-m", "worker_sdk.spawn.node_group", "2"]

    def command(then: str) -> list[str]:
        code = (
            f"import os, sys, time; sys.path[:0] = [{str(WORKER.parent)!r}]\n"
            f"from spawning_worker import spawn_helpers; spawn_helpers({mark!r}, 'a1r0')\n"
            f"{then}\n"
        )
        return [sys.executable, "-c", code]

    env = {**rvsup_env(), "SPAWN_DIR": str(tmp_path)}
    ended = subprocess.run([*wrapper, *command("os._exit(3)")], env=env, timeout=120, check=False)
    assert (ended.returncode, marked(mark)) == (3, {})
    with subprocess.Popen([*wrapper, *command("time.sleep(300)")], env=env) as proc:
        wrapper_sid = os.getsid(proc.pid)

        def settled() -> bool:
            """The three helpers, the daemon's double fork done: a process that carries the
            mark in its own session, not its leader (the fork's first two carry it too)."""
            found = marked(mark)
            daemons = [pid for pid, label in found.items() if label.endswith("-daemon")]
            if len(found) != 3 or len(daemons) != 1:
                return False
            try:
                sid = os.getsid(daemons[0])
            except ProcessLookupError:
                return False
            return sid not in (daemons[0], wrapper_sid)

        wait_for(settled, timeout=60, what="the helpers")
        proc.kill()
    wait_for(lambda: not psutil.pid_exists(proc.pid), timeout=10, what="the wrapper's end")
    assert len(marked(mark)) == 3  # they outlive a wrapper killed with SIGKILL
    again = subprocess.run([*wrapper, "true"], env=env, timeout=60, check=False)
    assert (again.returncode, marked(mark)) == (0, {})
