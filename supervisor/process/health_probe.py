"""The health checks of one node: ``python -m supervisor.process.health_probe SPEC_JSON``.

Run once on every node of a round (:mod:`supervisor.process.health`); measures, judges nothing
(:func:`supervisor.rules.health.judge` does), and prints one JSON line that
:func:`supervisor.rules.health.parse_probe` reads: the node's name (``SLURMD_NODENAME``, else the
host name), whether a file can be written in the checkpoint directory and its free space, the
free space of ``/dev/shm``, ``MemAvailable``, the GPUs ``nvidia-smi -L`` lists (or why not),
and how the configured command ended. The command runs in its own process group, which is
killed (SIGKILL) when the timeout runs out. SPEC_JSON: ``{"checkpoint_dir", "command",
"timeout_s", "cwd"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from worker_sdk.contract.protocol import node_name

__all__ = ["measure", "run_command"]

_OUTPUT_BYTES = 4000
_NVIDIA_SMI_TIMEOUT_S = 20.0


def _free(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _checkpoint(path: str) -> tuple[str, int | None]:
    """(why the directory is not writable or "", its free bytes)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rvsup-health-") as file:
            file.write(b"rvsup")
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        return f"{exc.strerror or exc} ({path})", _free(path)
    return "", _free(path)


def memory_available(meminfo: str) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``'s text, in bytes; None when it has none."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            number, _, unit = value.strip().partition(" ")
            if number.isdigit():
                return int(number) * (1024 if unit.strip() == "kB" else 1)
    return None


def read_memory_available() -> int | None:
    """This machine's ``MemAvailable`` in bytes (None: it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            return memory_available(file.read())
    except (OSError, ValueError):
        return None


def _gpus() -> tuple[int | None, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi is not installed on this node"
    try:
        done = subprocess.run(
            [smi, "-L"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return 0, f"nvidia-smi exited with {done.returncode}: {done.stderr.strip()[-200:]}"
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()), ""


def run_command(argv: list[str], timeout_s: float, cwd: str | None) -> dict[str, Any]:
    """Run ``argv`` in a new process group; at ``timeout_s`` the whole group is SIGKILLed.
    How it ended, as the probe's ``command`` object."""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return {"exit_code": None, "error": f"{exc.strerror or exc}: {argv[0]!r}"}
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        output, _ = proc.communicate()
    _kill_group(proc.pid)  # what it left behind in its group
    text = output[-_OUTPUT_BYTES:].decode(errors="replace")
    return {"exit_code": proc.returncode, "timed_out": timed_out, "output": text}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):  # the group is gone
        os.killpg(pgid, signal.SIGKILL)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Everything this node measures, as the probe's JSON object (module docstring)."""
    start = time.monotonic()
    node = node_name(os.environ.get("SLURMD_NODENAME"), socket.gethostname())
    error, free = _checkpoint(str(spec["checkpoint_dir"]))
    gpus, gpus_skipped = _gpus()
    out: dict[str, Any] = {
        "node": node,
        "checkpoint_error": error,
        "checkpoint_free": free,
        "shm_free": _free("/dev/shm"),
        "memory_available": read_memory_available(),
        "gpus": gpus,
        "gpus_skipped": gpus_skipped,
    }
    command = spec.get("command") or []
    if command:
        out["command"] = run_command(list(command), float(spec["timeout_s"]), spec.get("cwd"))
    out["seconds"] = time.monotonic() - start
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m supervisor.process.health_probe SPEC_JSON", file=sys.stderr)
        return 2
    print(json.dumps(measure(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
