"""A real Slurm cluster for the tests: slurmctld plus N slurmd, each node its own machine-like
network namespace (node1.., 10.200.0.11..), brought up in well under a second.

Usage. The ``slurm_cluster`` fixture (tests/slurm/conftest.py) starts one cluster per test
session and always tears it down; tests marked ``slurm`` take it as an argument::

    def test_something(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
        job = slurm_cluster.sbatch("#!/bin/bash\\nsleep 60\\n", "-N2", f"--output={tmp_path}/out")
        slurm_cluster.wait_state(job, {"RUNNING"}, timeout=30)
        slurm_cluster.scancel(job)
        slurm_cluster.wait_gone(job, timeout=30)

Requirements: root (namespaces, slurmd), Debian 12; testbed/up.sh installs slurm-wlm and munge
with apt-get when they are missing (seconds). ``RVSUP_SKIP_SLURM=1`` skips these tests. Run
them with ``pytest -m slurm tests/slurm``.

By hand (the same scripts, same settings as environment variables)::

    tests/slurm/testbed/up.sh        # prints: export SLURM_CONF=/tmp/rvsup-slurm/conf/slurm.conf
    export SLURM_CONF=/tmp/rvsup-slurm/conf/slurm.conf
    srun -N2 hostname; sbatch -N2 --wrap 'srun hostname'; squeue
    tests/slurm/testbed/down.sh      # always: it stops every daemon and job process

The cluster: nodes node1..N (3: the tests' jobs run on node1 and node2 by ``PAIR``, node3 is the
spare a job restarts on after losing a node) with NODE_CPUS (4) CPUs and NODE_GPUS (2) GPUs each (GPUs are
bookkeeping only, no devices), one partition ``debug``, KillWait 5 s, munge credentials that
expire after 5 s (a requeued job runs again after ~8 s), no accounting database (``sacct -c``
reads finished jobs from the completion log). Jobs run as root and see the same file system as
the tests, so job scripts may use tmp_path and ``sys.executable``. The batch script runs on the
first node of its job, inside that node's namespaces.

Facts worth knowing (Slurm 22.05): a signal sent to a PENDING job is lost (wait for RUNNING);
``scancel --batch -s SIG`` reaches only the batch shell, ``scancel -s SIG`` every step task but
not the batch shell, ``scancel --full -s SIG`` all; plain scancel, the time limit and
``scontrol requeue`` send SIGTERM to everything and SIGKILL after KillWait; srun answers
SIGTERM by SIGKILLing its tasks. Only one cluster can run on a machine at a time (fixed
namespace names, ports and node names); :meth:`SlurmCluster.up` takes a machine-wide lock.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Final

TESTBED: Final = Path(__file__).resolve().parent / "testbed"
#: Where the cluster keeps configuration, state and logs; fixed, so that a run killed half-way
#: is cleaned up by the next one.
DEFAULT_BASE_DIR: Final = Path(tempfile.gettempdir()) / "rvsup-slurm"
_LOCK_PATH: Final = Path(tempfile.gettempdir()) / "rvsup-slurm.lock"
_POLL_S: Final = 0.1
#: ``--nodelist`` of the tests' two-node jobs: node1 and node2 whatever else is busy or down.
PAIR: Final = "--nodelist=node1,node2"


class SlurmCluster:
    """Start, use and stop the test cluster (see the module docstring)."""

    def __init__(
        self,
        base_dir: Path = DEFAULT_BASE_DIR,
        *,
        nodes: int = 3,
        node_cpus: int = 4,
        node_gpus: int = 2,
        kill_wait_s: int = 5,
    ) -> None:
        self.base_dir = base_dir
        self.node_names = tuple(f"node{index}" for index in range(1, nodes + 1))
        self._settings = {
            "SLURM_CI_DIR": str(base_dir),
            "NNODES": str(nodes),
            "NODE_CPUS": str(node_cpus),
            "NODE_GPUS": str(node_gpus),
            "KILLWAIT": str(kill_wait_s),
        }
        self._lock: IO[bytes] | None = None
        self._jobs_written = 0

    @property
    def slurm_conf(self) -> Path:
        return self.base_dir / "conf" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus SLURM_CONF: what Slurm clients need."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    def up(self, *, lock_timeout_s: float = 120.0) -> None:
        """Take the machine-wide lock, then start the cluster (installing Slurm if needed)."""
        self._acquire_lock(lock_timeout_s)
        done = subprocess.run(
            [str(TESTBED / "up.sh")],
            env={**os.environ, **self._settings},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"up.sh failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        last = done.stdout.strip().splitlines()[-1]
        if last != f"export SLURM_CONF={self.slurm_conf}":
            raise RuntimeError(f"unexpected last line from up.sh: {last!r}")

    def down(self) -> None:
        """Stop every daemon and job process, remove namespaces; release the lock."""
        try:
            subprocess.run(
                [str(TESTBED / "down.sh")],
                env={**os.environ, **self._settings},
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        finally:
            if self._lock is not None:
                self._lock.close()  # closing releases the flock
                self._lock = None

    def _acquire_lock(self, timeout_s: float) -> None:
        lock = _LOCK_PATH.open("ab")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.close()
                    raise TimeoutError(
                        f"another test run holds {_LOCK_PATH} (its Slurm cluster) for "
                        f"{timeout_s:g} s"
                    ) from None
                time.sleep(0.5)
            else:
                self._lock = lock
                return

    def leftovers(self) -> list[str]:
        """What of the cluster still exists: namespaces, bridge, daemons (empty after down())."""
        found: list[str] = []
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
        names = [line.split()[0] for line in netns.stdout.splitlines() if line.strip()]
        found += [f"namespace {name}" for name in names if name.startswith("rvsns")]
        if Path("/sys/class/net/rvsbr0").exists():
            found.append("bridge rvsbr0")
        for pid_file in (
            self.base_dir / "run" / "slurmctld.pid",
            self.base_dir / "munge" / "munged.pid",
        ):
            if pid_file.exists() and _alive(int(pid_file.read_text().strip() or 0)):
                found.append(f"daemon from {pid_file}")
        return found

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def sbatch(self, script_text: str, *args: str) -> str:
        """Submit ``script_text`` as a batch script with sbatch ``args``; return the job id."""
        jobs = self.base_dir / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        self._jobs_written += 1
        script = jobs / f"job-{os.getpid()}-{self._jobs_written}.sh"
        script.write_text(script_text)
        out = self.run("sbatch", "--parsable", *args, str(script)).stdout
        return out.strip().split(";")[0]

    def squeue_state(self, job_id: str) -> str | None:
        """The job's state (RUNNING, PENDING, COMPLETED, ...); None once Slurm forgot it."""
        done = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False)
        state = done.stdout.strip()
        return state or None

    def wait_state(self, job_id: str, states: Collection[str], timeout: float) -> str:
        """Poll until the job is in one of ``states``; return it, or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.squeue_state(job_id)
            if state is not None and state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} is {state}, not in {sorted(states)} ({timeout} s)"
                )
            time.sleep(_POLL_S)

    def wait_gone(self, job_id: str, timeout: float) -> None:
        """Poll until the job is neither pending, running nor completing."""
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still in the queue after {timeout} s")
            time.sleep(_POLL_S)

    def scancel(self, job_id: str, *args: str) -> None:
        """scancel ``args`` ``job_id`` (a job or a JOB.STEP)."""
        self.run("scancel", *args, job_id)

    def node_processes(self, node: str) -> dict[int, str]:
        """pid -> command line of every live process on ``node`` (in its network namespace)."""
        namespace = f"rvsns{self.node_names.index(node) + 1}"
        out = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True
        ).stdout
        processes: dict[int, str] = {}
        for pid in map(int, out.split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
            if cmdline and _alive(pid):
                processes[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        return processes

    def listpids(self, job_or_step: str, node: str) -> list[int]:
        """PIDs slurmd's ``scontrol listpids`` reports for a job or step on ``node``."""
        done = self.run("scontrol", "listpids", job_or_step, node, check=False)
        return [int(line.split()[0]) for line in done.stdout.splitlines()[1:] if line.strip()]


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (this machine's init may never reap them)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return pid > 0 and stat.rpartition(")")[2].split()[0] != "Z"


def read_env_file(path: Path) -> Mapping[str, str]:
    """Parse the NUL-separated output of ``env -0`` (a job's environment, saved to a file)."""
    pairs = (item.partition("=") for item in path.read_text().split("\0") if "=" in item)
    return {key: value for key, _, value in pairs}
