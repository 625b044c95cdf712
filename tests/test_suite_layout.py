"""The test suite's own layout: test modules import helpers, never each other, and
tests/supervisor/ mirrors supervisor/ (docs/development.md describes the layout)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def package_of(path: Path) -> str:
    """The dotted package a module of this repository belongs to."""
    return ".".join(path.relative_to(ROOT).parts[:-1])


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module ``source`` (a module of ``package``) imports, anywhere in
    it, relative ones resolved; ``from pkg import name`` counts as ``pkg`` and ``pkg.name``
    (the name may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def is_test_module(name: str) -> bool:
    """A module pytest collects: ``test_*`` under tests/ (conftest.py and helpers are not)."""
    return name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")


def test_no_test_module_imports_another() -> None:
    """Shared code lives in conftest.py files and in tests/helpers/, not in test modules: a
    test module imported by another runs its module-level code and fixtures twice, and ties
    the two together by accident."""
    offending = {}
    for path in sorted(TESTS.rglob("*.py")):
        names = imported_modules(path.read_text(), package_of(path))
        if bad := sorted(name for name in names if is_test_module(name)):
            offending[str(path.relative_to(ROOT))] = bad
    assert offending == {}


def test_imports_of_test_modules_are_found() -> None:
    """Relative and absolute imports of a test module are seen; helpers are not test modules."""
    source = (
        "from .test_budget import failed\n"
        "import tests.jobs.test_stop\n"
        "from tests.helpers import jobs\n"
        "def f():\n    from tests.worker_sdk.checkpoint import test_checkpoint\n"
    )
    names = imported_modules(source, "tests.supervisor.rules")
    assert {name for name in names if is_test_module(name)} == {
        "tests.supervisor.rules.test_budget",
        "tests.jobs.test_stop",
        "tests.worker_sdk.checkpoint.test_checkpoint",
    }


def test_tests_of_the_daemon_mirror_its_packages() -> None:
    """Every folder of tests/supervisor/ is named after a package of supervisor/."""
    folders = {p.name for p in (TESTS / "supervisor").iterdir() if p.is_dir()} - {"__pycache__"}
    packages = {p.parent.name for p in (ROOT / "supervisor").glob("*/__init__.py")}
    assert folders <= packages, folders - packages
