"""The daemon's own environment: Python 3.10 (the oldest supported) and no torch.

tests/run.sh runs the fast selection there for real (and mypy for 3.10); these tests keep the
pieces that make that run meaningful honest: the skipping of torch-needing test modules
(tests/helpers/torchless.py), and that the daemon's modules import without torch at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.torchless import missing_torch

ROOT = Path(__file__).resolve().parents[2]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ModuleNotFoundError("No module named 'torch'", name="torch"), True),
        (ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn"), True),
        (ModuleNotFoundError("No module named 'torchvision_like'", name="torchvision_like"), False),
        (ModuleNotFoundError("No module named 'numpy'", name="numpy"), False),
        (ImportError("cannot import name 'x' from 'torch'"), False),
        (None, False),
    ],
    ids=["torch", "torch-submodule", "other-package", "numpy", "not-a-missing-module", "none"],
)
def test_missing_torch_is_only_torchs_absence(error: BaseException | None, expected: bool) -> None:
    """Only a ModuleNotFoundError for torch or a submodule of it counts as torch missing."""
    assert missing_torch(error) is expected


def test_missing_torch_follows_the_cause() -> None:
    """pytest wraps the import's error in its own; the cause is what is judged."""
    outer = RuntimeError("ImportError while importing test module")
    outer.__cause__ = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert missing_torch(outer)


def test_torch_needing_test_modules_are_skipped_where_torch_is_missing(tmp_path: Path) -> None:
    """Where ``import torch`` fails, a test module that imports torch, itself or through the SDK,
    is collected as one skip with the reason; a torch-free one is collected as usual; one that
    misses another module is still an error."""
    modules = {
        "test_direct.py": "import torch\n\ndef test_a():\n    pass\n",
        "test_through_sdk.py": "from worker_sdk.checkpoint import checkpointer\n\ndef test_b():\n    pass\n",
        "test_free.py": "from worker_sdk.contract import protocol\n\ndef test_c():\n    pass\n",
        "test_other.py": "import no_such_module_rvsup\n\ndef test_d():\n    pass\n",
    }
    for name, source in modules.items():
        (tmp_path / name).write_text(source)
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now raises ImportError\n"
        "import pytest\n"
        "sys.exit(pytest.main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", code, str(tmp_path), "--collect-only", "-q", "-rs"]
    argv += ["-p", "tests.helpers.torchless", "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(tmp_path), "-c", os.devnull]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out  # the error stops the session
    assert "test_direct.py imports torch, which this environment does not have" in out
    assert "test_through_sdk.py imports torch, which this environment does not have" in out
    assert "test_free.py::test_c" in out
    assert "no_such_module_rvsup" in out and "1 error" in out


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
    """requires-python, ruff's target and the checks of tests/run.sh (mypy and the fast selection
    on 3.10) name the same oldest Python."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.10"
    assert project["tool"]["ruff"]["target-version"] == "py310"
    script = (ROOT / "tests" / "run.sh").read_text()
    assert "mypy --python-version 3.10" in script
    assert 'two_phases "$VENV310/bin/python" -q -m "not process and not slurm"' in script
