"""rvsup installed in an environment of its own, without torch (and on Python 3.10 where there is
one), supervises a job whose interpreter, torch and torchrun live in another: the torch venv
running these tests. torchrun and the warm standby come from the job's environment.

The daemon's environment is ``RVSUP_TORCHLESS_PYTHON`` when tests/run.sh built one, else a venv
built once per session under the session's temporary directory (``pip install -e`` of this
repository, no torch: 20-40 s); the tests skip, saying why, when none can be built.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.harness import (
    REPO,
    TRAINER,
    events,
    launcher_of_ranks,
    named,
    reaped,
    status,
    wait_for,
    write_job,
)
from tests.helpers.jobs import write_job_file
from tests.helpers.states import assert_same_state, load_final

pytestmark = pytest.mark.process

JOB_PYTHON = sys.executable  # the job's interpreter: this venv, which has torch
JOB_TORCHRUN = str(Path(JOB_PYTHON).parent / "torchrun")
_BUILD_TIMEOUT_S = 600


def _python310() -> str | None:
    """A Python 3.10 interpreter (python3.10 on PATH, else pyenv's), as tests/run.sh finds it."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [
        shutil.which("python3.10"),
        *sorted(glob.glob(f"{root}/versions/3.10*/bin/python3.10")),
    ]
    for candidate in filter(None, candidates):
        check = [candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 10))"]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run(check, capture_output=True, timeout=30).returncode == 0:
                return candidate
    return None


def _has_torch(python: str) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="session")
def rvsup_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of an environment with rvsup installed and no torch."""
    given = os.environ.get("RVSUP_TORCHLESS_PYTHON")
    if given:
        assert os.access(given, os.X_OK), f"RVSUP_TORCHLESS_PYTHON={given} is not executable"
        assert not _has_torch(given), f"RVSUP_TORCHLESS_PYTHON={given} has torch"
        return given
    venv = tmp_path_factory.mktemp("rvsup-venv") / "venv"
    base = _python310() or sys.executable
    steps = [
        [base, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--disable-pip-version-check",
            "-e",
            str(REPO),
        ],
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for argv in steps:
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot build a torch-less venv for rvsup ({argv[:3]}): {exc}")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout)[-800:]
            pytest.skip(f"cannot build a torch-less venv for rvsup ({argv[:3]}): {tail}")
    python = str(venv / "bin" / "python")
    assert not _has_torch(python)
    return python


def _daemon_env(rvsup_python: str) -> dict[str, str]:
    """rvsup's environment: its own venv first on PATH, and neither the job's venv nor this
    checkout reachable (no PYTHONPATH): nothing of the job's can be found but through job.toml."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    job_bin = str(Path(JOB_PYTHON).parent)
    rest = [d for d in env.get("PATH", os.defpath).split(os.pathsep) if d and d != job_bin]
    rest = [d for d in rest if not os.path.isfile(os.path.join(d, "torchrun"))]
    env["PATH"] = os.pathsep.join([str(Path(rvsup_python).parent), *rest])
    return env


def _rvsup_argv(rvsup_python: str) -> list[str]:
    """The ``rvsup`` console script of rvsup's venv (``python -m supervisor`` if it has none)."""
    script = Path(rvsup_python).parent / "rvsup"
    return [str(script)] if script.is_file() else [rvsup_python, "-m", "supervisor"]


def _rvsup(rvsup_python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_rvsup_argv(rvsup_python), *args],
        env=_daemon_env(rvsup_python),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@contextlib.contextmanager
def _running(rvsup_python: str, job: Path) -> Iterator[subprocess.Popen[str]]:
    """``rvsup start JOB`` from rvsup's venv in the background; always killed (tree) on exit."""
    proc = subprocess.Popen(
        [*_rvsup_argv(rvsup_python), "start", str(job)],
        env=_daemon_env(rvsup_python),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with reaped(proc):
        yield proc


def _wait_status(
    proc: subprocess.Popen[str], job: Path, ready: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The daemon's status once ``ready`` says so; fails at once, with its output, if it ends."""

    def check() -> dict[str, Any] | None:
        if proc.poll() is not None:
            out, _ = proc.communicate()
            raise AssertionError(f"rvsup exited {proc.returncode} before {what}:\n{out}")
        now = status(job)
        return now if now is not None and ready(now) else None

    found: dict[str, Any] = wait_for(check, timeout=90, what=what, interval=0.2)
    return found


def _is_standby(cmdline: list[str]) -> bool:
    """A warm standby's command line: started cold (``-c ... worker_sdk.spawn.standby``) or forked
    from the zygote (``python .../worker_sdk/spawn/standby.py``); not the client that stands in for
    a forked one (``worker_sdk.spawn.bootstrap --zygote``)."""
    line = " ".join(cmdline)
    forked = line.endswith("worker_sdk/spawn/standby.py")
    return "worker_sdk.spawn.bootstrap" not in line and (
        "worker_sdk.spawn.standby" in line or forked
    )


def _standbys(daemon: psutil.Process) -> list[psutil.Process]:
    """The daemon's warm standbys (recognised by their command line)."""
    found = []
    for proc in daemon.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if _is_standby(proc.cmdline()):
                found.append(proc)
    return found


def _launcher_of_rank0(daemon: psutil.Process, st: dict[str, Any]) -> psutil.Process:
    """The attempt's torchrun."""
    return launcher_of_ranks(daemon.pid, next(r for r in st["ranks"] if r["rank"] == 0)["pid"])


def test_torchless_daemon_survives_a_crash_bit_identically(
    tmp_path: Path, reference_final: Path, rvsup_python: str
) -> None:
    """The daemon from a venv without torch runs the job's torchrun (beside the job's Python),
    forks the ranks, and the first attempt's torchrun, from a zygote on the job's interpreter,
    restarts after a kill -9 of rank 1 on a warm standby forked from that zygote, and ends
    bit-identical to an uninterrupted run, with one crash and one restart in the history."""
    final = tmp_path / "final.pt"
    job = write_job(tmp_path, env={"FINAL": str(final), "STEP_SLEEP": "0.1"})
    with _running(rvsup_python, job) as proc:
        daemon = psutil.Process(proc.pid)
        st = _wait_status(
            proc,
            job,
            lambda s: len(s["ranks"]) == 2 and all(r["last_step"] >= 15 for r in s["ranks"]),
            "step 15",
        )
        first = _launcher_of_rank0(daemon, st)
        rank0 = psutil.Process(next(r for r in st["ranks"] if r["rank"] == 0)["pid"])
        zygote = rank0.parent()  # the ranks are forked from a process on the job's interpreter
        assert zygote is not None and zygote.cmdline()[0] == JOB_PYTHON, zygote
        assert _is_standby(first.cmdline()) and first.parent() == zygote, first.cmdline()
        standby = wait_for(
            lambda: [p for p in _standbys(daemon) if p.pid != first.pid],
            timeout=30,
            what="the warm standby of the next attempt",
        )
        assert [p.cmdline()[0] for p in standby] == [JOB_PYTHON]  # the job's, not rvsup's
        assert [p.parent() for p in standby] == [zygote]  # forked, torchrun imported already
        victim = next(r for r in st["ranks"] if r["rank"] == 1)
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        st2 = _wait_status(
            proc, job, lambda s: s["attempt"] == 2 and len(s["ranks"]) == 2, "attempt 2's ranks"
        )
        with contextlib.suppress(psutil.Error):  # it may have finished meanwhile
            second = _launcher_of_rank0(daemon, st2)
            assert second.create_time() < killed_at  # the standby, started before the crash
            assert second.cmdline()[0] == JOB_PYTHON
            assert _is_standby(second.cmdline())
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    evs = events(tmp_path / "run")
    assert [f["kind"] for f in named(evs, "failure_detected")] == ["crash"]
    assert named(evs, "failure_detected")[0]["ranks"][0] == 1
    assert len(named(evs, "restart_scheduled")) == 1
    attempts = named(evs, "attempt_started")
    assert len(attempts) == 2 and attempts[1]["resume_step"] > 0
    assert all(a["launcher"][0] == JOB_TORCHRUN for a in attempts), attempts
    assert named(evs, "job_succeeded")
    assert_same_state(load_final(reference_final), load_final(final))


def test_explicit_torchrun_for_a_shell_script_command(tmp_path: Path, rvsup_python: str) -> None:
    """A command that is not Python (a shell script) with launch.torchrun = the job's Python
    running torch.distributed.run: the torch-less daemon runs the job to success through it."""
    final = tmp_path / "final.pt"
    torchrun = json.dumps([JOB_PYTHON, "-m", "torch.distributed.run"])
    job = write_job(
        tmp_path,
        total=20,
        env={"FINAL": str(final)},
        launch=f'term_timeout = "3s"\ntorchrun = {torchrun}',
    )
    script = tmp_path / "train.sh"
    script.write_text(f'#!/bin/sh\nexec "{JOB_PYTHON}" "{TRAINER}"\n')
    script.chmod(0o755)
    command = f"command = {json.dumps([JOB_PYTHON, str(TRAINER)])}"
    assert command in job.read_text()
    job.write_text(job.read_text().replace(command, 'command = ["./train.sh"]'))
    shown = _rvsup(rvsup_python, "validate", str(job))
    assert shown.returncode == 0, shown.stderr
    assert f"torchrun = {torchrun}" in shown.stdout
    res = _rvsup(rvsup_python, "start", str(job))
    assert res.returncode == 0, res.stderr
    assert named(events(tmp_path / "run"), "job_succeeded")
    assert final.is_file()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["./train.sh"], "no torchrun on the PATH of [job] env or rvsup's"),
        (
            ["{rvsup_python}", "train.py"],
            "{rvsup_python} cannot import torch, and job.command[0] has no torchrun beside it",
        ),
    ],
    ids=["script-without-torchrun", "python-without-torch"],
)
def test_torchless_daemon_refuses_a_job_without_torchrun(
    tmp_path: Path, rvsup_python: str, command: list[str], message: str
) -> None:
    """No torchrun in the job's environment (a script on a PATH without one, or an interpreter
    without torch): start exits 2 with the launch.torchrun problem and launches nothing."""
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    (tmp_path / "train.sh").chmod(0o755)
    argv = [word.replace("{rvsup_python}", rvsup_python) for word in command]
    job = write_job_file(tmp_path, command=argv)
    res = _rvsup(rvsup_python, "start", str(job))
    assert res.returncode == 2, res.stderr
    expected = "rvsup: launch.torchrun: " + message.replace("{rvsup_python}", rvsup_python)
    assert expected in res.stderr, res.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()
