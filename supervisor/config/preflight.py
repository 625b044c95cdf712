"""Checks of the machine just before a start: torchrun, programs, private run/checkpoint dirs.

:func:`preflight` reports problems as :class:`~supervisor.config.model.ConfigIssue` keyed like
job.toml (``job.checkpoint_dir``); it creates missing directories but never deletes anything.
The run, checkpoint and snapshot directories must be safe all the way up
(:func:`worker_sdk.contract.private_paths.path_problem`): no ancestor that another user can
write, or replace (docs/security.md).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from supervisor.config.model import ConfigIssue, JobConfig
from supervisor.config.torchrun import torchrun_issue
from worker_sdk.contract import layout
from worker_sdk.contract.private_paths import path_problem

__all__ = ["CHECKPOINT_MARKER", "preflight"]

#: Marker file that :func:`preflight` puts into a new, empty checkpoint directory.
CHECKPOINT_MARKER: Final = layout.MARKER


def _private_dir_problem(directory: Path) -> str | None:
    """Create ``directory`` (0700) if missing; say why it cannot hold rvsup's files, or None."""
    unsafe = path_problem(directory)
    if unsafe is not None:
        own = f"{os.path.realpath(directory)} "
        return unsafe.removeprefix(own) if unsafe.startswith(own) else f"is not safe: {unsafe}"
    try:
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True)
            directory.chmod(0o700)
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    try:
        info = directory.stat()
        if not stat.S_ISDIR(info.st_mode):
            return "is not a directory"
        if info.st_uid != os.geteuid():
            return f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return "is writable by other users; chmod go-w it"
        if not os.access(directory, os.W_OK | os.X_OK):
            return "is not writable by you"
        fd, probe = tempfile.mkstemp(prefix=".rvsup-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"is not usable: {exc.strerror or exc}"
    return None


def _checkpoint_dir_problem(directory: Path) -> str | None:
    """Refuse a checkpoint directory holding foreign entries; mark a new, empty one as rvsup's."""
    try:
        names = sorted(os.listdir(directory))
        linked = [name for name in names if os.path.islink(directory / name)]
        if linked:
            return (
                f"holds symbolic links ({', '.join(linked[:3])}); rvsup never loads a "
                "checkpoint through one: remove them"
            )
        foreign = [name for name in names if not layout.is_rvsup_entry(name)]
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            return (
                f"holds files rvsup did not write ({', '.join(foreign[:3])}{more}); "
                "use an empty directory or one rvsup created"
            )
        if not names:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(directory / CHECKPOINT_MARKER, flags, 0o600)
            try:
                os.write(fd, b"rvsup checkpoint directory: only rvsup writes here\n")
            finally:
                os.close(fd)
    except OSError as exc:
        return f"is not usable: {exc.strerror or exc}"
    return None


def preflight(cfg: JobConfig, *, environ: Mapping[str, str] | None = None) -> list[ConfigIssue]:
    """Check the machine before a start: torchrun, programs, workdir, run and checkpoint dirs.

    Returns the problems found (raises nothing). Creates missing run and checkpoint
    directories (0700) and the checkpoint marker file; never deletes or changes anything else.
    The torchrun is the job's (:func:`~supervisor.config.torchrun.resolve_torchrun`), looked
    up with ``environ`` as rvsup's environment (default ``os.environ``).
    """
    issues: list[ConfigIssue] = []
    job = cfg.job
    torchrun = torchrun_issue(cfg, environ=environ)
    if torchrun is not None:
        issues.append(torchrun)
    if not job.workdir.is_dir():
        what = "is not a directory" if job.workdir.exists() else "does not exist"
        issues.append(ConfigIssue("job.workdir", f"{job.workdir} {what}"))
    program = job.command[0]
    on_path = os.sep not in program and shutil.which(program, path=job.env.get("PATH")) is not None
    if not on_path and not (job.workdir / program).is_file():
        issues.append(
            ConfigIssue("job.command[0]", f"{program!r} not found on PATH or in {job.workdir}")
        )
    for key, directory in (
        ("job.run_dir", job.run_dir),
        ("job.checkpoint_dir", job.checkpoint_dir),
    ):
        if directory.is_relative_to(job.workdir) and not job.workdir.is_dir():
            continue  # do not create the missing workdir as a side effect
        problem = _private_dir_problem(directory)
        if problem is None and key == "job.checkpoint_dir":
            problem = _checkpoint_dir_problem(directory)
        if problem is not None:
            issues.append(ConfigIssue(key, f"{directory} {problem}"))
    if cfg.checkpoint.memory_every_steps != 0:
        problem = _memory_dir_problem(Path(cfg.checkpoint.memory_dir))
        if problem is not None:
            issues.append(ConfigIssue("checkpoint.memory_dir", problem))
    return issues


def _memory_dir_problem(base: Path) -> str | None:
    """The shared place (a tmpfs) the memory tier makes its private directory in must exist
    and be safe: sticky where others write it (``/dev/shm``)."""
    if not base.is_dir():
        return (
            f'{base} is not a directory (set memory_dir to a tmpfs, or memory_every_steps = "off")'
        )
    unsafe = path_problem(base, shared_leaf=True)
    if unsafe is not None:
        return f"{base} is not safe: {unsafe}"
    return None
