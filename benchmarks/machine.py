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


def _installed(venv: str | None, distribution: str) -> str:
    """``name-version`` of a distribution in a peer's virtualenv, or why not."""
    if not venv:
        return "not used"
    pattern = f"lib/python*/site-packages/{distribution}-*.dist-info"
    found = sorted(p.name for p in Path(venv).glob(pattern))
    return found[0].removesuffix(".dist-info") if found else f"not found in {venv}"


def describe(nvrx_venv: str | None, torchft_venv: str | None = None) -> dict[str, Any]:
    """Facts about this machine, for the header and the JSON."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "pyzmq": _version("pyzmq"),
        "nvidia_resiliency_ext": _installed(nvrx_venv, "nvidia_resiliency_ext"),
        "torchft": _installed(torchft_venv, "torchft"),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def render(info: dict[str, Any]) -> str:
    return (
        f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, "
        f"Linux {info['kernel']}; Python {info['python']}, torch {info['torch']}, "
        f"pyzmq {info['pyzmq']}, NVRx {info['nvidia_resiliency_ext']}, "
        f"torchft {info.get('torchft', 'not used')}; "
        f"load average at start {info['load_avg_at_start']}"
    )
