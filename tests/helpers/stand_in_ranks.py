"""Processes that stand in for ranks in the hang rule's tests: each does one kind of wait or
work, with faulthandler armed on the dump signal into its stacks file as the SDK arms it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from worker_sdk.contract import protocol as p

__all__ = ["BODIES", "ranks"]

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
