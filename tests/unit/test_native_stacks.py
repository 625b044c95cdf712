"""Native stacks by py-spy: found beside rvsup's interpreter or on PATH, bounded by a deadline
(py-spy killed and reaped), and a file that says why when there are no stacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.ranks import native


def script(path: Path, body: str) -> str:
    """An executable shell script at ``path``."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_found_beside_the_interpreter_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-spy in rvsup's own environment wins over one on PATH; without either, None."""
    venv, elsewhere = tmp_path / "venv" / "bin", tmp_path / "elsewhere"
    venv.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    assert native.find_py_spy(path=str(tmp_path / "nothing")) is None
    on_path = script(elsewhere / "py-spy", "exit 0")
    assert native.find_py_spy(path=str(elsewhere)) == on_path
    beside = script(venv / "py-spy", "exit 0")
    assert native.find_py_spy(path=str(elsewhere)) == beside


def test_a_failing_py_spy_says_why(tmp_path: Path) -> None:
    """Not permitted (ptrace), or any other failure: the file carries py-spy's own words."""
    fake = script(tmp_path / "py-spy", 'echo "Permission denied (os error 1)" >&2; exit 1')
    out = tmp_path / native.native_file(1)
    assert not native.dump_native(fake, os.getpid(), out)
    assert out.read_text() == "py-spy failed (exit 1): Permission denied (os error 1)\n"


def test_a_failed_native_dump_is_tried_again_then_python_stacks_are_kept(tmp_path: Path) -> None:
    """py-spy fails a whole --native dump when one thread's frames do not line up (a moment's
    state): it is tried once more, and when that fails too the Python-only dump is written under
    py-spy's reason, without the backtrace py-spy appends when RUST_BACKTRACE is set."""
    tries = tmp_path / "tries"
    stacks = "Process 1: python\nPython v3.11\n\nThread 1 (idle): MainThread\n    main (t.py:1)\n"
    fake = script(
        tmp_path / "py-spy",
        f"""echo "$@" >> {tries}
case "$*" in *--native*)
  printf 'Error: Failed to merge native and python frames\n\nStack backtrace:\n  0: main\n' >&2
  exit 1;;
esac
printf '{stacks}'""",
    )
    out = tmp_path / native.native_file(0)
    assert native.dump_native(fake, 1, out)
    assert out.read_text() == (
        "no native stacks: py-spy failed (exit 1): "
        "Error: Failed to merge native and python frames\nPython stacks only:\n" + stacks
    )
    assert tries.read_text().splitlines() == [
        "dump --native --pid 1",
        "dump --native --pid 1",
        "dump --pid 1",
    ]


def test_a_native_dump_that_fails_once_is_kept_from_the_second_try(tmp_path: Path) -> None:
    """One failed --native dump (or one without any thread) is followed by a second, whose
    stacks are written as they are."""
    tries = tmp_path / "tries"
    stacks = "Process 1: python\n\nThread 1 (idle): MainThread\n    main (native.c)\n"
    fake = script(
        tmp_path / "py-spy",
        f"""echo "$@" >> {tries}
[ "$(wc -l < {tries})" -gt 1 ] || {{ printf 'Process 1: python\n'; exit 0; }}
printf '{stacks}'""",
    )
    out = tmp_path / native.native_file(0)
    assert native.dump_native(fake, 1, out)
    assert out.read_text() == stacks
    assert len(tries.read_text().splitlines()) == 2


def test_a_stuck_py_spy_is_killed_at_its_deadline(tmp_path: Path) -> None:
    """A py-spy that never answers is killed and reaped at the deadline; the file says so."""
    marker = f"rvsup-test-stuck-{os.getpid()}"
    fake = script(
        tmp_path / "py-spy", f"exec {sys.executable} -c 'import time; time.sleep(60)' {marker}"
    )
    out = tmp_path / native.native_file(0)
    t0 = time.monotonic()
    assert not native.dump_native(fake, os.getpid(), out, timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    assert out.read_text() == "py-spy gave no stacks within 0.5 s\n"
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def test_real_native_stacks_of_a_sleeping_process(tmp_path: Path) -> None:
    """With py-spy installed (the test extra installs it), a child's dump has its threads and the
    C frames under Python's sleep."""
    py_spy = native.find_py_spy()
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        out = tmp_path / native.native_file(0)
        assert native.dump_native(py_spy, child.pid, out), out.read_text()
        text = out.read_text()
        assert f"Process {child.pid}" in text and "Thread" in text, text
        assert "sleep" in text, text
    finally:
        child.kill()
        child.wait()
