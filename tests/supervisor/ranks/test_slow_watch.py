"""The hang rule's evidence, gathered from real processes: /proc and faulthandler's stacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor.ranks.slow import MIN_WINDOW_S, STACKS_CAP_BYTES, SlowWatch
from supervisor.rules.stuck import Stuck
from tests.helpers.slow_storage import slow_storage
from worker_sdk.contract import protocol as p

pytestmark = pytest.mark.process  # ranks stood in for by real processes

# a stand-in for c10d: a function whose file sits under torch/distributed/ (the stacks say so)
COLLECTIVE = "import threading\ndef all_reduce():\n    threading.Event().wait()\n"
READY = "print('ready', flush=True)\n"
BODIES = {
    "spin": f"{READY}while True:\n    pass",
    "sleep": f"import time\n{READY}time.sleep(3600)",
    "lock": f"import threading\nl = threading.Lock()\nl.acquire()\n{READY}l.acquire()",
    "stop": f"import os, signal, time\n{READY}os.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(3600)",
    # the main thread waits on a thread of its own: on its future, on a queue it feeds
    "future": (
        "import time\nfrom concurrent.futures import ThreadPoolExecutor\n"
        f"{READY}ThreadPoolExecutor(1).submit(time.sleep, 3600).result()"
    ),
    "queue": (
        "import queue, threading, time\nq = queue.Queue()\n"
        "threading.Thread(target=lambda: (time.sleep(3600), q.put(1)), daemon=True).start()\n"
        f"{READY}q.get()"
    ),
    # ... on a thread of its own reading a socket (an upload waiting for its answer), or working
    "future-socket": (
        "import socket\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "a, b = socket.socketpair()\n"
        f"{READY}ThreadPoolExecutor(1).submit(a.recv, 1).result()"
    ),
    "future-busy": (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "def spin():\n    while True:\n        pass\n"
        f"{READY}ThreadPoolExecutor(1).submit(spin).result()"
    ),
    # a checkpoint written to slow storage: write() returns, close() flushes in state D; or the
    # same write in a thread of its own that the main thread waits on
    "storage": (
        "import sys\nfrom pathlib import Path\n"
        "f = open(Path(sys.argv[1]).parents[3] / 'slow' / 'ckpt.bin', 'wb')\n"
        f"f.write(bytes(1 << 16))\n{READY}f.close()"
    ),
    "future-storage": (
        "import sys\nfrom concurrent.futures import ThreadPoolExecutor\nfrom pathlib import Path\n"
        "def save():\n"
        "    with open(Path(sys.argv[1]).parents[3] / 'slow' / 'ckpt.bin', 'wb') as f:\n"
        "        f.write(bytes(1 << 16))\n"
        f"{READY}ThreadPoolExecutor(1).submit(save).result()"
    ),
    # ... on an event nobody sets, beside rvsup's flight-recorder thread (which waits on its FIFO)
    "event-beside-flight": (
        "import os, sys, threading\nfrom pathlib import Path\n"
        "os.environ['TORCH_FR_BUFFER_SIZE'] = '10'\nfrom worker_sdk.runtime import flight\n"
        "assert flight.arm(Path(sys.argv[1]).parent, 0) is not None\n"
        f"{READY}threading.Event().wait()"
    ),
    # ... on a future whose thread is itself blocked on a lock the main thread holds: a deadlock
    "deadlocked-future": (
        "import threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "l = threading.Lock()\nl.acquire()\n"
        f"{READY}ThreadPoolExecutor(1).submit(l.acquire).result()"
    ),
    "collective": (
        "import sys\nns = {}\npath = sys.argv[1]\n"
        "exec(compile(open(path).read(), path, 'exec'), ns)\n"
        f"{READY}ns['all_reduce']()"
    ),
}


@contextmanager
def ranks(tmp: Path, kinds: Sequence[str], *, dumps: bool = True) -> Iterator[dict[int, int]]:
    """Processes doing ``kinds`` (rank = index), each with faulthandler armed on the dump signal
    into its stacks file as the SDK arms it (unless ``dumps`` is false); pid -> rank."""
    fake = tmp / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "c10d.py").write_text(COLLECTIVE)
    procs = []
    try:
        for rank, kind in enumerate(kinds):
            arm = (
                "import faulthandler, signal\n"
                f"f = open({str(tmp / p.stacks_file(rank))!r}, 'a')\n"
                f"faulthandler.register({int(p.DUMP_SIGNAL)}, file=f, all_threads=True)\n"
                if dumps
                else ""
            )
            code = f"{arm}{BODIES[kind]}\n"
            proc = subprocess.Popen(
                [sys.executable, "-c", code, str(fake / "c10d.py")],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(0.3)  # into the blocking call (or stopped)
        yield {proc.pid: rank for rank, proc in enumerate(procs)}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def judged(
    tmp: Path, pids: dict[int, int], *, idle_cap_s: float | None = None
) -> tuple[SlowWatch, Stuck | None]:
    """Open a window, wait for it, and judge at the timeout."""
    watch = SlowWatch(tmp, cap_s=60.0, idle_cap_s=idle_cap_s)
    t0 = time.monotonic()
    assert watch.review(t0, hung=False, silent_s=4.0, review_s=5.0, pids=pids) is None
    time.sleep(MIN_WINDOW_S + 0.3)
    now = time.monotonic()
    return watch, watch.review(now, hung=True, silent_s=5.0, review_s=5.0, pids=pids)


@pytest.mark.parametrize(
    ("kinds", "busy", "says"),
    [
        (["spin", "collective"], (0,), "rank 0 is working"),  # rank 1 waits for it
        (["sleep", "collective"], (0,), "rank 0 is waiting on its own"),  # a sleep in user code
        (["spin", "spin"], (0, 1), "rank 1 is working"),
        (["future", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["queue", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["future-socket", "collective"], (0,), "rank 0 is waiting on a thread of its own"),
        (["future-busy", "collective"], (0,), "rank 0 is working"),  # its thread uses the CPU
    ],
)
def test_a_working_rank_opens_a_slow_phase(
    tmp_path: Path, kinds: list[str], busy: tuple[int, ...], says: str
) -> None:
    """Real processes: a rank that spins, sleeps, or waits on a thread of its own that sleeps
    (its future, a queue it feeds), reads a socket or works, outside a collective, is busy, not
    stuck: no hang, a slow phase naming it and what it does, recorded once the silence ends."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is None
    assert watch.phase is not None and watch.phase.ranks == busy
    assert says in watch.phase.detail, watch.phase.detail
    event = watch.close(time.monotonic(), finished=True)
    assert event is not None and event.ranks == busy and event.seconds >= 5.0
    assert "<string>" in event.where, event


@pytest.mark.parametrize(
    ("kinds", "stuck_ranks", "says"),
    [
        (["lock", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["deadlocked-future", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["event-beside-flight", "collective"], (0,), "rank 0 is blocked on a lock"),
        (["stop", "collective"], (0,), "rank 0 is stopped by a signal"),
        (["collective", "collective"], (), "wait in collectives"),
    ],
)
def test_a_stuck_group_is_a_hang_at_the_timeout(
    tmp_path: Path, kinds: list[str], stuck_ranks: tuple[int, ...], says: str
) -> None:
    """Real processes: a deadlock on a lock (also one between the main thread and the thread it
    waits on, and a wait on an event nobody sets beside rvsup's own thread, which a rank's wait
    never counts on), a stopped process, every rank in a collective: stuck at the timeout, no
    slow phase."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is not None and stuck.ranks == stuck_ranks and says in stuck.detail, stuck
    assert watch.phase is None


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("storage", "rank 0 is waiting on storage (state D)"),
        ("future-storage", "rank 0 is waiting on a thread of its own"),
    ],
)
def test_a_write_to_slow_storage_is_an_idle_wait(tmp_path: Path, kind: str, says: str) -> None:
    """Real processes on a file system whose server takes 4 s per write: a rank flushing its
    checkpoint there (close() in state D, no CPU), or waiting on a thread of its own that does,
    is busy, not stuck, and waits on its own: bounded by hang_timeout_idle."""
    with slow_storage(tmp_path / "slow", 4.0), ranks(tmp_path, [kind, "collective"]) as pids:
        watch, stuck = judged(tmp_path, pids)
    assert stuck is None, stuck
    phase = watch.phase
    assert phase is not None and phase.ranks == (0,) and says in phase.detail, phase
    assert phase.idle_t is not None, phase  # no rank works: the idle bound applies


def test_a_rank_that_cannot_dump_is_not_signalled(tmp_path: Path) -> None:
    """A rank without the dump handler (before resume()) is not sent the dump signal, which
    would kill it: it lives on, judged from /proc alone (sleeping: its own wait)."""
    with ranks(tmp_path, ["sleep"], dumps=False) as pids:
        watch, stuck = judged(tmp_path, pids)
        alive = [pid for pid in pids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
    assert alive == list(pids)
    assert stuck is None and watch.phase is not None and watch.phase.ranks == (0,)


def test_a_slow_phase_is_a_hang_at_its_cap(tmp_path: Path) -> None:
    """Busy ranks are judged again each review, and are a hang once the silence lasts cap_s."""
    with ranks(tmp_path, ["spin", "collective"]) as pids:
        watch, stuck = judged(tmp_path, pids)
        assert stuck is None and watch.phase is not None
        cap = watch.phase.cap_t
        late = watch.review(cap, hung=True, silent_s=60.0, review_s=5.0, pids=pids)
    assert late is not None and "ran for hang_timeout_max (60s)" in late.detail
    assert watch.note == late.detail


@pytest.mark.parametrize(
    ("kinds", "idle"),
    [(["sleep", "collective"], True), (["spin", "collective"], False)],
    ids=["asleep", "working"],
)
def test_an_idle_wait_is_a_hang_at_hang_timeout_idle(
    tmp_path: Path, kinds: list[str], idle: bool
) -> None:
    """A rank asleep outside collectives (its own wait, no CPU) is a hang once its silence
    reaches the idle bound (20 s here), not the cap (60 s); a working rank is not, and is
    judged by the cap alone."""
    with ranks(tmp_path, kinds) as pids:
        watch, stuck = judged(tmp_path, pids, idle_cap_s=20.0)
        assert stuck is None and watch.phase is not None
        start = watch.phase.start_t
        shown = watch.status(start + 10.0)
        at_idle = watch.review(start + 20.0, hung=True, silent_s=20.0, review_s=5.0, pids=pids)
    assert shown is not None and shown["silent_s"] == 10.0
    if idle:
        assert shown["hang_at_s"] == 20.0 and shown["bound"] == "hang_timeout_idle", shown
        assert at_idle is not None and at_idle.ranks == (0,)
        assert "waited on its own, using no CPU, for hang_timeout_idle (20s)" in at_idle.detail
    else:
        assert shown["hang_at_s"] == 60.0 and shown["bound"] == "hang_timeout_max", shown
        assert at_idle is None


def test_a_full_stacks_file_is_not_added_to(tmp_path: Path) -> None:
    """A rank whose stacks file has grown to the cap (a job that keeps coming close to its
    timeout) is not asked for more stacks: judged from /proc alone."""
    with ranks(tmp_path, ["sleep"]) as pids:
        stacks = tmp_path / p.stacks_file(0)
        os.truncate(stacks, STACKS_CAP_BYTES)
        watch, stuck = judged(tmp_path, pids)
    assert stacks.stat().st_size == STACKS_CAP_BYTES
    assert stuck is None and watch.phase is not None and watch.phase.where == "no stack"
