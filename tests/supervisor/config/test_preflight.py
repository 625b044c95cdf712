"""preflight: torchrun, programs on PATH, private run and checkpoint directories, the marker.

Every job here names a stand-in torchrun (``launch.torchrun``), so that what is checked does not
depend on the environment running the tests; test_torchrun_resolution.py covers the torchrun.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.load import load_config
from supervisor.config.model import ConfigIssue, JobConfig
from supervisor.config.preflight import CHECKPOINT_MARKER, preflight
from tests.helpers.jobs import write_job_file


def write_job(
    tmp_path: Path, body: str = "", command: str | None = None, torchrun: str | None = None
) -> JobConfig:
    """A job in tmp_path whose program is this Python (found by absolute path), or ``command``
    (a TOML array), and whose torchrun is ``torchrun`` (default: a stand-in script, given
    relative to job.toml); ``body``: more [job] lines."""
    argv = json.loads(command) if command is not None else [sys.executable, "train.py"]
    if torchrun is None:
        fake = tmp_path / "torch-env" / "torchrun"
        fake.parent.mkdir(exist_ok=True)
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
        torchrun = '"torch-env/torchrun"'
    path = write_job_file(
        tmp_path,
        command=argv,
        run_dir=None,
        checkpoint_dir=None,
        job_keys=body,
        tables={"launch": f"torchrun = {torchrun}"},
    )
    return load_config(path)


def check(cfg: JobConfig) -> list[tuple[str, str]]:
    return [(i.key, i.message) for i in preflight(cfg)]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_preflight_creates_private_dirs_and_marker(tmp_path: Path) -> None:
    """A fresh job passes: run and checkpoint dirs made 0700, the marker 0600, no probe left."""
    cfg = write_job(tmp_path)
    assert check(cfg) == []
    assert mode(cfg.job.run_dir) == mode(cfg.job.checkpoint_dir) == 0o700
    assert os.listdir(cfg.job.run_dir) == []
    assert os.listdir(cfg.job.checkpoint_dir) == [CHECKPOINT_MARKER]
    assert mode(cfg.job.checkpoint_dir / CHECKPOINT_MARKER) == 0o600
    assert check(cfg) == []  # a second start accepts the directory it marked


def test_preflight_marks_an_existing_empty_checkpoint_dir(tmp_path: Path) -> None:
    """An empty private checkpoint directory gets the marker; rvsup-only entries are accepted."""
    cfg = write_job(tmp_path, 'checkpoint_dir = "ck"')
    (tmp_path / "ck").mkdir(mode=0o700)
    assert check(cfg) == []
    assert (tmp_path / "ck" / CHECKPOINT_MARKER).is_file()
    (tmp_path / "ck" / CHECKPOINT_MARKER).unlink()
    (tmp_path / "ck" / "step-0000000100").mkdir()
    (tmp_path / "ck" / ".tmp-step-0000000200-host1").mkdir()
    assert check(cfg) == []
    assert not (tmp_path / "ck" / CHECKPOINT_MARKER).exists()  # only new/empty dirs get one


def test_preflight_missing_torchrun(tmp_path: Path) -> None:
    """A launch.torchrun that does not exist is the one issue, keyed launch.torchrun."""
    cfg = write_job(tmp_path, torchrun='"gone/torchrun"')
    assert preflight(cfg) == [
        ConfigIssue("launch.torchrun", f"{tmp_path / 'gone' / 'torchrun'} does not exist")
    ]


@pytest.mark.parametrize(
    ("command", "files", "found"),
    [
        ('["rvsup-test-no-such-program", "x"]', [], False),
        ('["./run.sh"]', [], False),
        ('["./run.sh"]', ["run.sh"], True),
        ('["train.py"]', ["train.py"], True),
        ('["sh", "-c", "true"]', [], True),
    ],
)
def test_preflight_finds_the_program(
    tmp_path: Path, command: str, files: list[str], found: bool
) -> None:
    """command[0] must be on PATH or a file relative to workdir, else job.command[0] is reported."""
    for name in files:
        (tmp_path / name).write_text("")
    issues = check(write_job(tmp_path, command=command))
    assert [key for key, _ in issues] == ([] if found else ["job.command[0]"])


def test_preflight_uses_path_from_job_env(tmp_path: Path) -> None:
    """A program found only on the PATH given in [job] env counts as found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mytool").write_text("#!/bin/sh\n")
    (bin_dir / "mytool").chmod(0o755)
    assert check(write_job(tmp_path, f"env = {{ PATH = {str(bin_dir)!r} }}", '["mytool"]')) == []
    assert check(write_job(tmp_path, "", '["mytool"]'))[0][0] == "job.command[0]"


def test_preflight_missing_workdir_creates_nothing(tmp_path: Path) -> None:
    """A missing workdir is reported and not created as a side effect of making run_dir."""
    issues = check(write_job(tmp_path, 'workdir = "nowhere"'))
    assert [key for key, _ in issues] == ["job.workdir"]
    assert "does not exist" in issues[0][1]
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("key", ["run_dir", "checkpoint_dir"])
def test_preflight_uncreatable_dir(tmp_path: Path, key: str) -> None:
    """A directory that cannot be created (under a regular file) is reported with its key."""
    (tmp_path / "plain-file").write_text("x")
    issues = check(write_job(tmp_path, f'{key} = "plain-file/sub"'))
    assert [k for k, _ in issues] == [f"job.{key}"]
    assert "cannot create it" in issues[0][1]


def test_preflight_dir_that_is_a_file(tmp_path: Path) -> None:
    """A run_dir that exists as a regular file is not a directory."""
    (tmp_path / "runfile").write_text("x")
    assert check(write_job(tmp_path, 'run_dir = "runfile"')) == [
        ("job.run_dir", f"{tmp_path / 'runfile'} is not a directory")
    ]


@pytest.mark.parametrize("key", ["run_dir", "checkpoint_dir"])
@pytest.mark.parametrize("perm", [0o777, 0o770, 0o702])
def test_preflight_group_writable_dir(tmp_path: Path, key: str, perm: int) -> None:
    """A directory writable by group or others is refused, left as it was, and gets no marker."""
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(perm)
    [(issue_key, message)] = check(write_job(tmp_path, f'{key} = "shared"'))
    assert issue_key == f"job.{key}"
    assert message.startswith(f"{target} is writable by ")
    assert "chmod go-w it" in message
    assert mode(target) == perm
    assert os.listdir(target) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_preflight_dir_owned_by_someone_else(tmp_path: Path) -> None:
    """A checkpoint directory owned by another user is refused."""
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    os.chown(target, 54321, -1)
    [(key, message)] = check(write_job(tmp_path, 'checkpoint_dir = "theirs"'))
    assert key == "job.checkpoint_dir"
    assert "owned by uid 54321" in message


# the preflight of a job file, run with no capability at all: for root too, the permission bits
# then decide (no CAP_DAC_OVERRIDE), as they do for every other user
_PREFLIGHT_WITHOUT_CAPABILITIES = """
import ctypes, json, sys
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Sets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]
libc = ctypes.CDLL(None, use_errno=True)
if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Sets * 2)()) != 0:  # version 3: 64 bits
    raise OSError(ctypes.get_errno(), "capset")
from supervisor.config.load import load_config, preflight
print(json.dumps([(i.key, i.message) for i in preflight(load_config(sys.argv[1]))]))
"""


def test_preflight_read_only_dir(tmp_path: Path) -> None:
    """A run directory we cannot write to is refused (checked without privileges, also when
    the suite runs as root)."""
    target = tmp_path / "ro"
    target.mkdir(mode=0o500)
    cfg = write_job(tmp_path, 'run_dir = "ro"')
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PREFLIGHT_WITHOUT_CAPABILITIES, str(cfg.path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        target.chmod(0o700)
    [(key, message)] = json.loads(done.stdout)
    assert key == "job.run_dir"
    assert "not writable" in message


@pytest.mark.parametrize(
    ("foreign", "shown"),
    [
        (["notes.txt", "model.bin"], "(model.bin, notes.txt)"),
        (["a", "b", "c", "d", "step-12", ".rvsup-x"], "(.rvsup-x, a, b and 3 more)"),
    ],
)
def test_preflight_foreign_checkpoint_files(tmp_path: Path, foreign: list[str], shown: str) -> None:
    """Entries rvsup did not write are named (at most 3) and nothing is deleted or added."""
    ckpt = tmp_path / "ck"
    ckpt.mkdir(mode=0o700)
    (ckpt / "step-0000000100").mkdir()
    for name in foreign:
        (ckpt / name).write_text(name)
    before = sorted(os.listdir(ckpt))
    issues = check(write_job(tmp_path, 'checkpoint_dir = "ck"'))
    assert issues == [
        (
            "job.checkpoint_dir",
            (
                f"{ckpt} holds files rvsup did not write {shown}; "
                "use an empty directory or one rvsup created"
            ),
        )
    ]
    assert sorted(os.listdir(ckpt)) == before
    assert all((ckpt / name).read_text() == name for name in foreign)
