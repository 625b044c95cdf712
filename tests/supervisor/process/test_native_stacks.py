"""Native stacks by py-spy: found beside rvsup's interpreter or on PATH, bounded by a deadline
(py-spy killed and reaped), and a file that says why when there are no stacks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.process import activity, native
from supervisor.rules import culprits
from tests.helpers.harness import wait_for

pytestmark = pytest.mark.process  # sleepers, and py-spy attached to them


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


@pytest.mark.serial  # killed within 5 s
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


def test_py_spys_json_is_rendered_as_faulthandler_prints_it() -> None:
    """The threads of ``py-spy dump --json`` become faulthandler's text, the main thread (its
    OS thread id is the pid) first as ``Current thread``, innermost frame first, which the
    culprit rules read; anything else is no stacks."""
    dump = json.dumps(
        [
            {
                "thread_id": 7,
                "os_thread_id": 12,
                "frames": [{"name": "run", "filename": "/w.py", "line": 3}],
            },
            {
                "thread_id": 255,
                "os_thread_id": 11,
                "frames": [
                    {"name": "f", "filename": "/t.py", "line": 3},
                    {"name": "<module>", "filename": "/t.py", "line": 9},
                ],
            },
        ]
    )
    text = native.faulthandler_text(dump, 11)
    assert text == (
        "Current thread 0x00000000000000ff (most recent call first):\n"
        '  File "/t.py", line 3 in f\n'
        '  File "/t.py", line 9 in <module>\n'
        "\n"
        "Thread 0x0000000000000007 (most recent call first):\n"
        '  File "/w.py", line 3 in run\n'
    )
    assert [(f.file, f.line, f.func) for f in culprits.main_thread(text)] == [
        ("/t.py", 3, "f"),
        ("/t.py", 9, "<module>"),
    ]
    assert native.faulthandler_text("Error: no", 11) is None
    assert native.faulthandler_text("[]", 11) is None
    assert native.faulthandler_text('[{"frames": 3}]', 11) is None


def test_a_stopped_process_is_read_and_stays_stopped(tmp_path: Path) -> None:
    """With py-spy, a process stopped by SIGSTOP has its Python stacks read without being
    continued: the file starts with the header that says so, its main thread's frames are
    there, and the process is still stopped afterwards."""
    py_spy = native.find_py_spy()
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    script = tmp_path / "sleeper.py"
    script.write_text("import time\n\ndef waits():\n    time.sleep(60)\n\nwaits()\n")
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: activity.is_stopped(child.pid), timeout=10, what="the child stopped")
        stacks, why = tmp_path / "rank.stacks", tmp_path / "rank.native"
        assert native.dump_stopped(py_spy, child.pid, stacks, why), why.read_text()
        text = stacks.read_text()
        assert text.startswith(native.STOPPED_HEADER), text
        assert [f.func for f in culprits.main_thread(text)][:2] == ["waits", "<module>"], text
        assert "stopped by a signal" in why.read_text()
        assert activity.is_stopped(child.pid)
    finally:
        child.kill()
        child.wait()


STACKS = "Process 1: python\nPython v3.11\n\nThread 1 (idle): MainThread\n    main (t.py:1)\n"


def _sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(n)
    ]


def _end(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        child.kill()
        child.wait()


def test_early_native_stacks_are_moved_in_when_the_hang_is_declared(tmp_path: Path) -> None:
    """Native stacks taken while a hang is confirmed: once it is declared, each rank's file is in
    the diagnostics folder, headed with how long before the declaration it was taken, and the
    staging folder is gone; a stopped rank is left for the declaration (py-spy cannot read it)."""
    fake = script(tmp_path / "py-spy", f"printf '{STACKS}'")
    diag = tmp_path / "diag"
    children = _sleepers(3)
    try:
        os.kill(children[2].pid, signal.SIGSTOP)
        while not activity.is_stopped(children[2].pid):
            time.sleep(0.01)
        early = native.EarlyNative(fake, diag)
        ranks = {c.pid: r for r, c in enumerate(children)}

        async def confirm() -> frozenset[int]:
            early.start(ranks, now=100.0)
            assert early.pending
            return await early.take(diag, now=101.5)

        taken = asyncio.run(confirm())
    finally:
        _end(children)
    assert taken == {0, 1}
    assert sorted(f.name for f in diag.iterdir()) == [native.native_file(0), native.native_file(1)]
    text = (diag / native.native_file(0)).read_text()
    assert text.startswith("(native stacks taken 1.5 s before the hang was declared"), text
    assert text.endswith(STACKS)
    assert not early.pending


def test_early_native_stacks_of_ranks_that_went_on_are_dropped(tmp_path: Path) -> None:
    """The ranks went on before the timeout: the early dumps are discarded once they end, a
    declaration later finds none, and none is taken again for RETAKE_AFTER_S."""
    gate = tmp_path / "gate"
    fake = script(tmp_path / "py-spy", f"while [ ! -e {gate} ]; do sleep 0.01; done; printf x")
    diag = tmp_path / "diag"
    children = _sleepers(1)
    try:
        early = native.EarlyNative(fake, diag)

        async def go_on() -> frozenset[int]:
            early.start({children[0].pid: 0}, now=10.0)
            early.drop(now=11.0)  # while py-spy is still reading
            gate.touch()
            for _ in range(500):
                await asyncio.sleep(0.01)
                if not (diag / ".native-early").exists():
                    break
            early.start({children[0].pid: 0}, now=11.0 + native.RETAKE_AFTER_S - 1)
            assert not early.pending  # too soon after the last
            return await early.take(diag, now=12.0)

        assert asyncio.run(go_on()) == frozenset()
    finally:
        _end(children)
    assert not diag.exists() or not any(diag.iterdir())
    assert native.RETAKE_AFTER_S >= 10 * native.LEAD_S


def test_a_rank_without_early_native_stacks_is_left_to_the_declaration(tmp_path: Path) -> None:
    """py-spy gave no stacks for a rank while the hang was confirmed (a loaded machine, a
    moment's state): that rank is not counted as taken, so the declaration tries again."""
    fake = script(
        tmp_path / "py-spy",
        f"""case "$*" in *"--pid {{pid}}"*) echo "Error: nope" >&2; exit 1;; esac
printf '{STACKS}'""",
    )
    children = _sleepers(2)
    try:
        text = Path(fake).read_text().replace("{pid}", str(children[1].pid))
        Path(fake).write_text(text)
        early = native.EarlyNative(fake, tmp_path / "diag")

        async def confirm() -> frozenset[int]:
            early.start({c.pid: r for r, c in enumerate(children)}, now=0.0)
            return await early.take(tmp_path / "diag", now=2.0)

        assert asyncio.run(confirm()) == {0}
    finally:
        _end(children)
    assert [f.name for f in (tmp_path / "diag").iterdir()] == [native.native_file(0)]
