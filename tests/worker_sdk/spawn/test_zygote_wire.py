"""The zygote's rules and framing (worker_sdk.spawn.zygote_wire), from tables."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from worker_sdk.spawn import zygote_wire as wire

PY = sys.executable


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A working directory with a script, a package and an interpreter link of another venv."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    other = tmp_path / "other-venv" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(os.path.realpath(PY))
    return tmp_path


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (["train.py", "--lr", "1"], wire.Program("train.py", False, ("--lr", "1"), False)),
        (["-u", "train.py"], wire.Program("train.py", False, (), True)),
        (["-m", "pkg.main", "-x"], wire.Program("pkg.main", True, ("-x",), False)),
        (["-u", "-mpkg", "a"], wire.Program("pkg", True, ("a",), True)),
        (["-c", "print(1)"], "interpreter option -c"),
        (["-X", "dev", "train.py"], "interpreter option -X"),
        (["-O", "train.py"], "interpreter option -O"),
        (["-m"], "-m without a module"),
        ([], "no script"),
        (["-"], "no script"),
        (["missing.py"], "script 'missing.py' not found"),
    ],
)
def test_parse_command(job: Path, tail: list[str], expected: wire.Program | str) -> None:
    """The zygote serves `python [-u] script` and `python [-u] -m module` and says why not for
    anything a fork of a started interpreter cannot honour."""
    got = wire.parse_command([PY, *tail], str(job), os.environ.get("PATH"), PY)
    if isinstance(expected, str):
        assert isinstance(got, str)
        assert expected in got
    else:
        assert got == expected


def test_parse_command_other_interpreter(job: Path) -> None:
    """Another virtualenv's python links to the same binary but is not the zygote's
    interpreter; a name is looked up on the rank's PATH; an unknown program is named."""
    other = job / "other-venv" / "bin" / "python"
    got = wire.parse_command([str(other), "train.py"], str(job), None, PY)
    assert isinstance(got, str)
    assert "is not the zygote's interpreter" in got
    by_name = wire.parse_command(["python", "train.py"], str(job), str(Path(PY).parent), PY)
    assert isinstance(by_name, wire.Program)
    missing = wire.parse_command(["nopython", "train.py"], str(job), str(job), PY)
    assert missing == "'nopython' not found"


@pytest.mark.parametrize(
    ("rank", "zygote", "expected"),
    [
        ({"A": "1", "PATH": "/x"}, {"A": "2", "PATH": "/y"}, []),
        ({"PYTHONHASHSEED": "1"}, {}, ["PYTHONHASHSEED"]),
        ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}, ["OMP_NUM_THREADS"]),
        ({"LD_PRELOAD": "x.so", "LANG": "C"}, {"LANG": "C.UTF-8"}, ["LANG", "LD_PRELOAD"]),
        ({"TORCH_LOGS": "+dynamo"}, {}, ["TORCH_LOGS"]),
        ({"TORCHELASTIC_RUN_ID": "a", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, {}, []),
        ({"TORCH_FR_BUFFER_SIZE": "2000"}, {}, []),
        ({"LC_ALL": "C"}, {"LC_ALL": "C"}, []),
    ],
)
def test_import_env_differences(
    rank: dict[str, str], zygote: dict[str, str], expected: list[str]
) -> None:
    """Only variables read while Python starts or torch imports make a rank start cold; torch's
    run-time ones (which torchrun sets per rank) do not."""
    assert wire.import_env_differences(rank, zygote) == expected


def test_messages_carry_fds() -> None:
    """A message arrives whole, with the fds sent with it (new numbers, same files)."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wire.send(a, {"argv": ["x"] * 50_000}, fds=(w,))
        message, fds = wire.recv(b)
        assert message == {"argv": ["x"] * 50_000}
        assert len(fds) == 1
        assert fds[0] != w
        os.write(fds[0], b"ok")
        assert os.read(r, 2) == b"ok"
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "connection closed"),
        (b"\x05\x00\x00\x00ab", "connection closed"),
        (b"\xff\xff\xff\x7f", "bytes"),
        (b"\x02\x00\x00\x00[]", "not a JSON object"),
        (b"\x02\x00\x00\x00{x", "Expecting"),
    ],
)
def test_broken_messages(raw: bytes, reason: str) -> None:
    """A message cut short, too long or not a JSON object is a WireError, and the fds that came
    with it are closed."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        if raw:
            socket.send_fds(a, [raw], [w])
        a.shutdown(socket.SHUT_WR)
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(wire.WireError, match=reason):
            wire.recv(b)
        assert set(os.listdir("/proc/self/fd")) <= before
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
