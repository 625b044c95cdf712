"""The leftover guard of the suite and of the chaos runner sees every process a test started:
leaks made on purpose are reported and ended by the same code the guards run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest

from tests.chaos.execute import Observed, guarded_run
from tests.helpers.harness import TRAINER, running, wait_for, wait_progress, write_job
from tests.helpers.process_guard import guard
from tests.helpers.spawning_worker import marked

pytestmark = pytest.mark.process

WORKER = Path(__file__).parent / "helpers" / "spawning_worker.py"

# forks; the child starts a session of its own and forks again; the grandchild replaces itself
# with a sleeper whose environment is empty (no marker) and says its pid; both parents exit
_ESCAPE = textwrap.dedent(
    """
    import os, sys
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
    os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"], {})
    """
)


def _leak_an_escaped_process(tmp_path: Path) -> int:
    """A double-forked, ``setsid()``-ed sleeper with an empty environment; its pid."""
    pid_file = tmp_path / f"escaped-{uuid.uuid4().hex}"
    subprocess.run([sys.executable, "-c", _ESCAPE, str(pid_file)], check=True, timeout=30)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=10, what="pid"))
    wait_for(lambda: psutil.Process(pid).environ() == {}, timeout=10, what="the exec")
    assert os.getsid(pid) != os.getsid(0), "it left our session"
    assert psutil.Process(pid).ppid() == os.getpid(), "orphaned, it was re-parented to us"
    return pid


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_the_suite_guard_finds_and_ends_a_double_forked_setsid_process(tmp_path: Path) -> None:
    """A process that double-forked, left the session and cleared its environment (no marker)
    is among what the suite's guard reports after a test, and the guard kills it."""
    before = set(guard().processes(exempt=True))
    leaked = _leak_an_escaped_process(tmp_path)
    left = guard().check(before, grace_s=0.0)
    assert set(left) == {leaked}, left
    assert _gone(leaked)


def test_the_chaos_runner_finds_and_ends_what_a_run_leaves(tmp_path: Path) -> None:
    """The chaos runner's check after a run reports an escaped process of the run among its
    leftovers (a violation of the run) and kills it."""
    seen = Observed()
    with guarded_run(seen):
        leaked = _leak_an_escaped_process(tmp_path)
    assert [line.split()[0] for line in seen.leftovers] == [str(leaked)], seen.leftovers
    assert _gone(leaked)


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
        wait_for(lambda: all(_gone(pid) for pid in ranks), timeout=20, what="the ranks' end")
        helpers = set(marked(mark))
        assert len(helpers) == 6, marked(mark)
        left = guard().check(before, grace_s=0.0)
    assert helpers <= set(left), left
    assert all(_gone(pid) for pid in helpers)
