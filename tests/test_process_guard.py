"""The leftover guard of the suite and of the chaos runner sees every process a test started:
leaks made on purpose are reported and ended by the same code the guards run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from tests.chaos.execute import Observed, guarded_run
from tests.helpers.cgroup_scope import PREFIX
from tests.helpers.escape import gone, leak_an_escaped_process
from tests.helpers.harness import TRAINER, running, rvsup, wait_for, wait_progress, write_job
from tests.helpers.process_guard import guard
from tests.helpers.spawning_worker import marked
from worker_sdk.spawn.cgroup import own_group_dir

pytestmark = pytest.mark.process

WORKER = Path(__file__).parent / "helpers" / "spawning_worker.py"
PROBE = Path(__file__).parent / "helpers" / "guard_probe.py"


def test_the_suite_guard_finds_and_ends_a_double_forked_setsid_process(tmp_path: Path) -> None:
    """A process that double-forked, left the session and cleared its environment (no marker)
    is among what the suite's guard reports after a test, and the guard kills it."""
    before = set(guard().processes(exempt=True))
    leaked = leak_an_escaped_process(tmp_path)
    left = guard().check(before, grace_s=0.0)
    assert set(left) == {leaked}, left
    assert gone(leaked)


def test_the_chaos_runner_finds_and_ends_what_a_run_leaves(tmp_path: Path) -> None:
    """The chaos runner's check after a run reports an escaped process of the run among its
    leftovers (a violation of the run) and kills it."""
    seen = Observed()
    with guarded_run(seen):
        leaked = leak_an_escaped_process(tmp_path)
    assert [line.split()[0] for line in seen.leftovers] == [str(leaked)], seen.leftovers
    assert gone(leaked)


@pytest.mark.kills_daemon
def test_the_suite_guard_finds_what_a_forked_rank_leaked(tmp_path: Path) -> None:
    """A real job, its ranks forked from the zygote; each rank starts a child, a ``setsid()``
    grandchild and a double-forked daemon; rvsup is killed with SIGKILL, so nothing ends them:
    the ranks die with it, the six helpers outlive it, and the guard reports and ends all six."""
    mark = f"spawn-{uuid.uuid4().hex}"
    out = tmp_path / "spawned"
    out.mkdir()
    job = write_job(
        tmp_path,
        total=400,
        env={"SPAWN_MARK": mark, "SPAWN_DIR": str(out)},
        launch='term_timeout = "3s"\nzygote = true',
    )
    job.write_text(job.read_text().replace(json.dumps(str(TRAINER)), json.dumps(str(WORKER))))
    before = set(guard().processes(exempt=True))
    with running(job) as proc:
        ranks = [r["pid"] for r in wait_progress(job, min_step=2)["ranks"]]
        (zygote,) = {psutil.Process(pid).ppid() for pid in ranks}
        assert "zygote" in " ".join(psutil.Process(zygote).cmdline())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: all(gone(pid) for pid in ranks), timeout=20, what="the ranks' end")
        helpers = set(marked(mark))
        assert len(helpers) == 6, marked(mark)
        left = guard().check(before, grace_s=0.0)
    assert helpers <= set(left), left
    assert all(gone(pid) for pid in helpers)


def test_under_xdist_each_worker_guards_its_own_tests(tmp_path: Path) -> None:
    """tests/helpers/guard_probe.py on two xdist workers: the check after a test that leaked
    fails that test and ends only its leak, while the other worker's test holds a process of its
    own through it; a leak left to the end of the session by a test that is not checked after
    it is found by its worker's last check and fails the run, which names it."""
    here = tmp_path / "meet"
    here.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env["RVTEST_PROBE_DIR"] = str(here)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-rA"]
    argv += [f"--basetemp={tmp_path / 'basetemp'}", str(PROBE)]
    done = subprocess.run(
        argv, cwd=PROBE.parents[2], env=env, capture_output=True, text=True, timeout=300
    )
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "3 passed, 1 error" in out, out  # the leak fails the check after its test
    errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1 and "::test_leaks_a_process " in errors[0], out
    leaked = int((here / "leaked.pid").read_text())
    assert f"test left 1 process(es) behind: {{{leaked}: " in out, out
    last = int((here / "left-to-the-end.pid").read_text())
    assert f"rvsup test suite: killed 1 leftover process(es): {{{last}: " in out, out
    assert gone(leaked) and gone(last)


def test_a_start_ends_the_groups_of_dead_daemons_of_its_own_pytest_process_only(
    tmp_path: Path,
) -> None:
    """This pytest process is in a cgroup of its own (tests/helpers/cgroup_scope.py). A job
    started here removes the group a dead daemon left in it, and leaves alone the one a dead
    daemon left in another pytest process's group (another xdist worker, whose test may still
    be looking at it)."""
    own = own_group_dir()
    if own is None or not os.access(own, os.W_OK):
        pytest.skip("no cgroup v2 group this process may make groups in")
    assert Path(own).name == f"{PREFIX}{os.getpid()}"
    dead = subprocess.Popen(["true"])
    dead.wait()
    with subprocess.Popen(["sleep", "60"]) as other:  # stands for the other worker, alive
        try:
            sibling = Path(own).parent / f"{PREFIX}{other.pid}"
            (sibling / f"rvsup-{dead.pid}").mkdir(parents=True)
            mine = Path(own) / f"rvsup-{dead.pid}"
            mine.mkdir()
            res = rvsup("start", str(write_job(tmp_path, total=3)), timeout=120)
            assert res.returncode == 0, res.stdout + res.stderr
            assert not mine.exists()
            assert (sibling / f"rvsup-{dead.pid}").is_dir()
        finally:
            other.kill()
            for group in (sibling / f"rvsup-{dead.pid}", sibling):
                if group.is_dir():
                    group.rmdir()
