"""Starts an attempt's launcher: torchrun (or srun + torchrun), as its :class:`LaunchPlan` says
(:mod:`.launch_plan` builds it), or the warm standby handed that command line.

torchrun is started in a session of its own with the parent-death signal armed (SIGKILL when the
supervisor dies), and it runs every rank through ``worker_sdk.spawn.bootstrap``, which arms the same
signal before exec'ing the user's command: killing the supervisor with SIGKILL takes the whole tree
with it. The bootstrap runs on rvsup's own interpreter (it imports nothing but the standard
library); the warm standby, which imports torchrun ahead of time, on the job's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.config.torchrun import Torchrun
from supervisor.process.launch_plan import LaunchPlan, as_torchrun, build_plan
from worker_sdk.spawn.cgroup import Group, place

__all__ = [
    "LaunchPlan",
    "Standby",
    "bootstrap",
    "build_plan",
    "spawn",
    "spawn_module_file",
    "standby_argv",
    "stderr_tail",
]


def spawn(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    """Start the attempt in a new session (in its own cgroup, where it has one), through the
    bootstrap so that it dies with us.

    Call it from the supervisor's main thread: the parent-death signal fires when the thread that
    forked the child exits.
    """
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if plan.cgroup is not None:
        os.makedirs(plan.cgroup, exist_ok=True)
    return _bootstrapped(plan.argv, plan, stdin=subprocess.DEVNULL, cgroup=plan.cgroup)


def _bootstrapped(
    argv: Sequence[str],
    plan: LaunchPlan,
    *,
    stdin: int,
    env: Mapping[str, str] | None = None,
    cgroup: str | None = None,
) -> subprocess.Popen[bytes]:
    """``argv`` run through the bootstrap with ``plan``'s cwd and env (or ``env``)."""
    env = plan.env if env is None else env
    return bootstrap(argv, env=env, cwd=plan.cwd, stdin=stdin, cgroup=cgroup)


def bootstrap(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    stdin: int,
    stdout: int | None = None,
    cgroup: str | None = None,
) -> subprocess.Popen[bytes]:
    """``argv`` run through ``worker_sdk.spawn.bootstrap`` in a session of its own; with
    ``cgroup``, placed into that group before it runs anything (the bootstrap waits for it, and
    exits 126 when it is not there)."""
    command = [sys.executable, "-m", "worker_sdk.spawn.bootstrap"]
    held = release = None
    if cgroup is not None:
        held, release = os.pipe()
        command += ["--cgroup", cgroup, str(held)]
    try:
        proc = subprocess.Popen(
            [*command, *argv],
            env=dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            start_new_session=True,
            close_fds=True,
            pass_fds=() if held is None else (held,),
        )
    except BaseException:
        if release is not None:
            os.close(release)
        raise
    finally:
        if held is not None:
            os.close(held)
    if cgroup is not None and release is not None:
        try:
            place(proc.pid, cgroup)
        except OSError as exc:  # it says where it is instead, and exits 126
            print(f"rvsup: cannot place process {proc.pid} in {cgroup}: {exc}", file=sys.stderr)
        finally:
            os.close(release)
    return proc


def spawn_module_file(name: str) -> str:
    """The file of ``worker_sdk.spawn.<name>``, found without importing (executing) it."""
    spec = importlib.util.find_spec(f"worker_sdk.spawn.{name}")
    if spec is None or spec.origin is None:  # pragma: no cover - installed with the daemon
        raise ImportError(f"worker_sdk.spawn.{name} is missing from rvsup's installation")
    return str(Path(spec.origin).resolve())


# Runs rvsup's own copy of worker_sdk/spawn/standby.py on the job's interpreter, by path: the job's
# environment need not have worker_sdk, nor the same version of it. sys.path loses "" (the cwd),
# as when the torchrun script runs. The first line names the module for people and tools (ps).
_STANDBY_CODE = (
    "# worker_sdk.spawn.standby: rvsup's warm standby launcher\n"
    "import runpy, sys\n"
    "if sys.path and not sys.path[0]:\n"
    "    del sys.path[0]\n"
    "runpy.run_path(sys.argv.pop(1), run_name='__main__')\n"
)


def _standby_script() -> str:
    return spawn_module_file("standby")


def standby_argv(python: str) -> tuple[str, ...]:
    """The command line of a warm standby started cold on the job's interpreter ``python``."""
    return (python, "-c", _STANDBY_CODE, _standby_script())


class Standby:
    """A warm torchrun for the next single-node attempt (``worker_sdk.spawn.standby``).

    :meth:`prepare` starts one in the background while an attempt runs, on the job's interpreter
    (``torchrun.python``; none when that is unknown); :meth:`spawn` hands the next attempt's
    command line to it when it is alive and the attempt is a plain single-node torchrun, and
    otherwise starts a fresh launcher like :func:`spawn`. Only the daemon's main thread may call
    these (the parent-death signal is tied to the thread that forked).

    With cgroups the standby is placed, when it is started, into the group of the attempt it
    is for (``cgroup`` of :meth:`prepare`: the next one's), and stays there: it and everything it
    starts are that attempt's, and nothing of the attempt ran before. It is used only by the
    attempt whose group it is in (any other dismisses it, and its group is ended).
    """

    def __init__(self, torchrun: Torchrun | str) -> None:
        self.torchrun = as_torchrun(torchrun)
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroup: str | None = None

    def prepare(
        self,
        plan: LaunchPlan,
        *,
        zygote: str | None = None,
        env: Mapping[str, str] | None = None,
        cgroup: str | None = None,
    ) -> None:
        """Start a standby for attempts like ``plan`` unless one is waiting already: forked
        from the zygote ``zygote`` (ready in milliseconds, and no import competes with the
        training for the CPU) with ``env`` as its environment (the zygote's, where imports
        care; its torchrun gets the next attempt's), else started cold. A zygote that refuses
        leaves it cold too. ``cgroup``: the group of the attempt it is for, made here."""
        python = self.torchrun.python
        if python is None or plan.alloc is not None:
            return
        if self._proc is not None and self._proc.poll() is None:
            return
        argv = standby_argv(python)
        if zygote is not None:
            argv = ("--zygote", zygote, python, _standby_script())
        self._cgroup = cgroup if plan.cgroup is not None else None
        if self._cgroup is not None:
            os.makedirs(self._cgroup, exist_ok=True)
        self._proc = _bootstrapped(argv, plan, stdin=subprocess.PIPE, env=env, cgroup=self._cgroup)

    def waiting(self) -> bool:
        """A standby was started and has not been used or dismissed (alive or not)."""
        return self._proc is not None

    def spawn(self, plan: LaunchPlan) -> subprocess.Popen[bytes]:
        """The attempt's launcher: the standby given ``plan``'s command line, or a fresh one."""
        proc, self._proc = self._proc, None
        group, self._cgroup = self._cgroup, None
        prefix = self.torchrun.argv
        usable = plan.alloc is None and plan.argv[: len(prefix)] == prefix
        if plan.cgroup != group:  # waits in another attempt's group (or none, or for none)
            usable = False
        if proc is not None and usable and proc.poll() is None and proc.stdin is not None:
            plan.log_dir.mkdir(parents=True, exist_ok=True)
            args = list(plan.argv[len(prefix) :])
            order = {"args": args, "env": dict(plan.env), "cwd": str(plan.cwd)}
            try:
                proc.stdin.write(json.dumps(order).encode() + b"\n")
                proc.stdin.close()
            except OSError:  # it died meanwhile
                pass
            else:
                return proc
        if proc is not None:
            _dismiss(proc, group)
        return spawn(plan)

    def close(self) -> None:
        """Dismiss a waiting standby (it exits at the end of its input) and reap it."""
        proc, self._proc = self._proc, None
        group, self._cgroup = self._cgroup, None
        if proc is not None:
            _dismiss(proc, group)


def _dismiss(proc: subprocess.Popen[bytes], group: str | None) -> None:
    """Kill and reap an unused standby (it holds nothing but its imports), and its group's
    members (a standby forked from the zygote is not our child)."""
    proc.kill()
    proc.wait()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if group is not None:
        Group(Path(group)).end()


def stderr_tail(log_dir: Path, *, max_bytes: int = 8192, local_rank: int | None = None) -> str:
    """The end of every rank's stderr log of an attempt (OOM evidence when the SDK could not say),
    or of one local rank's."""
    pattern = "**/stderr.log" if local_rank is None else f"**/attempt_*/{local_rank}/stderr.log"
    parts: list[str] = []
    for path in sorted(log_dir.glob(pattern)):
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                parts.append(f.read().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)
