"""supervisor.slurm against a real two-node Slurm cluster: detect() inside jobs, time left,
requeue, and the srun step built by srun_argv (one task per node, torn down everywhere)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.slurm import commands as slurm
from supervisor.slurm.srun import srun_argv
from tests.slurm.cluster import PAIR, SlurmCluster, read_env_file

pytestmark = pytest.mark.slurm

CHECKOUT = Path(__file__).resolve().parents[2]
# Prints detect() of the process it runs in as one JSON line.
DETECT_SNIPPET = (
    "import dataclasses, json; from supervisor.slurm import commands as slurm; "
    "print(json.dumps(dataclasses.asdict(slurm.detect())), flush=True)"
)


def _python_line(code: str) -> str:
    """A shell line that runs ``code`` with this test's Python and this checkout's packages."""
    python = shlex.quote(sys.executable)
    return f"PYTHONPATH={shlex.quote(str(CHECKOUT))} {python} -c {shlex.quote(code)}"


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def cancel_later(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Job ids appended here are cancelled, and waited for, after the test."""
    jobs: list[str] = []
    yield jobs
    for job in jobs:
        slurm_cluster.scancel(job)
    for job in jobs:
        slurm_cluster.wait_gone(job, timeout=30)


def test_detect_in_two_node_batch_job(
    slurm_cluster: SlurmCluster, tmp_path: Path, cancel_later: list[str]
) -> None:
    """In a 2-node batch script detect() sees both nodes, the job id, node1, no restarts."""
    out = tmp_path / "detect.jsonl"
    job = slurm_cluster.sbatch(
        f"#!/bin/bash\n{_python_line(DETECT_SNIPPET)} >> {out}\nsleep 300\n",
        "-N2",
        PAIR,
        "--ntasks-per-node=2",
        f"--output={tmp_path}/job.out",
    )
    cancel_later.append(job)
    _wait_for(lambda: len(_lines(out)) == 1, 30, "detect() output from the job")
    alloc = json.loads(_lines(out)[0])
    assert alloc == {
        "job_id": job,
        "nodes": ["node1", "node2"],
        "this_node": "node1",
        "gpus_per_node": None,
        "cpus_on_node": 2,
        "restart_count": 0,
    }


def test_requeue_restarts_job_with_restart_count_one(
    slurm_cluster: SlurmCluster, tmp_path: Path, cancel_later: list[str]
) -> None:
    """requeue() ends the running job and Slurm runs it again with SLURM_RESTART_COUNT=1."""
    out = tmp_path / "detect.jsonl"
    job = slurm_cluster.sbatch(
        f"#!/bin/bash\n{_python_line(DETECT_SNIPPET)} >> {out}\nsleep 300\n",
        "-N2",
        PAIR,
        "--requeue",
        f"--output={tmp_path}/job.out",
    )
    cancel_later.append(job)
    _wait_for(lambda: len(_lines(out)) == 1, 30, "first run of the job")
    assert json.loads(_lines(out)[0])["restart_count"] == 0
    slurm.requeue(job)
    _wait_for(lambda: len(_lines(out)) == 2, 60, "the requeued job running again")
    second = json.loads(_lines(out)[1])
    assert (second["job_id"], second["restart_count"]) == (job, 1)
    assert slurm_cluster.squeue_state(job) == "RUNNING"
    assert slurm.job_info(job)["Restarts"] == "1"


def test_requeue_of_unknown_job_raises_with_message(slurm_cluster: SlurmCluster) -> None:
    """A refused requeue raises SlurmError carrying scontrol's message, without retrying."""
    started = time.monotonic()
    with pytest.raises(slurm.SlurmError, match="Invalid job id") as raised:
        slurm.requeue("999999")
    assert not raised.value.transient
    assert time.monotonic() - started < 5


def test_time_left_of_five_minute_job(
    slurm_cluster: SlurmCluster, tmp_path: Path, cancel_later: list[str]
) -> None:
    """time_left_s() of a running job with --time=5 is about 300 s."""
    job = slurm_cluster.sbatch("#!/bin/bash\nsleep 300\n", "--time=5", "--output=/dev/null")
    cancel_later.append(job)
    slurm_cluster.wait_state(job, {"RUNNING"}, timeout=30)
    left = slurm.time_left_s(job)
    assert left is not None
    assert 240 <= left <= 300
    unlimited = slurm_cluster.sbatch("#!/bin/bash\nsleep 300\n", "--hold", "--output=/dev/null")
    cancel_later.append(unlimited)
    assert slurm.time_left_s(unlimited) is None  # the partition's MaxTime is INFINITE


@pytest.mark.parametrize(("flag", "expected"), [("--requeue", True), ("--no-requeue", False)])
def test_is_requeueable(
    slurm_cluster: SlurmCluster, cancel_later: list[str], flag: str, expected: bool
) -> None:
    """is_requeueable() follows sbatch --requeue / --no-requeue (read from job_info)."""
    job = slurm_cluster.sbatch("#!/bin/bash\nsleep 300\n", flag, "--hold", "--output=/dev/null")
    cancel_later.append(job)
    assert slurm.is_requeueable(job) is expected
    info = slurm.job_info(job)
    assert (info["JobId"], info["JobState"], info["BatchFlag"]) == (job, "PENDING", "1")


def test_srun_step_runs_one_task_per_node(
    slurm_cluster: SlurmCluster, tmp_path: Path, cancel_later: list[str]
) -> None:
    """srun_argv() from a batch script starts one task on each node with its own SLURM_NODEID,
    holding all of the job's CPUs and GPUs of that node (despite --gpus-per-task=1)."""
    report = "echo $SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID $SLURM_CPUS_ON_NODE"
    report += " $SLURM_GPUS_ON_NODE"
    code = (
        "import subprocess; from supervisor.slurm import commands as slurm, srun; "
        f"inner = ['bash', '-c', {report!r}]; "
        "argv = srun.srun_argv(slurm.detect(), inner, job_name='rvsup-test'); "
        "raise SystemExit(subprocess.run(argv).returncode)"
    )
    out = tmp_path / "step.out"
    job = slurm_cluster.sbatch(
        f"#!/bin/bash\n{_python_line(code)} > {out}\necho exit=$? >> {out}\n",
        "-N2",
        PAIR,
        "--ntasks-per-node=2",
        "--cpus-per-task=2",
        "--gpus-per-task=1",
        f"--output={tmp_path}/job.out",
    )
    cancel_later.append(job)
    slurm_cluster.wait_gone(job, timeout=60)
    lines = sorted(_lines(out))
    assert lines == ["exit=0", "node1 0 0 4 2", "node2 1 1 4 2"], (tmp_path / "job.out").read_text()


@pytest.fixture
def holder_job(
    slurm_cluster: SlurmCluster, tmp_path: Path, cancel_later: list[str]
) -> slurm.Allocation:
    """A running 2-node job whose batch environment is read back as an Allocation."""
    env_file = tmp_path / "batch.env"
    job = slurm_cluster.sbatch(
        f"#!/bin/bash\nenv -0 > {env_file}.part && mv {env_file}.part {env_file}\nsleep 300\n",
        "-N2",
        PAIR,
        "--output=/dev/null",
    )
    cancel_later.append(job)
    _wait_for(env_file.exists, 30, "the holder job's environment")
    alloc = slurm.detect(read_env_file(env_file))
    assert alloc is not None
    assert alloc.nodes == ("node1", "node2")
    return alloc


def _start_step(
    slurm_cluster: SlurmCluster, alloc: slurm.Allocation, tmp_path: Path, marker: str
) -> subprocess.Popen[bytes]:
    """Start srun_argv's step from here (inside the holder job); each task ignores SIGTERM,
    logs signals and reports itself; return once both tasks run."""
    task = (
        "import os, signal, sys, time\n"
        f"log = open(os.path.join({str(tmp_path)!r}, 'task' + os.environ['SLURM_NODEID']), 'a')\n"
        "def note(signum, frame):\n"
        "    log.write(f'signal {signum}\\n'); log.flush()\n"
        "signal.signal(signal.SIGTERM, note)\n"
        "log.write('started\\n'); log.flush()\n"
        "while True: time.sleep(0.05)\n"
    )
    inner = [sys.executable, "-c", task, marker]
    step_env = {**slurm_cluster.env, "SLURM_JOB_ID": alloc.job_id}
    srun = subprocess.Popen(
        srun_argv(alloc, inner, job_name="rvsup-test"),
        env=step_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_for(
        lambda: all("started" in _lines(tmp_path / f"task{n}") for n in (0, 1)),
        30,
        "both tasks of the step",
    )
    return srun


def _tasks_left(slurm_cluster: SlurmCluster, marker: str) -> list[str]:
    """Processes of the step still on any node: a scan of each node's namespace for the marker."""
    return [
        f"{node}:{pid}"
        for node in slurm_cluster.node_names
        for pid, cmdline in slurm_cluster.node_processes(node).items()
        if marker in cmdline
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_signal_to_srun_ends_step_on_every_node(
    slurm_cluster: SlurmCluster, holder_job: slurm.Allocation, tmp_path: Path, signum: int
) -> None:
    """SIGTERM or SIGKILL to srun leaves no task on any node, even tasks that ignore SIGTERM."""
    marker = f"rvsup-step-{uuid.uuid4().hex}"
    srun = _start_step(slurm_cluster, holder_job, tmp_path, marker)
    try:
        steps = slurm.step_ids(holder_job.job_id, "rvsup-test")
        assert len(steps) == 1
        # Slurm's own view: slurmd on each node lists the step's processes
        assert all(slurm_cluster.listpids(steps[0], node) for node in holder_job.nodes)
        assert len(_tasks_left(slurm_cluster, marker)) == 2
        os.kill(srun.pid, signum)
        srun.wait(timeout=15)
        _wait_for(lambda: not _tasks_left(slurm_cluster, marker), 10, "the tasks to end")
        _wait_for(lambda: not slurm.step_ids(holder_job.job_id, "rvsup-test"), 10, "step gone")
        assert [slurm_cluster.listpids(steps[0], node) for node in holder_job.nodes] == [[], []]
        # srun SIGKILLs its tasks: they never see the SIGTERM
        assert [_lines(tmp_path / f"task{n}") for n in (0, 1)] == [["started"], ["started"]]
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_signal_step_reaches_tasks_and_cancel_step_ends_them(
    slurm_cluster: SlurmCluster, holder_job: slurm.Allocation, tmp_path: Path
) -> None:
    """signal_step(TERM) reaches the task on every node without ending the step;
    cancel_step() then ends it on every node."""
    marker = f"rvsup-step-{uuid.uuid4().hex}"
    srun = _start_step(slurm_cluster, holder_job, tmp_path, marker)
    try:
        (step,) = slurm.step_ids(holder_job.job_id, "rvsup-test")
        slurm.signal_step(step, "TERM")
        expected = ["started", f"signal {int(signal.SIGTERM)}"]
        _wait_for(
            lambda: all(_lines(tmp_path / f"task{n}") == expected for n in (0, 1)),
            10,
            "SIGTERM noted by both tasks",
        )
        assert len(_tasks_left(slurm_cluster, marker)) == 2
        assert srun.poll() is None
        slurm.cancel_step(step)
        srun.wait(timeout=15)
        _wait_for(lambda: not _tasks_left(slurm_cluster, marker), 10, "the tasks to end")
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
