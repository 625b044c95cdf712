"""The job's history: structlog events, one JSON object per line in ``<run_dir>/events.jsonl``.

Every line carries ``timestamp`` (ISO-8601 UTC), ``event``, ``level``, ``job`` and ``attempt``,
then the fields of one :mod:`supervisor.record.schema` event: :meth:`EventLog.log` takes nothing
else, so an event name, field or level cannot be misspelt. The file is opened for appending, so
a requeued allocation or a second ``rvsup start`` continues the same history; each line is
flushed and fsynced before :meth:`~EventLog.log` returns, so a crash of the daemon loses nothing
already reported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import structlog
from structlog.typing import EventDict, WrappedLogger

from supervisor.record import schema
from supervisor.record.rundir import EVENTS_FILE
from supervisor.record.schema import Event

__all__ = ["EventLog"]


class _DurableWriter:
    """A structlog logger that appends a line, flushes and fsyncs it."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file

    def msg(self, message: str) -> None:
        self._file.write(message + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    info = warning = error = msg


def _console_tee(stream: IO[str] | None) -> Any:
    """A processor that shows each event as one line on ``stream``, until writing to it fails
    (a pipe whose reader left, ``| head``; a closed terminal): then the console is dropped and
    the history goes on, in its file."""
    console = [stream] if stream is not None else []

    def tee(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        for out in console:
            fields = " ".join(
                f"{k}={_short(v)}"
                for k, v in event_dict.items()
                if k not in ("event", "timestamp", "level", "job") and v not in (None, "", [], {})
            )
            try:
                print(f"rvsup[{event_dict['job']}] {event_dict['event']} {fields}", file=out)
                out.flush()
            except (OSError, ValueError):  # EPIPE, EIO; ValueError: the stream was closed
                console.clear()
        return event_dict

    return tee


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


class EventLog:
    """Appends the job's events; ``attempt`` is stamped on every line.

    :attr:`on_log`, if set, is called with each event once its line is on disk: the supervisor
    folds it into its budget there, so that no event logged, by whichever part, is missed.
    """

    def __init__(
        self,
        run_dir: Path,
        job: str,
        *,
        console: IO[str] | None = sys.stderr,
        on_log: Callable[[Event], None] | None = None,
    ) -> None:
        self.path = run_dir / EVENTS_FILE
        self.on_log = on_log
        """Called with each event after its line is written (may be set after construction)."""
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self.attempt = 0
        self._logger = structlog.wrap_logger(
            _DurableWriter(self._file),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                _console_tee(console),
                structlog.processors.JSONRenderer(default=str),
            ],
            context_class=dict,
            cache_logger_on_first_use=False,
        )
        self.job = job

    def log(self, event: Event, *, attempt: int | None = None) -> None:
        """Append one event (with this log's ``job`` and current ``attempt``, or the given one),
        flushed and fsynced, then hand it to ``on_log``."""
        write = getattr(self._logger, event.LEVEL)
        number = self.attempt if attempt is None else attempt
        write(event.NAME, job=self.job, attempt=number, **schema.to_json(event))
        if self.on_log is not None:
            self.on_log(event)

    def close(self) -> None:
        self._file.close()
