"""The health probe on this machine, with real processes: a failing command's status and
output, a command that hangs (and leaves a child behind) killed with its whole group at the
timeout, a command that cannot start, and the probe's own JSON line judged healthy here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.process.health_probe import measure, run_command
from supervisor.rules.health import Needs, judge, parse_probe

pytestmark = pytest.mark.process


def test_a_failing_command_reports_its_status_and_output() -> None:
    """exit 3 after printing to stdout and stderr: both are kept, in order."""
    result = run_command(["sh", "-c", "echo disk ok; echo ECC errors >&2; exit 3"], 10.0, None)
    assert result == {"exit_code": 3, "timed_out": False, "output": "disk ok\nECC errors\n"}


@pytest.mark.serial  # killed within 5 s
def test_a_hanging_command_is_killed_with_its_group_at_the_timeout(tmp_path: Path) -> None:
    """A command that starts a background sleeper and then hangs is killed at 1 s, its child
    too (the group is SIGKILLed), and counts as timed out."""
    pid_file = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pid_file}; echo started; sleep 300"
    begin = time.monotonic()
    result = run_command(["sh", "-c", script], 1.0, None)
    took = time.monotonic() - begin
    assert result["timed_out"] is True
    assert result["exit_code"] == -9
    assert result["output"] == "started\n"
    assert 1.0 <= took < 5.0
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5.0
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the command's child outlived its timeout"
        time.sleep(0.05)


def test_a_command_that_cannot_start_says_why(tmp_path: Path) -> None:
    """A program that does not exist is an error, not an exit status."""
    result = run_command([str(tmp_path / "no-such-check")], 5.0, None)
    assert result["exit_code"] is None
    assert "No such file or directory" in result["error"]


def test_the_probe_as_a_program_prints_one_line_judged_healthy_here(tmp_path: Path) -> None:
    """`python -m supervisor.process.health_probe SPEC` prints one JSON line: this node, a
    writable checkpoint directory with free space, /dev/shm and memory measured, the GPUs
    counted or skipped with a reason, the command's result; it reads back and judges healthy
    for modest needs, and unhealthy for needs no machine has."""
    spec = {"checkpoint_dir": str(tmp_path / "ckpt"), "command": ["true"], "timeout_s": 5.0}
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.process.health_probe", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = done.stdout.splitlines()
    probe = parse_probe(line)
    assert probe is not None
    here = parse_probe(json.dumps(measure(spec)))  # the same, measured in this process
    assert here is not None and (here.node, here.gpus) == (probe.node, probe.gpus)
    assert probe.checkpoint_error == "" and (probe.checkpoint_free or 0) > 0
    assert probe.memory_available is not None and probe.shm_free is not None
    assert probe.gpus is not None or probe.gpus_skipped
    assert probe.command is not None and probe.command.exit_code == 0
    assert list((tmp_path / "ckpt").iterdir()) == []  # the test file is gone
    assert judge(probe, Needs(checkpoint_free=1, memory_free=1 << 20)).healthy
    huge = judge(probe, Needs(checkpoint_free=1 << 60, memory_free=1 << 60))
    assert set(huge.failed) == {"checkpoint_dir", "memory"}


def test_gpus_are_counted_from_nvidia_smi_or_skipped_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An nvidia-smi on PATH that lists two GPUs counts 2 (a job needing 4 is unhealthy); one that
    fails counts 0 with its message; with none on PATH the check is skipped, saying why."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = {"checkpoint_dir": str(tmp_path / "ckpt"), "command": [], "timeout_s": 5.0}
    probe = parse_probe(json.dumps(measure(spec)))
    assert probe is not None and probe.gpus == 2
    assert judge(probe, Needs(gpus=4)).failed == {
        "gpus": "2 GPUs listed by nvidia-smi, the job needs 4"
    }
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: driver not loaded' >&2\nexit 9\n")
    broken = parse_probe(json.dumps(measure(spec)))
    assert broken is not None and broken.gpus == 0
    assert "driver not loaded" in judge(broken, Needs(gpus=1)).failed["gpus"]
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    absent = parse_probe(json.dumps(measure(spec)))
    assert absent is not None and absent.gpus is None
    assert judge(absent, Needs(gpus=1)).skipped == {
        "gpus": "nvidia-smi is not installed on this node"
    }
