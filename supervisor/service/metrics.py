"""The job's metrics for Prometheus (``[metrics]``, docs/metrics.md; extra ``rvsup[metrics]``).

:class:`JobMetrics` holds the metrics in a registry of its own. It is fed two ways, neither of
which blocks the daemon's loop:

- every event the history logs (:meth:`JobMetrics.observe`, called after its line is on disk):
  the counters (restarts, failures by kind, checkpoints by tier) move, and the event is kept for
  the goodput fold;
- every ``interval`` (:meth:`JobMetrics.run`, a loop beside the supervisor): the gauges are set
  from the supervisor's status (state, attempt, budget, per-rank steps and heartbeat ages, step
  time) and the goodput is folded again (:mod:`supervisor.record.goodput`, the same numbers as
  ``rvsup history``); then the text file, if any, is written in a worker thread.

Setting a value takes prometheus-client's lock for a moment, never I/O. The HTTP endpoint is
a bounded server in threads of its own (:mod:`supervisor.service.metrics_http`: so many
connections at once, so long and so large a request, whoever the client is); the text file is
written to a temporary file and renamed over the old one (prometheus-client's
``write_to_textfile``), so node_exporter never reads half a file.

The counters count the whole history of the job (they are seeded from ``events.jsonl`` at the
daemon's start), so they match ``rvsup history``; a new daemon starts them again from there.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import write_to_textfile

from supervisor.config.metrics import MetricsStartError, split_listen
from supervisor.config.model import JobConfig
from supervisor.loops import SYSTEM_CLOCK, Clock
from supervisor.record.entries import Entry
from supervisor.record.goodput import BADPUT_SOURCES, Goodput, goodput_of
from supervisor.record.history_file import format_timestamp
from supervisor.record.schema import (
    CheckpointCommitted,
    Event,
    FailureDetected,
    RestartScheduled,
    ResumeDiverged,
    ResumeUnverified,
    ResumeVerified,
)
from supervisor.rules.states import JobState
from supervisor.service.metrics_catalog import METRICS
from supervisor.service.metrics_http import MetricsServer

__all__ = ["JobMetrics"]


class JobMetrics:
    """The metrics of one daemon's job."""

    def __init__(self, cfg: JobConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.cfg = cfg
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._m: dict[str, Any] = {}
        for name, (kind, text, labels) in METRICS.items():
            cls = Counter if kind == "counter" else Gauge
            # prometheus-client appends _total to a counter's name itself
            self._m[name] = cls(name.removesuffix("_total"), text, labels, registry=self.registry)
        for verdict in ("verified", "diverged", "unverified"):  # 0 until one is seen
            self._m["rvsup_resumes_total"].labels(verdict=verdict)
        self._entries: list[Entry] = []
        self._ranks: set[str] = set()
        self._server: MetricsServer | None = None
        self._write_failed = False
        self._reported = ""

    # ------------------------------------------------------------------ serving

    def serve(self) -> None:
        """Start the HTTP endpoint (``listen``), if any, and make the text file's folder;
        raises :class:`MetricsStartError`."""
        textfile = self.cfg.metrics.textfile
        if textfile is not None:
            try:
                textfile.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise MetricsStartError(
                    f"metrics.textfile: cannot make {textfile.parent}: {exc.strerror or exc}"
                ) from None
        listen = self.cfg.metrics.listen
        if listen is None:
            return
        host, port = split_listen(listen)
        try:
            self._server = MetricsServer(host, port, self.registry)
        except OSError as exc:
            raise MetricsStartError(
                f"metrics.listen: cannot serve the metrics on {listen}: "
                f"{exc.strerror or exc} (is another job or exporter using that port?)"
            ) from None

    def close(self) -> None:
        """Stop the HTTP endpoint, if any (within about a second, slow clients or not)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    # ------------------------------------------------------------------ feeding

    def seed(self, entries: Iterable[Entry]) -> None:
        """The history so far (read at the daemon's start)."""
        for entry in entries:
            self._entries.append(entry)
            self._count(entry.event)

    def observe(self, event: Event, attempt: int) -> None:
        """One event just logged in ``attempt`` (from ``EventLog.on_log``)."""
        now = datetime.datetime.fromtimestamp(self.clock.wall(), datetime.timezone.utc)
        self._entries.append(Entry(format_timestamp(now), attempt, self.cfg.job.name, event))
        self._count(event)

    def _count(self, event: Event) -> None:
        m = self._m
        if isinstance(event, RestartScheduled):
            m["rvsup_restarts_total"].inc()
        elif isinstance(event, FailureDetected):
            m["rvsup_failures_total"].labels(kind=event.kind or "unknown").inc()
        elif isinstance(event, ResumeVerified | ResumeDiverged | ResumeUnverified):
            verdict = event.NAME.removeprefix("resume_")
            m["rvsup_resumes_total"].labels(verdict=verdict).inc()
        elif isinstance(event, CheckpointCommitted):
            tier = str(getattr(event, "tier", None) or "storage")
            m["rvsup_checkpoints_total"].labels(tier=tier).inc()
            m["rvsup_checkpoint_seconds_total"].labels(tier=tier).inc(max(0.0, event.seconds or 0))
            m["rvsup_checkpoint_bytes_total"].labels(tier=tier).inc(max(0, event.bytes))
            blocked = event.blocked_s
            if blocked is None and event.mode != "async":
                blocked = event.seconds
            m["rvsup_checkpoint_blocked_seconds_total"].labels(tier=tier).inc(
                max(0.0, blocked or 0)
            )
            m["rvsup_checkpoint_last_step"].labels(tier=tier).set(event.step)

    def refresh(self, status: Mapping[str, Any]) -> None:
        """Set the gauges from the supervisor's view (``state``, ``attempt``, ``restarts_used``,
        ``max_restarts``, ``ranks``: ``rank``, ``last_step``, ``age_s``; ``step_s``) and fold
        the goodput again (on this thread: the loop folds it in a worker thread)."""
        self._set_live(status)
        self.set_goodput(goodput_of(self._entries, self._now()))

    def _set_live(self, status: Mapping[str, Any]) -> None:
        m = self._m
        for state in JobState:
            m["rvsup_state"].labels(state=state.value).set(state.value == status.get("state"))
        m["rvsup_attempt"].set(status.get("attempt") or 0)
        used = int(status.get("restarts_used") or 0)
        m["rvsup_restarts_used"].set(used)
        m["rvsup_restarts_left"].set(max(0, int(status.get("max_restarts") or 0) - used))
        seen = set()
        for rank in status.get("ranks", ()):
            label = str(rank["rank"])
            seen.add(label)
            if rank["last_step"] >= 0:
                m["rvsup_rank_last_step"].labels(rank=label).set(rank["last_step"])
            m["rvsup_rank_heartbeat_age_seconds"].labels(rank=label).set(rank["age_s"])
        for gone in self._ranks - seen:  # a smaller world after a restart
            m["rvsup_rank_last_step"].remove(gone)
            m["rvsup_rank_heartbeat_age_seconds"].remove(gone)
        self._ranks = seen
        if status.get("step_s") is not None:
            m["rvsup_step_seconds"].set(status["step_s"])

    def _now(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.clock.wall(), datetime.timezone.utc)

    def set_goodput(self, good: Goodput) -> None:
        """Set the goodput gauges from a fold of the history."""
        m = self._m
        m["rvsup_steps_redone"].set(good.steps_redone)
        m["rvsup_wall_seconds"].set(good.wall_s)
        m["rvsup_goodput_seconds"].set(good.goodput_s)
        m["rvsup_goodput_ratio"].set(good.fraction or 0.0)
        for source in BADPUT_SOURCES:
            m["rvsup_badput_seconds"].labels(source=source).set(good.badput_s[source])

    def write_textfile(self) -> None:
        """Replace the text file (blocking I/O: call it from a worker thread)."""
        path = self.cfg.metrics.textfile
        if path is None:
            return
        try:
            write_to_textfile(str(path), self.registry)
        except OSError as exc:  # a full disk: the job goes on, the file is retried next time
            if not self._write_failed:
                print(f"rvsup: cannot write the metrics to {path}: {exc}", file=sys.stderr)
            self._write_failed = True
        else:
            self._write_failed = False

    async def run(self, view: Callable[[], Mapping[str, Any]]) -> None:
        """Refresh from ``view()`` every ``interval`` until cancelled: the live gauges on the
        loop, the goodput folded and the file written in a worker thread; once more, with the
        file, when cancelled at the job's end. A failure to refresh is reported, never the end
        of the job."""
        try:
            while True:
                try:
                    self._set_live(view())
                    entries, now = tuple(self._entries), self._now()
                    self.set_goodput(await asyncio.to_thread(goodput_of, entries, now))
                    if self.cfg.metrics.textfile is not None:
                        await asyncio.to_thread(self.write_textfile)
                except Exception as exc:  # noqa: BLE001 -- metrics must not end the training
                    self._report(f"rvsup: the metrics were not refreshed: {exc!r}")
                await self.clock.sleep(self.cfg.metrics.interval_s)
        finally:
            try:
                self.refresh(view())
            except Exception as exc:  # noqa: BLE001 -- the job has ended: say so, end quietly
                self._report(f"rvsup: the metrics were not refreshed: {exc!r}")
            self.write_textfile()  # the job's last word; the loop has nothing else to do now

    def _report(self, text: str) -> None:
        if text != self._reported:
            print(text, file=sys.stderr)
        self._reported = text
