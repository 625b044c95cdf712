"""The job's metrics (`[metrics]`): fed from the history and the supervisor's view, served over
HTTP by the bounded server (test_metrics_http.py), written atomically to a text file; a port in
use refuses the start."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.load import parse_config
from supervisor.config.metrics import MetricsStartError
from supervisor.record import history
from supervisor.record.goodput import BADPUT_SOURCES, goodput_of
from supervisor.record.schema import (
    FailureDetected,
    RestartScheduled,
    ResumeUnverified,
    ResumeVerified,
)
from supervisor.service.metrics_catalog import METRICS
from tests.helpers.harness import rvsup
from tests.helpers.jobs import write_job_file

pytest.importorskip("prometheus_client", reason="needs the extra rvsup[metrics]")

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.service.metrics import JobMetrics

HISTORY = Path(__file__).parents[1] / "console" / "data" / "multi_failure.events.jsonl"


class Clock:
    """Wall time fixed after the recorded history; sleeps are real but short."""

    def monotonic(self) -> float:
        return 0.0

    def wall(self) -> float:
        return datetime(2027, 1, 1, tzinfo=timezone.utc).timestamp()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def config(tmp_path: Path, **metrics: str) -> Any:
    data = {"job": {"name": "toy", "command": ["python", "t.py"], "workdir": str(tmp_path)}}
    return parse_config({**data, "metrics": metrics}, tmp_path / "job.toml")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


VIEW = {
    "state": "running",
    "attempt": 4,
    "restarts_used": 3,
    "max_restarts": 4,
    "ranks": [
        {"rank": 0, "last_step": 140, "age_s": 0.2},
        {"rank": 1, "last_step": 141, "age_s": 0.3},
    ],
    "step_s": 0.08,
}


def test_history_and_view_become_the_documented_metrics(tmp_path: Path) -> None:
    """Seeded with a recorded history and refreshed from a view, the registry holds every
    documented metric with the history's counts and the goodput fold's figures."""
    m = JobMetrics(config(tmp_path, textfile="m.prom"), clock=Clock())
    entries = history.read(HISTORY).entries
    m.seed(entries)
    m.refresh(VIEW)
    got = samples(generate_latest(m.registry).decode())
    names = {name for name, _ in got}
    assert set(METRICS) <= names
    restarts = sum(isinstance(e.event, RestartScheduled) for e in entries)
    assert got[("rvsup_restarts_total", ())] == restarts == 3
    kinds = [e.event.kind for e in entries if isinstance(e.event, FailureDetected)]
    assert got[("rvsup_failures_total", (("kind", "crash"),))] == kinds.count("crash") == 2
    assert got[("rvsup_failures_total", (("kind", "hang"),))] == 1
    assert got[("rvsup_resumes_total", (("verdict", "diverged"),))] == 0  # none in this history
    assert got[("rvsup_checkpoints_total", (("tier", "storage"),))] == 15
    assert got[("rvsup_checkpoint_last_step", (("tier", "storage"),))] == 149
    assert got[("rvsup_checkpoint_bytes_total", (("tier", "storage"),))] > 0
    assert got[("rvsup_state", (("state", "running"),))] == 1
    assert got[("rvsup_state", (("state", "backoff"),))] == 0
    assert (got[("rvsup_attempt", ())], got[("rvsup_restarts_left", ())]) == (4, 1)
    assert got[("rvsup_rank_last_step", (("rank", "1"),))] == 141
    assert got[("rvsup_rank_heartbeat_age_seconds", (("rank", "0"),))] == 0.2
    assert got[("rvsup_step_seconds", ())] == 0.08
    good = goodput_of(entries, datetime(2027, 1, 1, tzinfo=timezone.utc))
    assert got[("rvsup_steps_redone", ())] == good.steps_redone == 13
    assert got[("rvsup_goodput_seconds", ())] == pytest.approx(good.goodput_s)
    for source in BADPUT_SOURCES:
        key = ("rvsup_badput_seconds", (("source", source),))
        assert got[key] == pytest.approx(good.badput_s[source])


def test_a_rank_gone_after_a_restart_is_no_longer_exported(tmp_path: Path) -> None:
    """A smaller world after a restart: the missing rank's series disappear."""
    m = JobMetrics(config(tmp_path, textfile="m.prom"), clock=Clock())
    m.refresh(VIEW)
    m.refresh({**VIEW, "ranks": VIEW["ranks"][:1]})  # type: ignore[index]
    got = samples(generate_latest(m.registry).decode())
    assert ("rvsup_rank_last_step", (("rank", "1"),)) not in got
    assert ("rvsup_rank_last_step", (("rank", "0"),)) in got


def test_events_logged_live_move_the_counters(tmp_path: Path) -> None:
    """An event observed after the seed counts at once (no refresh needed)."""
    m = JobMetrics(config(tmp_path, textfile="m.prom"), clock=Clock())
    m.observe(
        RestartScheduled(backoff_s=1, restarts_left=2, charged=True, deterministic=False, note=""),
        1,
    )
    assert samples(generate_latest(m.registry).decode())[("rvsup_restarts_total", ())] == 1


@pytest.mark.serial  # three refreshes within 0.3 s
def test_the_loop_writes_the_text_file_and_a_last_one_when_cancelled(tmp_path: Path) -> None:
    """Every interval the file is replaced whole (no temporary file left beside it); when the
    loop is cancelled at the job's end, the last view is written once more."""
    cfg = config(tmp_path, textfile="out/job.prom", interval="0.05s")
    m = JobMetrics(cfg, clock=Clock())
    m.serve()  # makes the folder
    views = iter([VIEW] * 3 + [{**VIEW, "state": "succeeded"}] * 100)

    async def main() -> None:
        task = asyncio.create_task(m.run(lambda: next(views)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    path = tmp_path / "out" / "job.prom"
    assert [p.name for p in path.parent.iterdir()] == ["job.prom"]
    got = samples(path.read_text())
    assert got[("rvsup_state", (("state", "succeeded"),))] == 1


@pytest.mark.serial  # six refreshes within 0.4 s
def test_a_failed_refresh_is_reported_and_the_loop_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A view that raises is reported once on stderr; the loop keeps refreshing after it."""
    m = JobMetrics(config(tmp_path, textfile="job.prom", interval="0.02s"), clock=Clock())
    calls = []

    def view() -> dict[str, Any]:
        calls.append(1)
        if len(calls) <= 3:
            raise KeyError("ranks")
        return {**VIEW, "attempt": len(calls)}

    async def main() -> None:
        task = asyncio.create_task(m.run(view))
        await asyncio.sleep(0.4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(calls) > 5
    assert capsys.readouterr().err.count("the metrics were not refreshed: KeyError('ranks')") == 1
    assert samples((tmp_path / "job.prom").read_text())[("rvsup_attempt", ())] == len(calls)


def test_endpoint_serves_and_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    """/metrics answers on the listen address; a second exporter on the same port is refused
    with the address and the reason."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    m = JobMetrics(config(tmp_path, listen=f"127.0.0.1:{port}"), clock=Clock())
    m.serve()
    try:
        m.refresh(VIEW)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert b'rvsup_state{state="running"} 1.0' in answer.read()
        other = JobMetrics(config(tmp_path, listen=f"127.0.0.1:{port}"), clock=Clock())
        with pytest.raises(MetricsStartError, match=rf"127\.0\.0\.1:{port}.*in use"):
            other.serve()
    finally:
        m.close()


@pytest.mark.process
def test_rvsup_start_refuses_a_port_in_use_before_launching(tmp_path: Path) -> None:
    """`rvsup start` with `listen` on a taken port exits 2 naming the key and launches nothing."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = write_job_file(
            tmp_path,
            command=[sys.executable, "-c", "pass"],
            tables={"metrics": f'listen = "127.0.0.1:{port}"'},
        )
        res = rvsup("start", str(job), timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"metrics.listen: cannot serve the metrics on 127.0.0.1:{port}" in res.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_resume_verdicts_are_counted(tmp_path: Path) -> None:
    """Each resume_* event counts once under its verdict."""
    m = JobMetrics(config(tmp_path, textfile="m.prom"), clock=Clock())
    m.observe(
        ResumeVerified(
            resume_step=5, first_step=5, last_step=9, values=10, ranks=2, exact=True, complete=True
        ),
        2,
    )
    m.observe(ResumeUnverified(resume_step=9, reason="nothing redone"), 3)
    m.observe(ResumeUnverified(resume_step=12, reason="nothing redone"), 4)
    got = samples(generate_latest(m.registry).decode())
    counts = {
        v: got[("rvsup_resumes_total", (("verdict", v),))]
        for v in ("verified", "diverged", "unverified")
    }
    assert counts == {"verified": 1, "diverged": 0, "unverified": 2}
