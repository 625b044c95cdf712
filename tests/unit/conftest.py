"""The unit tests also run where torch is not installed (the daemon's own environment, Python 3.10
in CI: see tests/run.sh): a test module that imports torch, itself or through the repository's
modules (worker_sdk.checkpoint.checkpointer, ...), is then reported as skipped instead of failing to import.

Only imports at the top of a module count (not those under ``if TYPE_CHECKING:``, in a ``try:`` or
in a function); a test that needs torch only inside its body calls ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LOCAL = ("supervisor", "worker_sdk", "tests", "benchmarks")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _source(module: str) -> Path | None:
    """The file of a module of this repository, or None (another distribution's, or none)."""
    if module.split(".", 1)[0] not in _LOCAL:
        return None
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(path: Path) -> str:
    """The dotted name of ``path`` in this repository (its stem when it lies elsewhere)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(ROOT):
        return resolved.stem
    parts = list(resolved.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports at its top level (and their packages)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # maybe submodules
    return found


@functools.cache
def needs_torch(path: Path) -> bool:
    """True when importing ``path`` imports torch (directly or through local modules)."""
    seen: set[Path] = set()
    todo = [path.resolve()]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _top_imports(current):
            if name.split(".", 1)[0] == "torch":
                return True
            parts = name.split(".")
            for end in range(1, len(parts) + 1):  # a.b.c imports a and a.b first
                source = _source(".".join(parts[:end]))
                if source is not None:
                    todo.append(source.resolve())
    return False


class _NeedsTorch(pytest.Module):
    """A test module that cannot be imported without torch: one skip, with the reason."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        pytest.skip(f"{self.path.name} imports torch, which this environment does not have")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    """Collect a torch-needing module as a skip where torch is missing; else the usual way."""
    if HAVE_TORCH or not needs_torch(module_path):
        return None
    return _NeedsTorch.from_parent(parent, path=module_path)
