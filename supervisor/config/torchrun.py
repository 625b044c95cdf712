"""Which torchrun a job runs, and on which interpreter its warm standby waits.

rvsup may be installed in an environment of its own (a virtualenv or pipx without torch): the
torchrun it starts, and the warm standby that imports torchrun ahead of a restart, must come from
the *job's* environment. :func:`resolve_torchrun` decides, in this order:

1. ``[launch] torchrun`` when set: a path (``"/venv/bin/torchrun"``; relative to job.toml's
   folder) or a command line (``["/venv/bin/python", "-m", "torch.distributed.run"]``); a bare
   name (``"torchrun"``) is looked up on PATH.
2. When ``job.command[0]`` is a Python interpreter (``python``, ``python3``, ``python3.X``; a
   bare name is looked up on the PATH of ``[job] env`` and then on rvsup's PATH, a relative path
   is relative to the workdir): the ``torchrun`` script beside it if there is one, else
   ``[interpreter, "-m", "torch.distributed.run"]``.
3. Otherwise (a shell script, ``uv``, ...): ``torchrun`` on the PATH of ``[job] env``, then on
   rvsup's PATH, then beside rvsup's own interpreter.

The warm standby runs on the job's interpreter: the one found in step 2, ``argv[0]`` of the
``-m torch.distributed.run`` form, or the interpreter named by a torchrun script's ``#!`` line.
Any other command line (a wrapper script, ``srun ...``) gets no warm standby: what it would run
is not known. Nothing here imports torch or starts a process; :func:`torchrun_issue` (for the
preflight) may start the job's interpreter once to ask whether it can import torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.config.model import ConfigIssue, JobConfig

__all__ = [
    "TORCHRUN_MODULE",
    "Torchrun",
    "is_python",
    "job_python",
    "resolve_torchrun",
    "script_python",
    "torchrun_issue",
]

#: The module ``torchrun`` runs; ``python -m torch.distributed.run`` is torchrun.
TORCHRUN_MODULE: Final = "torch.distributed.run"
_KEY: Final = "launch.torchrun"
_PYTHON: Final = re.compile(r"python(?:3(?:\.\d+)?t?)?", re.ASCII)
# distlib's launcher for an interpreter path too long or too odd for a #! line
_SH_EXEC: Final = re.compile(r"^'''exec' \"?(?P<python>[^\"]+?)\"? \"\$0\" \"\$@\"", re.MULTILINE)
_HEAD_BYTES: Final = 4096
_CHECK_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Torchrun:
    """How to start torchrun for this job.

    ``argv`` is the start of the launcher's command line (torchrun's own flags follow it);
    ``python`` is the job's interpreter that a warm standby runs ``torch.distributed.run`` on, or
    None when there must be no standby; ``origin`` says how it was found, for messages.
    """

    argv: tuple[str, ...]
    python: str | None
    origin: str

    def describe(self) -> str:
        """One line for people: the command line, where it came from, the standby's interpreter."""
        standby = f"warm standby on {self.python}" if self.python else "no warm standby"
        return f"{json.dumps(list(self.argv))} ({self.origin}; {standby})"


def is_python(program: str) -> bool:
    """True when ``program``'s file name is that of a Python interpreter (python3, python3.11)."""
    return _PYTHON.fullmatch(os.path.basename(program)) is not None


def _executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _which(name: str, paths: Sequence[str | None]) -> str | None:
    """``name`` on the first of ``paths`` (PATH strings; None skipped) that has it, absolute."""
    for path in paths:
        if path is not None:
            found = shutil.which(name, path=path)
            if found is not None:
                return os.path.abspath(found)
    return None


def _paths(cfg: JobConfig, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The PATHs programs are looked up on: the job's (``[job] env``), then rvsup's."""
    return cfg.job.env.get("PATH"), environ.get("PATH", os.defpath)


def _program(program: str, base: Path, paths: Sequence[str | None]) -> str | None:
    """``program`` as exec would find it: a path (relative to ``base``) or a name on PATH."""
    if os.sep in program:
        path = os.path.abspath(os.path.join(base, program))
        return path if _executable(path) else None
    return _which(program, paths)


def script_python(script: str, paths: Sequence[str | None] = ()) -> str | None:
    """The interpreter a torchrun console script runs on, from its ``#!`` line; None when
    ``script`` is not a Python script that runs ``torch.distributed.run`` (a shell wrapper)."""
    try:
        with open(script, "rb") as file:
            head = file.read(_HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    if not head.startswith("#!") or TORCHRUN_MODULE not in head:
        return None
    words = head[2:].splitlines()[0].split()
    if not words:
        return None
    python: str | None = None
    if is_python(words[0]):
        python = words[0]
    elif os.path.basename(words[0]) == "env":
        names = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        if names and is_python(names[0]):
            python = names[0] if os.sep in names[0] else _which(names[0], paths)
    elif os.path.basename(words[0]) == "sh":
        match = _SH_EXEC.search(head)
        python = match.group("python") if match else None
    return python if python is not None and _executable(python) else None


def _from_setting(argv: tuple[str, ...], paths: Sequence[str | None]) -> Torchrun | None:
    """``[launch] torchrun`` as set: its program found; the standby's interpreter when known."""
    program = argv[0] if os.sep in argv[0] else _which(argv[0], paths)
    if program is None or not _executable(program):
        return None
    resolved = (program, *argv[1:])
    python: str | None = None
    if len(argv) == 1:
        python = script_python(program, paths)
    elif is_python(program) and argv[1:] == ("-m", TORCHRUN_MODULE):
        python = program
    return Torchrun(resolved, python, "launch.torchrun")


def resolve_torchrun(
    cfg: JobConfig,
    *,
    environ: Mapping[str, str] | None = None,
    rvsup_python: str = sys.executable,
) -> Torchrun | None:
    """The torchrun of ``cfg``'s job (the rules are in the module docstring); None when none is
    found. ``environ`` is rvsup's environment (default ``os.environ``), ``rvsup_python`` rvsup's
    own interpreter (the last place a torchrun is looked for)."""
    paths = _paths(cfg, os.environ if environ is None else environ)
    if cfg.launch.torchrun is not None:
        return _from_setting(cfg.launch.torchrun, paths)
    command = cfg.job.command
    if command and is_python(command[0]):
        python = _program(command[0], cfg.job.workdir, paths)
        if python is None:
            return None
        beside = os.path.join(os.path.dirname(python), "torchrun")
        if _executable(beside):
            return Torchrun((beside,), python, "beside job.command[0]")
        return Torchrun((python, "-m", TORCHRUN_MODULE), python, "job.command[0] -m")
    found = _which("torchrun", paths)
    origin = "on PATH"
    if found is None:
        mine = os.path.join(os.path.dirname(rvsup_python), "torchrun")
        found, origin = (mine, "beside rvsup's interpreter") if _executable(mine) else (None, "")
    if found is None:
        return None
    return Torchrun((found,), script_python(found, paths), origin)


def job_python(cfg: JobConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """``job.command[0]`` as an absolute path when it is a Python interpreter (the zygote's),
    else None."""
    command = cfg.job.command
    if not command or not is_python(command[0]):
        return None
    return _program(
        command[0], cfg.job.workdir, _paths(cfg, os.environ if environ is None else environ)
    )


def _not_found(cfg: JobConfig, environ: Mapping[str, str]) -> str:
    """Why :func:`resolve_torchrun` found nothing, and what to do about it."""
    setting = cfg.launch.torchrun
    if setting is not None:
        program = setting[0]
        if os.sep not in program and _which(program, _paths(cfg, environ)) is None:
            return f"{program!r} not found on PATH"
        what = "is not executable" if os.path.exists(program) else "does not exist"
        return f"{program} {what}"
    hint = (
        "set launch.torchrun to the torchrun of the job's environment (a path, or [\"/path/to/"
        f'python", "-m", "{TORCHRUN_MODULE}"])'
    )
    command = cfg.job.command
    if command and is_python(command[0]):
        return f"cannot derive it: job.command[0] {command[0]!r} not found; {hint}"
    return (
        "no torchrun on the PATH of [job] env or rvsup's, and job.command[0] "
        f"{command[0] if command else ''!r} is not a Python interpreter to derive it from; {hint}"
    )


def _import_problem(python: str, module: str, cfg: JobConfig, env: Mapping[str, str]) -> str | None:
    """Why ``python`` (run with the job's environment) cannot find ``module``, or None."""
    top = module.split(".", 1)[0]
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({top!r}) is None)"
    workdir = cfg.job.workdir if cfg.job.workdir.is_dir() else None
    try:
        done = subprocess.run(
            [python, "-c", code],
            env={**env, **cfg.job.env},
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None  # a slow file system is not a reason to refuse the start
    except OSError as exc:
        return f"{python} cannot be run: {exc.strerror or exc}"
    if done.returncode == 1 and not done.stderr:
        return f"{python} cannot import {top}"
    return None


def torchrun_issue(
    cfg: JobConfig,
    *,
    environ: Mapping[str, str] | None = None,
    rvsup_python: str = sys.executable,
) -> ConfigIssue | None:
    """The ``launch.torchrun`` problem of ``cfg`` on this machine, or None.

    Besides "none found", an ``[interpreter, "-m", module]`` torchrun is asked (one short
    process) whether it can import the module's package: a job environment without torch is
    refused here rather than crashing every attempt.
    """
    env = os.environ if environ is None else environ
    torchrun = resolve_torchrun(cfg, environ=env, rvsup_python=rvsup_python)
    if torchrun is None:
        return ConfigIssue(_KEY, _not_found(cfg, env))
    if len(torchrun.argv) >= 3 and torchrun.argv[1] == "-m":
        problem = _import_problem(torchrun.argv[0], torchrun.argv[2], cfg, env)
        if problem is not None and cfg.launch.torchrun is None:
            problem = f"{problem}, and job.command[0] has no torchrun beside it"
        if problem is not None:
            return ConfigIssue(
                _KEY,
                f"{problem}; install torch in that environment or set launch.torchrun "
                "to the torchrun of the job's environment",
            )
    return None
