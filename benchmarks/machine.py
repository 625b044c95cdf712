"""The machine a run measured: CPU model, cores, memory, kernel, Python and torch versions, load."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe(nvrx_venv: str | None) -> dict[str, Any]:
    """Facts about this machine, for the header and the JSON."""
    nvrx = "not used"
    if nvrx_venv:
        pattern = "lib/python*/site-packages/nvidia_resiliency_ext-*.dist-info"
        found = sorted(p.name for p in Path(nvrx_venv).glob(pattern))
        nvrx = found[0].removesuffix(".dist-info") if found else f"not found in {nvrx_venv}"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "pyzmq": _version("pyzmq"),
        "nvidia_resiliency_ext": nvrx,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def render(info: dict[str, Any]) -> str:
    return (
        f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, "
        f"Linux {info['kernel']}; Python {info['python']}, torch {info['torch']}, "
        f"pyzmq {info['pyzmq']}, NVRx {info['nvidia_resiliency_ext']}; "
        f"load average at start {info['load_avg_at_start']}"
    )
