"""A real Prometheus scrapes a live job under `rvsup start` that crashes twice; what it saw
matches the history."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import events, named, reaped, rvsup, wait_for, write_job

pytestmark = pytest.mark.process

PROMETHEUS = shutil.which("prometheus")
pytest.importorskip("prometheus_client", reason="needs the extra rvsup[metrics]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def query(base: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector Prometheus answers for ``promql`` (its HTTP API)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def value(base: str, promql: str) -> float | None:
    result = query(base, promql)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (tests/run.sh installs it as root)"
)
def test_prometheus_sees_the_restarts_the_history_records(tmp_path: Path) -> None:
    """Prometheus scraping `[metrics] listen` every second saw 2 restarts and 2 crashes, the
    attempts, steps and goodput, as the history records them; the text file ends with the job's
    end."""
    job_port, prom_port = free_port(), free_port()
    job = write_job(
        tmp_path,
        total=90,
        env={"FAULT": "raise:1:8:1,raise:0:20:2", "STEP_SLEEP": "0.1"},
        restart='max_restarts = 3\nbackoff = "1s"\nbackoff_max = "2s"',
    )
    job.write_text(
        job.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{job_port}"\ninterval = "0.5s"\n'
        'textfile = "metrics/job.prom"\n'
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: rvsup\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{job_port}']\n"
    )
    assert PROMETHEUS is not None
    with (tmp_path / "prometheus.log").open("w") as log:
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    base = f"http://127.0.0.1:{prom_port}"
    with reaped(prom):

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        wait_for(ready, timeout=60, what="prometheus ready", interval=0.2)
        res = rvsup("start", str(job), timeout=300)
        assert res.returncode == 0, res.stderr
        evs = events(tmp_path / "run")
        restarts = len(named(evs, "restart_scheduled"))
        crashes = [f for f in named(evs, "failure_detected") if f["kind"] == "crash"]
        assert (restarts, len(crashes)) == (2, 2)
        window = "[10m]"
        # the scrape of the third attempt, queryable once Prometheus has stored it
        wait_for(
            lambda: value(base, f"max_over_time(rvsup_attempt{window})") == 3,
            timeout=30,
            what="the third attempt's samples in Prometheus",
            interval=0.2,
        )
        assert value(base, f"max_over_time(rvsup_restarts_total{window})") == restarts
        crashed = f'max_over_time(rvsup_failures_total{{kind="crash"}}{window})'
        assert value(base, crashed) == len(crashes)
        assert value(base, f"max_over_time(rvsup_attempt{window})") == 3
        assert value(base, f"max_over_time(rvsup_restarts_used{window})") == restarts
        last = value(base, f'max_over_time(rvsup_rank_last_step{{rank="0"}}{window})')
        assert last is not None and last >= 60  # scraped while the third attempt ran
        ratio = value(base, f"max_over_time(rvsup_goodput_ratio{window})")
        assert ratio is not None and 0 < ratio < 1
        redone = value(base, f"max_over_time(rvsup_steps_redone{window})")
        assert redone is not None and redone > 0
        saved = value(base, f'max_over_time(rvsup_checkpoints_total{{tier="storage"}}{window})')
        assert saved is not None and saved > 0
        # the text file's last version is the job's end, written once more as it ended
        final = (tmp_path / "metrics" / "job.prom").read_text()
        assert 'rvsup_state{state="succeeded"} 1.0' in final
        assert f"rvsup_restarts_total {float(restarts)}" in final
        prom.terminate()
        prom.wait(timeout=30)
