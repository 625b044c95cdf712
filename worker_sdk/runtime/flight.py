"""torch's flight recorder, dumped on the supervisor's request while the rank hangs.

With ``TORCH_FR_BUFFER_SIZE`` (or NCCL's older ``TORCH_NCCL_TRACE_BUFFER_SIZE``) above 0, c10d
records every collective a rank enqueues, gloo included (torch >= 2.7), with per group the last
collective enqueued and the last completed. The dump is Python (``_dump_fr_trace_json``), which
a signal handler cannot run while the main thread blocks in a collective: a daemon thread of the
rank waits instead, blocked in ``open()`` of a FIFO in the diagnostics folder (no wake-ups, no
cost while nothing happens). The supervisor opens the FIFO (non-blocking: a rank without a
reader is skipped), writes one byte, and the thread writes ``rank-NNNNN.flight.json``, complete
or not at all (a rename). The thread needs the GIL, which a rank waiting in a collective or
sleeping releases; a rank spinning in Python answers at the next switch interval, a stopped one
once continued.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from worker_sdk.contract import protocol as p
from worker_sdk.contract import threads

__all__ = ["arm", "recording"]


def recording(env: Mapping[str, str]) -> bool:
    """Whether c10d records collectives in a process with environment ``env``."""
    for name in p.FLIGHT_RECORDER_ENV:
        value = env.get(name)
        if value is not None:
            try:
                return int(value) > 0
            except ValueError:
                return False
    return False


def _dumper() -> Callable[[], bytes] | None:
    """torch's JSON dump of the flight recorder, or None where this torch has none."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None

    def json_bytes() -> bytes:
        text = dump(True, False)  # includeCollectives, onlyActive
        return text if isinstance(text, bytes) else str(text).encode()

    return json_bytes


def arm(directory: Path, rank: int) -> threading.Thread | None:
    """Serve flight-recorder dumps of this rank into ``directory`` from now on; None (nothing
    armed) when collectives are not recorded or this torch cannot dump them."""
    dump = _dumper() if recording(os.environ) else None
    if dump is None:
        return None
    fifo = directory / p.flight_fifo_file(rank)
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()  # a previous attempt's (its reader is gone)
    os.mkfifo(fifo, 0o600)
    thread = threading.Thread(
        target=_serve,
        args=(fifo, directory / p.flight_file(rank), dump),
        name="rvsup-flight-recorder",
        daemon=True,
    )
    thread.start()
    threads.name_os_thread(thread, "flight")
    return thread


def _serve(fifo: Path, out: Path, dump: Callable[[], bytes]) -> None:
    """Answer every request on ``fifo`` with a fresh dump at ``out``, until the FIFO is gone."""
    tmp = out.with_name(out.name + ".tmp")
    while True:
        try:
            with open(fifo, "rb") as requests:  # blocks until the supervisor opens it
                if not requests.read(1):
                    continue
        except OSError:
            return  # the FIFO was removed: the diagnostics folder is gone
        try:
            tmp.write_bytes(dump())
            tmp.replace(out)
        except Exception:  # noqa: BLE001 - a failed dump must never take the rank down
            with contextlib.suppress(OSError):
                tmp.unlink()
