"""The daemon's own environment: Python 3.10 (the oldest supported) and no torch.

tests/run.sh runs the unit tests there for real (and mypy for 3.10); these tests keep the pieces
that make that run meaningful honest: the skipping of torch-needing test modules, and that the
daemon's modules import without torch at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, needs_torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tests/unit/test_checkpoint.py", True),
        ("tests/unit/test_sharded_checkpoint.py", True),
        ("worker_sdk/checkpoint/checkpointer.py", True),
        ("tests/unit/test_config.py", False),
        ("tests/unit/test_torchrun_resolution.py", False),
        ("worker_sdk/contract/protocol.py", False),
        ("worker_sdk/contract/layout.py", False),
        ("supervisor/cli.py", False),
        ("supervisor/daemon.py", False),
    ],
)
def test_needs_torch_of_repository_modules(path: str, expected: bool) -> None:
    """Test modules that import torch, directly or through worker_sdk, are found; the daemon's
    modules and the torch-free SDK modules are not."""
    assert needs_torch(ROOT / path) is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch.nn as nn\n", True),
        ("from torch import nn\n", True),
        ("from worker_sdk.checkpoint import checkpointer\n", True),
        ("import worker_sdk.checkpoint.checkpointer\n", True),
        ("from worker_sdk import protocol\n", False),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n", False),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", False),
        ("def f():\n    import torch\n", False),
        ("import torchvision_like_name\n", False),
    ],
    ids=[
        "import-submodule",
        "from-torch",
        "through-sdk",
        "sdk-submodule",
        "sdk-torch-free",
        "type-checking",
        "optional",
        "in-function",
        "other-package",
    ],
)
def test_needs_torch_counts_only_top_level_imports(
    tmp_path: Path, source: str, expected: bool
) -> None:
    """Only what importing the module runs counts: TYPE_CHECKING blocks, optional imports and
    imports inside functions do not."""
    module = tmp_path / "test_x.py"
    module.write_text(source)
    assert needs_torch(module) is expected


def test_every_daemon_module_is_torch_free() -> None:
    """No module of supervisor/ imports torch at its top, directly or through worker_sdk."""
    heavy = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "supervisor").rglob("*.py"))
        if needs_torch(p)
    ]
    assert heavy == []


def test_the_daemon_imports_where_torch_cannot_be_imported() -> None:
    """Every module of supervisor/ (and the SDK modules the daemon runs: bootstrap, standby,
    protocol, layout) imports in an interpreter where ``import torch`` fails."""
    code = (
        "import sys, importlib, pkgutil\n"
        "sys.modules['torch'] = None  # any import of torch now raises ImportError\n"
        "import supervisor\n"
        "names = [m.name for m in pkgutil.walk_packages(supervisor.__path__, 'supervisor.')]\n"
        "names += ['worker_sdk.spawn.bootstrap', 'worker_sdk.spawn.standby',\n"
        "          'worker_sdk.contract.protocol', 'worker_sdk.contract.layout']\n"
        "for name in names:\n"
        "    if name != 'supervisor.__main__':  # runs the CLI\n"
        "        importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 40


def test_the_oldest_python_is_the_one_checked() -> None:
    """requires-python, ruff's target and the checks of tests/run.sh (mypy and the unit tests on
    3.10) name the same oldest Python."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.10"
    assert project["tool"]["ruff"]["target-version"] == "py310"
    script = (ROOT / "tests" / "run.sh").read_text()
    assert "mypy --python-version 3.10" in script
    assert "-m pytest -q -p no:cacheprovider tests/unit" in script
