"""``rvsup --version``: rvsup's version, Python's, and torch's where it can be told without
importing it (package metadata: rvsup's own environment, and the ``python`` a job's
``command = ["python", ...]`` would run, when that is another interpreter)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys

__all__ = ["version_text"]

_ASK_TORCH = (
    "import importlib.metadata as m, sys\n"
    "try: print(m.version('torch'))\n"
    "except m.PackageNotFoundError: print('not installed')\n"
)
_ASK_TIMEOUT_S = 10.0


def version_text() -> str:
    lines = [
        f"rvsup {_version('rvsup') or 'unknown (not installed as a package)'}",
        f"Python {platform.python_version()} ({sys.executable})",
        f"torch {_version('torch') or 'not installed'} (beside rvsup)",
    ]
    python = shutil.which("python") or shutil.which("python3")
    if python is not None and os.path.realpath(python) != os.path.realpath(sys.executable):
        lines.append(f"torch {_torch_of(python)} (the python on PATH: {python})")
    return "\n".join(lines) + "\n"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_of(python: str) -> str:
    """torch's version in another interpreter's environment, read from its metadata."""
    try:
        done = subprocess.run(
            [python, "-c", _ASK_TORCH],
            capture_output=True,
            text=True,
            timeout=_ASK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    answer = done.stdout.strip()
    return answer if done.returncode == 0 and answer else "unknown"
