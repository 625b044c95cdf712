"""rvsup jobs for the Slurm cluster tests: the process tests' trainer as a multi-node job.toml,
submitted with the batch script of examples/slurm (its venv and job file lines substituted).

A :class:`TrainerJob` is one directory: ``job.toml``, ``run/`` (the history), ``ckpt/``,
``final.pt`` (rank 0's final model and optimizer) and ``job.out`` (the batch output, appended to
by every allocation of a requeued job).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from tests.helpers.harness import TRAINER, events, status
from tests.helpers.jobs import write_job_file
from tests.slurm.cluster import PAIR, SlurmCluster

CHECKOUT: Final = Path(__file__).resolve().parents[2]
EXAMPLE_SCRIPT: Final = CHECKOUT / "examples" / "slurm" / "train.sbatch"
#: The two lines of the example that name the virtualenv and the job file.
_VENV_LINE: Final = re.compile(r"^RVSUP_VENV=.*$", re.MULTILINE)
_JOB_LINE: Final = re.compile(r"^JOB_TOML=.*$", re.MULTILINE)
_SHELL_START: Final = re.compile(r"^set -eu$", re.MULTILINE)
_POLL_S: Final = 0.2
REFERENCE_STEPS: Final = 60  # the uninterrupted job's (conftest.py, ``reference``)
NODELIST: Final = re.compile(r"--nodelist=(\S+)")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TrainerJob:
    """One rvsup job of the fault-switch trainer, and where its results land."""

    root: Path
    name: str

    @property
    def job_toml(self) -> Path:
        return self.root / "job.toml"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def final(self) -> Path:
        return self.root / "final.pt"

    @property
    def output(self) -> Path:
        return self.root / "job.out"

    def events(self) -> list[dict[str, Any]]:
        """The job's history so far (every allocation's)."""
        return events(self.run_dir)

    def named(self, event: str) -> list[dict[str, Any]]:
        """The history's events called ``event``, in order."""
        return [e for e in self.events() if e["event"] == event]

    def status(self) -> dict[str, Any] | None:
        """What ``rvsup status --json`` prints, asked from here (harness.status); None while no
        daemon answers."""
        return status(self.job_toml)

    def output_text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""


def write_trainer_job(
    root: Path,
    *,
    name: str = "two-by-two",
    total: int = 60,
    env: Mapping[str, str] | None = None,
    hang_timeout: str = "auto",
    restart: str = 'max_restarts = 3\nbackoff = "0.1s"\nbackoff_max = "1s"',
    slurm: str = 'requeue = "auto"\nstop_before_end = 0',
    nnodes: str = '"auto"',
    health: str = "",
    checkpoint: str = "every_steps = 10",
) -> TrainerJob:
    """A job.toml running the trainer with 2 ranks on every node of the allocation (or on
    ``nnodes`` of them)."""
    root.mkdir(parents=True, exist_ok=True)
    job = TrainerJob(root, name)
    job_env = {
        "TOTAL_STEPS": str(total),
        "OMP_NUM_THREADS": "1",
        "FINAL": str(job.final),
        # DDP keeps its gradient buckets as first built: with 4 ranks a resumed run then sums
        # every step's gradients in the uninterrupted run's order (docs/sdk.md, bit-identical resume)
        "DDP_FIND_UNUSED": "1",
        **(env or {}),
    }
    write_job_file(
        root,
        command=[sys.executable, str(TRAINER)],
        name=name,
        env=job_env,
        tables={
            "launch": (
                f'nproc_per_node = 2\nnnodes = {nnodes}\nterm_timeout = "3s"\nstop_timeout = "30s"'
            ),
            "checkpoint": checkpoint,
            "heartbeat": (
                'interval = "0.2s"\nstartup_timeout = "60s"\n'
                f"hang_timeout = {json.dumps(hang_timeout)}"
            ),
            "restart": restart,
            "slurm": slurm,
            **({"health": health} if health else {}),
        },
    )
    return job


def attempt_nodes(job: TrainerJob) -> list[list[str]]:
    """Each attempt's nodes, as its srun's --nodelist names them."""
    out = []
    for attempt in job.named("attempt_started"):
        found = [NODELIST.match(arg) for arg in attempt["launcher"]]
        lists = [m.group(1).split(",") for m in found if m]
        out.append(lists[0] if lists else [])
    return out


def batch_script(job: TrainerJob) -> str:
    """examples/slurm/train.sbatch running ``job`` with this Python's venv and this checkout."""
    text = EXAMPLE_SCRIPT.read_text()
    venv = Path(sys.prefix)
    for pattern, line in (
        (_VENV_LINE, f"RVSUP_VENV={shlex.quote(str(venv))}"),
        (_JOB_LINE, f"JOB_TOML={shlex.quote(str(job.job_toml))}"),
        # the code under test, also when the venv has another checkout installed
        (_SHELL_START, f"export PYTHONPATH={shlex.quote(str(CHECKOUT))}\nset -eu"),
    ):
        text, count = pattern.subn(_literally(line), text)
        assert count == 1, f"{EXAMPLE_SCRIPT} no longer has one line matching {pattern.pattern}"
    return text


def _literally(line: str) -> Callable[[re.Match[str]], str]:
    """A re.sub replacement that inserts ``line`` as it is (no backslash escapes)."""
    return lambda _match: line


def venv_problem() -> str | None:
    """Why the example script cannot activate this Python's virtualenv, or None."""
    if sys.prefix == sys.base_prefix or not (Path(sys.prefix) / "bin" / "activate").is_file():
        return "the tests must run in a virtualenv (the batch script activates it)"
    return None


def sbatch_job(cluster: SlurmCluster, job: TrainerJob, *sbatch_args: str) -> str:
    """sbatch the example script for ``job`` (output appended to job.out); the job id."""
    return cluster.sbatch(
        batch_script(job), f"--output={job.output}", f"--job-name={job.name}", *sbatch_args
    )


def submit(cluster: SlurmCluster, job: TrainerJob, *sbatch_args: str) -> str:
    """sbatch the example script for ``job`` on node1 and node2 (``sbatch_args`` may say
    otherwise); the job id."""
    return sbatch_job(cluster, job, PAIR, *sbatch_args)


def wait_until(predicate: Callable[[], T | None], *, timeout: float, what: str) -> T:
    """Poll ``predicate`` until it returns something truthy; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(_POLL_S)


def ranks_past(job: TrainerJob, step: int, *, world_size: int = 4) -> dict[str, Any] | None:
    """The daemon's status once every rank of the current attempt finished ``step``."""
    status = job.status()
    if status is None or status.get("state") != "running":
        return None
    ranks = status["ranks"]
    if len(ranks) == world_size and all(r["last_step"] >= step for r in ranks):
        return status
    return None
