"""torch's flight recorder in a hang's diagnostics: the ranks record collectives by default, a
rank's thread dumps on a byte written to its FIFO, the supervisor asks and reads."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from supervisor.config.load import load_config
from supervisor.process import diagnostics
from supervisor.process.launch_plan import build_plan
from tests.helpers.jobs import write_job_file
from worker_sdk.contract import protocol as p
from worker_sdk.runtime import flight as _flight


def plan_env(tmp_path: Path, env: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """The environment of attempt 1 of a job whose [job] env is ``env``."""
    path = write_job_file(
        tmp_path,
        command=["./train.sh"],
        run_dir=None,
        checkpoint_dir=None,
        env=env,
        job_keys='workdir = "."',
    )
    plan = build_plan(
        load_config(path), attempt=1, torchrun="/x/torchrun", rank_env={}, base_env=base
    )
    return dict(plan.env)


@pytest.mark.parametrize(
    ("job_env", "base_env", "expected"),
    [
        ({}, {}, {"TORCH_FR_BUFFER_SIZE": "2000"}),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, {}, {"TORCH_FR_BUFFER_SIZE": "0"}),
        ({}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}),
    ],
)
def test_ranks_record_collectives_unless_the_job_says_otherwise(
    tmp_path: Path, job_env: dict[str, str], base_env: dict[str, str], expected: dict[str, str]
) -> None:
    """rvsup gives the ranks a 2000-entry flight recorder; a size the job or its environment
    sets (0 turns it off) is left as it is, under either of torch's names."""
    env = plan_env(tmp_path, job_env, base_env)
    assert {k: env[k] for k in p.FLIGHT_RECORDER_ENV if k in env} == expected


@pytest.mark.parametrize(
    ("env", "recording"),
    [
        ({}, False),
        ({"TORCH_FR_BUFFER_SIZE": "2000"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, False),
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "lots"}, False),
    ],
)
def test_recording(env: dict[str, str], recording: bool) -> None:
    """The current variable wins over NCCL's older one; a size that is not a number records
    nothing (as torch reads it)."""
    assert _flight.recording(env) is recording


def test_nobody_serves_without_a_reader(tmp_path: Path) -> None:
    """No FIFO: the rank serves no dump (False); a FIFO nobody reads now: ask again later (None);
    both at once instead of blocking."""
    assert diagnostics.request_flight(tmp_path, 0) is False
    os.mkfifo(tmp_path / p.flight_fifo_file(0))
    assert diagnostics.request_flight(tmp_path, 0) is None


def test_a_request_is_answered_with_a_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank armed with recording on answers every request with a complete JSON dump of torch's
    flight recorder, in place by rename; the thread is a daemon and blocks between requests."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    thread = _flight.arm(tmp_path, 3)
    assert isinstance(thread, threading.Thread) and thread.daemon
    out = tmp_path / p.flight_file(3)
    seen: set[tuple[int, int]] = {(0, 0)}
    for _ in range(2):
        assert wait_for(lambda: diagnostics.request_flight(tmp_path, 3))
        assert wait_for(lambda: identity(out) not in seen)
        seen.add(identity(out))
        doc = json.loads(out.read_text())
        assert "pg_status" in doc and "version" in doc
    assert diagnostics.read_flights(tmp_path, 4) == {3: out.read_text()}
    assert not list(tmp_path.glob("*.tmp"))


def test_not_armed_when_nothing_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording off: no thread, no FIFO; the supervisor's request finds nobody."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert _flight.arm(tmp_path, 0) is None
    assert not (tmp_path / p.flight_fifo_file(0)).exists()


def identity(path: Path) -> tuple[int, int]:
    """The file's inode and modification time, (0, 0) while it does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0, 0)
    return st.st_ino, st.st_mtime_ns


def wait_for(condition: object, timeout: float = 10.0) -> bool:
    """Poll ``condition`` (a callable) until it is true or ``timeout`` seconds passed."""
    import time

    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
