"""Helpers for the process tests: write a job, run ``rvsup`` for real, read its history."""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, AnyStr

import psutil

from supervisor.config.load import load_config
from supervisor.service import control
from tests.helpers.jobs import write_job_file

TRAINER = Path(__file__).with_name("trainer.py")
REPO = Path(__file__).resolve().parents[2]


def write_job(
    tmp: Path,
    *,
    name: str = "toy",
    total: int = 60,
    env: Mapping[str, str] | None = None,
    checkpoint: str = "every_steps = 10",
    heartbeat: str = 'interval = "0.2s"\nstartup_timeout = "60s"',
    restart: str = 'max_restarts = 3\nbackoff = "0.1s"\nbackoff_max = "1s"',
    launch: str = 'term_timeout = "3s"\nstop_timeout = "30s"',
    anomaly: str = "",
    nproc: int = 2,
    checkpoint_dir: str = "ckpt",
    script: Path = TRAINER,
) -> Path:
    """A job.toml running the fault-switch trainer (or another ``script``) on ``nproc`` ranks
    (2)."""
    return write_job_file(
        tmp,
        command=[sys.executable, str(script)],
        name=name,
        checkpoint_dir=checkpoint_dir,
        env={"TOTAL_STEPS": str(total), "OMP_NUM_THREADS": "1", **(env or {})},
        tables={
            "launch": f"nproc_per_node = {nproc}\n{launch}",
            "checkpoint": checkpoint,
            "heartbeat": heartbeat,
            "restart": restart,
            "anomaly": anomaly,
        },
    )


def rvsup_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def rvsup(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run an rvsup command to completion (killed at the timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        env=rvsup_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def running(job: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """``rvsup start JOB`` in the background; always killed (whole tree) on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "start", str(job), *extra],
        env=rvsup_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with reaped(proc):
        yield proc


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[AnyStr]) -> Iterator[subprocess.Popen[AnyStr]]:
    """``proc`` for the block; then it and every process below it are SIGKILLed and reaped
    (also when the block fails)."""
    try:
        yield proc
    finally:
        kill_tree(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, and wait (10 s at most) until they are gone."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def named(evs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["event"] == name]


def wait_for(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status(job: Path) -> dict[str, Any] | None:
    """The daemon's answer that ``rvsup status JOB --json`` prints (None while no daemon
    answers), asked from this process: a poll starts no interpreter, so a test waiting on its
    job's progress takes no CPU from the job (test_cli.py runs the command itself)."""
    try:
        return control.request(_run_dir(job, job.stat().st_mtime_ns), "status", timeout_s=20)
    except (control.NotRunningError, OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _run_dir(job: Path, _version: int) -> Path:
    """The run directory ``job`` names, read once per version of the file (``_version``: its
    modification time, a key of the cache alone)."""
    return load_config(job).job.run_dir


def dropped_since(before: dict[str, int], now: dict[str, Any]) -> collections.Counter[str]:
    """The frames dropped (by reason) between the ``before`` counts and the status ``now``."""
    counts = collections.Counter({k: int(v) for k, v in now["messages"]["dropped"].items()})
    counts.subtract(before)
    return +counts


def wait_progress(job: Path, *, min_step: int, timeout: float = 90) -> dict[str, Any]:
    """Wait until every rank of the current attempt finished ``min_step``; returns the status."""

    def ready() -> dict[str, Any] | None:
        st = status(job)
        if st and len(st["ranks"]) == 2 and all(r["last_step"] >= min_step for r in st["ranks"]):
            return st
        return None

    result: dict[str, Any] = wait_for(ready, timeout=timeout, what=f"step {min_step}", interval=0.2)
    return result


def launcher_of_ranks(daemon: int, rank_pid: int) -> psutil.Process:
    """The torchrun that started the current attempt's ranks: a rank's parent, or, for ranks
    forked from the zygote (then their parent), the parent of the clients that stand in for
    them (``python -m worker_sdk.spawn.bootstrap --zygote ...``)."""
    clients = []
    for proc in psutil.Process(daemon).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a process that just ended
            cmdline = proc.cmdline()
            standby = cmdline[-1].endswith(
                "spawn/standby.py"
            )  # the next attempt's launcher's client
            if cmdline[1:4] == ["-m", "worker_sdk.spawn.bootstrap", "--zygote"] and not standby:
                clients.append(proc)
    launchers = {p.parent() for p in clients} if clients else {psutil.Process(rank_pid).parent()}
    assert len(launchers) == 1, launchers
    launcher = launchers.pop()
    assert launcher is not None
    return launcher
