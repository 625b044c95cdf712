"""The job's history: structlog events, one JSON object per line in ``<run_dir>/events.jsonl``.

Every line carries ``timestamp`` (ISO-8601 UTC), ``event``, ``level``, ``job`` and ``attempt``.
The event names and their fields are a public contract (README.md, "History events"); each has a
typed method here so the supervisor cannot misspell one. The file is opened for appending, so a
requeued allocation or a second ``rvsup start`` continues the same history; each line is flushed
and fsynced before the method returns, so a crash of the daemon loses nothing already reported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import structlog
from structlog.typing import EventDict, WrappedLogger

EVENTS_FILE = "events.jsonl"


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
    def tee(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        if stream is not None:
            fields = " ".join(
                f"{k}={_short(v)}"
                for k, v in event_dict.items()
                if k not in ("event", "timestamp", "level", "job") and v not in (None, "", [], {})
            )
            print(f"rvsup[{event_dict['job']}] {event_dict['event']} {fields}", file=stream)
            stream.flush()
        return event_dict

    return tee


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


class EventLog:
    """Appends the job's events; ``attempt`` is stamped on every line."""

    def __init__(self, run_dir: Path, job: str, *, console: IO[str] | None = sys.stderr) -> None:
        self.path = run_dir / EVENTS_FILE
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

    def emit(self, event: str, *, level: str = "info", **fields: Any) -> None:
        """Write one event line (``fields`` must be JSON-serialisable)."""
        log = getattr(self._logger, level)
        log(event, job=self.job, attempt=self.attempt, **fields)

    def close(self) -> None:
        self._file.close()

    # ------------------------------------------------------------------ the documented events
    def job_started(self, **fields: Any) -> None:
        """A ``rvsup start`` began (fields: config, host, pid, slurm_job_id, restart_count)."""
        self.emit("job_started", **fields)

    def attempt_started(
        self, *, resume_step: int, checkpoint: str | None, launcher: Sequence[str], **fields: Any
    ) -> None:
        self.emit(
            "attempt_started",
            resume_step=resume_step,
            checkpoint=checkpoint,
            launcher=list(launcher),
            **fields,
        )

    def checkpoint_committed(
        self, *, step: int, path: str, seconds: float | None, nbytes: int, source: str
    ) -> None:
        self.emit(
            "checkpoint_committed",
            step=step,
            path=path,
            seconds=None if seconds is None else round(seconds, 4),
            bytes=nbytes,
            source=source,
        )

    def checkpoint_skipped(self, *, path: str, reason: str, rank: int | None) -> None:
        self.emit("checkpoint_skipped", level="warning", path=path, reason=reason, rank=rank)

    def failure_detected(
        self,
        *,
        kind: str,
        ranks: Sequence[int],
        exit_codes: Sequence[int],
        signals: Sequence[str],
        last_step: int | None,
        detail: str,
        diagnostics: str | None,
        detect_s: float | None,
        **fields: Any,
    ) -> None:
        self.emit(
            "failure_detected",
            level="error",
            kind=kind,
            ranks=list(ranks),
            exit_codes=list(exit_codes),
            signals=list(signals),
            last_step=last_step,
            detail=detail,
            diagnostics=diagnostics,
            detect_s=None if detect_s is None else round(detect_s, 4),
            **fields,
        )

    def restart_scheduled(
        self,
        *,
        backoff_s: float,
        restarts_left: int,
        charged: bool,
        deterministic: bool,
        note: str,
    ) -> None:
        self.emit(
            "restart_scheduled",
            level="warning",
            backoff_s=round(backoff_s, 3),
            restarts_left=restarts_left,
            charged=charged,
            deterministic=deterministic,
            note=note,
        )

    def job_succeeded(self, *, last_step: int | None) -> None:
        self.emit("job_succeeded", last_step=last_step)

    def job_gave_up(self, *, reason: str) -> None:
        self.emit("job_gave_up", level="error", reason=reason)

    def job_stopped(self, *, reason: str, requeued: bool, step: int | None, note: str = "") -> None:
        self.emit(
            "job_stopped", level="warning", reason=reason, requeued=requeued, step=step, note=note
        )

    def stop_requested(self, *, reason: str, source: str) -> None:
        self.emit("stop_requested", reason=reason, source=source)

    def messages_dropped(self, *, counts: dict[str, int]) -> None:
        self.emit("messages_dropped", level="warning", counts=counts)
