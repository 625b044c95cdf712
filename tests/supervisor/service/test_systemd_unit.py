"""systemd/rvsup@.service: systemd's own verifier accepts it, and its key settings hold."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT_FILE = Path(__file__).resolve().parents[3] / "systemd" / "rvsup@.service"
UNIT_BINARY = "/usr/local/bin/rvsup"  # the binary path the unit documents
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (Debian package: systemd)"
)

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections -> key -> every value in order, with systemd's rules for the parts used here.

    Comments (``#``, ``;``), backslash continuation lines, repeated keys appending, and an
    empty assignment resetting the list.
    """
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None:
            raise ValueError(f"not an assignment inside a section: {raw!r}")
        values = section.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()
    return unit


def timespan_s(text: str) -> float:
    """A systemd time span as used in the unit ("30s", "5min", "2h", "1min 30s") in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise ValueError(f"unsupported time span: {text!r}")
    return sum(float(n) * units[u or "s"] for n, u in parts)


@pytest.fixture(scope="module")
def unit() -> Unit:
    """The parsed unit file."""
    return parse_unit(UNIT_FILE.read_text())


def only(unit: Unit, section: str, key: str) -> str:
    """The single value of ``key``; fails when it is missing or set more than once."""
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= should be set once, got {values}"
    return values[0]


def tokens(unit: Unit, section: str, key: str) -> set[str]:
    """Every space-separated word of every value of ``key``."""
    return {word for value in unit.get(section, {}).get(key, []) for word in value.split()}


# ------------------------------------------------------------------ the tiny parser itself


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[A]\nK=v\n", {"A": {"K": ["v"]}}),
        ("# c\n; c\n[A]\n  K = v w  \n", {"A": {"K": ["v w"]}}),
        ("[A]\nK=1\nK=2\n", {"A": {"K": ["1", "2"]}}),
        ("[A]\nK=1\nK=\nK=3\n", {"A": {"K": ["3"]}}),
        ("[A]\nK=a \\\n  b\n", {"A": {"K": ["a  b"]}}),
        ("[A]\nK=x=y\n[B]\nK=z\n", {"A": {"K": ["x=y"]}, "B": {"K": ["z"]}}),
    ],
    ids=["plain", "comments-space", "repeat", "reset", "continuation", "sections"],
)
def test_parse_unit(text: str, expected: Unit) -> None:
    """parse_unit reads the unit syntax the assertions below rely on."""
    assert parse_unit(text) == expected


@pytest.mark.parametrize("text", ["K=v\n", "[A]\nno equals sign\n"], ids=["no-section", "no-eq"])
def test_parse_unit_rejects_garbage(text: str) -> None:
    """parse_unit refuses what it does not understand instead of guessing."""
    with pytest.raises(ValueError, match="not an assignment"):
        parse_unit(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("120s", 120), ("5min", 300), ("30min", 1800), ("2h", 7200), ("1min 30s", 90)],
)
def test_timespan_s(text: str, seconds: float) -> None:
    """timespan_s reads the systemd time spans used in the unit."""
    assert timespan_s(text) == seconds


# ------------------------------------------------------------------ key settings


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("Service", "Type", "notify"),
        ("Service", "NotifyAccess", "main"),
        ("Service", "KillMode", "mixed"),
        ("Service", "Restart", "on-failure"),
        ("Service", "OOMPolicy", "continue"),
        ("Service", "LimitMEMLOCK", "infinity"),
        ("Service", "TasksMax", "infinity"),
        ("Service", "NoNewPrivileges", "yes"),
        ("Install", "WantedBy", "multi-user.target"),
    ],
)
def test_unit_setting(unit: Unit, section: str, key: str, value: str) -> None:
    """Each setting the integration depends on has exactly the required value."""
    assert only(unit, section, key) == value


@pytest.mark.parametrize(
    ("section", "key", "required"),
    [
        ("Service", "RestartPreventExitStatus", {"2", "3"}),
        ("Service", "SuccessExitStatus", {"75"}),
        ("Service", "Environment", {"PYTHONUNBUFFERED=1"}),
        ("Unit", "After", {"network-online.target"}),
        ("Unit", "Wants", {"network-online.target"}),
    ],
)
def test_unit_list_contains(unit: Unit, section: str, key: str, required: set[str]) -> None:
    """List-valued settings include every required entry."""
    assert required <= tokens(unit, section, key)


@pytest.mark.parametrize(
    "key",
    [
        "PrivateTmp",
        "PrivateDevices",
        "DeviceAllow",
        "DevicePolicy",
        "ProtectHome",
        "ProtectClock",
        "ProtectKernelLogs",
        "MemoryDenyWriteExecute",
        "RestrictAddressFamilies",
        "PrivateNetwork",
    ],
)
def test_no_hardening_that_breaks_gpus_or_nccl(unit: Unit, key: str) -> None:
    """Sandboxing that hides GPUs, IPC sockets, home directories or RDMA is not switched on."""
    assert tokens(unit, "Service", key) <= {"no", "false", "0"}


def _systemd_restarts(unit: Unit, exit_status: int | None, signal: str | None) -> bool:
    """Whether Restart=on-failure restarts after the main process ended like this.

    Clean: exit 0, an exit status in SuccessExitStatus, or one of the signals systemd deems
    clean for a service; RestartPreventExitStatus always wins.
    """
    assert only(unit, "Service", "Restart") == "on-failure"
    status = str(exit_status) if exit_status is not None else str(signal)
    if status in tokens(unit, "Service", "RestartPreventExitStatus"):
        return False
    clean_signals = {"SIGHUP", "SIGINT", "SIGTERM", "SIGPIPE"}
    success = tokens(unit, "Service", "SuccessExitStatus")
    clean = exit_status == 0 or status in success or signal in clean_signals
    return not clean


@pytest.mark.parametrize(
    ("exit_status", "signal", "restarted"),
    [
        (0, None, False),  # job finished
        (75, None, False),  # stopped with a checkpoint (systemctl stop, rvsup stop)
        (3, None, False),  # rvsup gave up: its budget is spent
        (2, None, False),  # bad configuration: restarting cannot help
        (1, None, True),  # rvsup itself crashed (a Python traceback)
        (None, "SIGKILL", True),  # rvsup killed (host OOM, kill -9)
        (None, "SIGABRT", True),  # the watchdog fired: the event loop stalled
        (None, "SIGSEGV", True),
    ],
)
def test_restart_decision_per_exit(
    unit: Unit, exit_status: int | None, signal: str | None, restarted: bool
) -> None:
    """systemd restarts rvsup only when rvsup itself failed, never when rvsup decided."""
    assert _systemd_restarts(unit, exit_status, signal) is restarted


def test_start_limit_can_trigger(unit: Unit) -> None:
    """A crash loop hits the start limit: the burst of restarts fits into the interval."""
    assert "StartLimitIntervalSec" not in unit["Service"]  # [Unit] is where systemd reads it
    interval = timespan_s(only(unit, "Unit", "StartLimitIntervalSec"))
    burst = int(only(unit, "Unit", "StartLimitBurst"))
    restart_s = timespan_s(only(unit, "Service", "RestartSec"))
    assert burst >= 2
    assert restart_s * burst < interval


def test_timeouts_leave_room(unit: Unit) -> None:
    """Stopping allows a checkpoint; the watchdog is coarse enough to be pinged from a busy loop."""
    assert timespan_s(only(unit, "Service", "TimeoutStopSec")) >= 60
    assert timespan_s(only(unit, "Service", "WatchdogSec")) >= 10
    assert timespan_s(only(unit, "Service", "TimeoutStartSec")) >= 60


def test_exec_lines_validate_then_start_the_same_job(unit: Unit) -> None:
    """ExecStartPre validates and ExecStart starts the same job file, named by the instance."""
    pre = unit["Service"]["ExecStartPre"]
    assert len(pre) == 1
    pre_argv = shlex.split(pre[0])
    start_argv = shlex.split(only(unit, "Service", "ExecStart"))
    assert pre_argv[:2] == [UNIT_BINARY, "validate"]
    assert start_argv[:2] == [UNIT_BINARY, "start"]
    assert len(pre_argv) == len(start_argv) == 3
    job = pre_argv[2]
    assert start_argv[2] == job
    assert job.endswith("/%i.toml")
    assert only(unit, "Service", "WorkingDirectory") == os.path.dirname(job)


# ------------------------------------------------------------------ systemd-analyze verify


def _verify(unit_text: str, directory: Path) -> tuple[int, list[str]]:
    """Run systemd-analyze verify on a copy whose binary exists; (status, lines naming it)."""
    assert SYSTEMD_ANALYZE is not None
    binary = directory / "rvsup"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    assert unit_text.count(UNIT_BINARY) >= 2  # ExecStartPre and ExecStart both point at it
    copy = directory / UNIT_FILE.name
    copy.write_text(unit_text.replace(UNIT_BINARY, str(binary)))
    # Works without a running systemd: verify loads units in a private test manager.
    env = {
        **os.environ,
        "SYSTEMD_LOG_LEVEL": "info",  # make sure warnings (unknown keys) are printed
        "SYSTEMD_LOG_TARGET": "console",
        "SYSTEMD_LOG_COLOR": "0",
        "SYSTEMD_PAGER": "",
    }
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    output = (proc.stdout + proc.stderr).splitlines()
    # Keep complaints about this unit only; ignore any about the distribution's own units.
    about_unit = [line for line in output if "rvsup@" in line]
    return proc.returncode, about_unit


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_unit(tmp_path: Path) -> None:
    """systemd's verifier loads the unit without a single warning about it."""
    status, complaints = _verify(UNIT_FILE.read_text(), tmp_path)
    assert complaints == []
    assert status == 0


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("find", "replace", "complaint"),
    [
        ("[Service]\n", "[Service]\nKilMode=mixed\n", "KilMode"),
        ("Type=notify\n", "Type=notfy\n", "notfy"),
        ("KillMode=mixed\n", "KillMode=mixd\n", "mixd"),
        ("RestartPreventExitStatus=2 3\n", "RestartPreventExitStatus=2 three\n", "three"),
        ("LimitMEMLOCK=infinity\n", "LimitMEMLOCK=lots\n", "lots"),
        ("[Install]\n", "[Instal]\n", "'Instal'"),
    ],
    ids=["misspelt-key", "bad-type", "bad-killmode", "bad-exit-status", "bad-limit", "bad-section"],
)
def test_systemd_analyze_verify_reports_mistakes(
    tmp_path: Path, find: str, replace: str, complaint: str
) -> None:
    """A typo in a directive, a value or a section makes the verification complain."""
    text = UNIT_FILE.read_text()
    assert text.count(find) == 1
    _, complaints = _verify(text.replace(find, replace), tmp_path)
    assert any(complaint in line for line in complaints), complaints
