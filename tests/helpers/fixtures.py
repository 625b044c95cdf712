"""Fixtures shared by the whole suite (registered by tests/conftest.py): an uninterrupted
reference run of the trainer; a real 1-process gloo group; a job's cgroups as a daemon makes
them; :func:`built_once`, for what every process of a run can share."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.process.cgroup import JobGroups
from tests.helpers.harness import rvsup, write_job

SHARED = "RVTEST_SHARED_DIR"
"""A folder for :func:`built_once` that outlives one pytest run (tests/run.sh sets it for its
two phases); without it, the run's base temporary folder is used."""


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """What ``build(folder)`` returns (a path to read, never to change), built by the first
    process of the run that asks for ``name`` while the others wait for it: pytest-xdist's
    workers, and both phases of tests/run.sh, share it. A build that fails is tried again by
    the next process that asks."""
    given = os.environ.get(SHARED)
    if given:
        root = Path(given)
    else:  # a worker's base folder is one per worker, inside the run's
        base = factory.getbasetemp()
        root = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / f"{name}.path"
        if done.exists():
            return Path(done.read_text())
        built = build(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)))
        done.write_text(str(built))
        return built


@pytest.fixture(scope="session")
def reference_final(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of an uninterrupted 60-step run under rvsup (checkpoint every 10 steps),
    with ranks started cold: the tests' runs fork theirs from the zygote (the default)."""

    def build(tmp: Path) -> Path:
        final = tmp / "final.pt"
        job = write_job(
            tmp,
            env={"FINAL": str(final)},
            launch='term_timeout = "3s"\nstop_timeout = "30s"\nzygote = false',
        )
        res = rvsup("start", str(job), timeout=180)
        assert res.returncode == 0, res.stderr
        return final

    return built_once(tmp_path_factory, "reference-final", build)


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A real 1-process gloo group (file store in tmp_path), destroyed afterwards (torch is
    imported here, not at the top: the suite also runs where torch is not installed)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def job_groups() -> Iterator[JobGroups]:
    """This process's job group (cgroup v2, as a daemon makes it: ``rvsup-PID``), ended and
    removed afterwards; skipped where none can be made."""
    made = JobGroups.create()
    if isinstance(made, str):
        pytest.skip(made)
    yield made
    made.group().end()
