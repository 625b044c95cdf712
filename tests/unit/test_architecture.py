"""The layout's promises, checked from the source: ``supervisor/rules/`` is pure."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "supervisor" / "rules").glob("*.py"))

# what a pure rule may import: data types, enums, typing, and the other rules
_PURE_IMPORTS = frozenset(
    {
        "__future__",
        "collections",  # deque: the losses a rank reported
        "collections.abc",
        "dataclasses",
        "enum",
        "json",  # parsing text handed in (flight-recorder dumps)
        "math",
        "re",  # parsing text handed in (stack dumps)
        "statistics",  # medians of the losses handed in
        "signal",  # signal names only (signal.Signals); nothing is sent
        "sys",  # version checks only
        "types",
        "typing",
        "sortedcontainers",
        "supervisor.record.schema",  # the history's event dataclasses (pure: test_schema.py)
        "supervisor.record.typed_json",  # the schema's readers of JSON values (pure)
        "worker_sdk.contract.protocol",  # exit codes and names shared with the SDK
    }
)
_IO_MODULES = (
    "asyncio",
    "psutil",
    "socket",
    "structlog",
    "subprocess",
    "torch",
    "watchdog",
    "zmq",
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            found.add(f"supervisor.rules.{node.module or ''}")
    return found


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.name)
def test_rules_import_only_pure_modules(path: Path) -> None:
    """Every module under supervisor/rules/ imports only data, typing and other rules: no I/O,
    no clock, no process, no socket."""
    impure = {
        name
        for name in _imports(path)
        if name not in _PURE_IMPORTS and not name.startswith("supervisor.rules")
    }
    assert not impure, f"{path.name} imports {sorted(impure)}"


def test_rules_pull_in_no_io_module() -> None:
    """Importing every rule (and the history reader) in a fresh interpreter loads none of the
    modules that talk to the outside world, torch included."""
    names = [f"supervisor.rules.{p.stem}" for p in RULES if p.stem != "__init__"]
    code = (
        "import sys; import " + ", ".join([*names, "supervisor.record.history"]) + "; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({_IO_MODULES!r})))"
    )
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert out.stdout.strip() == "[]"


def test_the_checker_sees_an_impure_import(tmp_path: Path) -> None:
    """The import scan is not blind: a module that imports ``os`` is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom .states import JobState\n")
    assert _imports(bad) == {"os", "supervisor.rules.states"}
