"""A process that gets away from the test that started it, for the leftover guard's own tests
(tests/test_process_guard.py, tests/helpers/guard_probe.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psutil

from tests.helpers.harness import wait_for

# forks; the child starts a session of its own and forks again; the grandchild replaces itself
# with a sleeper whose environment is empty (no marker) and says its pid; both parents exit
ESCAPE = textwrap.dedent(
    """
    import os, sys
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
    os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"], {})
    """
)


def leak_an_escaped_process(tmp_path: Path) -> int:
    """A double-forked, ``setsid()``-ed sleeper with an empty environment; its pid."""
    pid_file = tmp_path / f"escaped-{uuid.uuid4().hex}"
    subprocess.run([sys.executable, "-c", ESCAPE, str(pid_file)], check=True, timeout=30)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=10, what="pid"))
    wait_for(lambda: psutil.Process(pid).environ() == {}, timeout=10, what="the exec")
    assert os.getsid(pid) != os.getsid(0), "it left our session"
    # orphaned once its parent has exited (which a loaded machine may run after the exec)
    wait_for(lambda: psutil.Process(pid).ppid() == os.getpid(), timeout=10, what="re-parenting")
    return pid


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
