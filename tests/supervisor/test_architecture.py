"""The layout's promises, checked from the source: ``supervisor/rules/`` is pure, the daemon
imports only the contract it shares with the ranks, supervisor's subpackages form no cycle, and
every module of the two packages fits in a head (at most 400 lines)."""

from __future__ import annotations

import ast
import json
import os
import re
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
        "array",  # a rank's window of waits, as numbers in a row
        "bisect",  # a rank's window of losses kept sorted
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


def _fresh_interpreter(code: str) -> str:
    """What ``code`` prints, run by a new interpreter that finds this repository first."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    return out.stdout


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
    assert _fresh_interpreter(code).strip() == "[]"


def test_optional_extras_load_only_when_asked() -> None:
    """The daemon, its command line, job.toml's loader and the goodput fold load neither
    prometheus-client (``rvsup[metrics]``: only with a ``[metrics]`` section) nor matplotlib
    (``rvsup[plot]``: only for ``rvsup history --plot``), and the goodput fold no I/O module."""
    modules = "supervisor.cli, supervisor.daemon, supervisor.config.load, supervisor.record.goodput"
    code = (
        f"import sys; import {modules}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'prometheus_client', 'matplotlib'}))"
    )
    assert _fresh_interpreter(code).strip() == "[]"
    pure = (
        "import sys; import supervisor.record.goodput; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({_IO_MODULES!r})))"
    )
    assert _fresh_interpreter(pure).strip() == "[]"


def test_the_checker_sees_an_impure_import(tmp_path: Path) -> None:
    """The import scan is not blind: a module that imports ``os`` is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom .states import JobState\n")
    assert _imports(bad) == {"os", "supervisor.rules.states"}


# ---------------------------------------------------------------- the contract with the ranks
SUPERVISOR = ROOT / "supervisor"
SUPERVISOR_MODULES = sorted(SUPERVISOR.rglob("*.py"))

# What the daemon may import from worker_sdk: the contract, and two torch-free spawn pieces whose
# rules the daemon applies itself: the cgroup naming and joining the rank's bootstrap and the node
# groups share with it (spawn.cgroup), and which interpreter a zygote may serve (spawn.zygote_wire).
_DAEMON_MAY_IMPORT = (
    "worker_sdk.contract",
    "worker_sdk.spawn.cgroup",
    "worker_sdk.spawn.zygote_wire",
)
# What the daemon starts by module name (python -m ...): spawn entry points only.
_DAEMON_MAY_LAUNCH = frozenset(
    {
        "worker_sdk.spawn.bootstrap",
        "worker_sdk.spawn.zygote_watch",
        "worker_sdk.spawn.node_group",
        "worker_sdk.spawn.sweep_snapshots",
    }
)


def _absolute_imports(path: Path) -> set[str]:
    """Every module ``path`` imports by absolute name; ``from a import b`` also yields ``a.b``
    (``b`` may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _sdk_modules_imported(path: Path) -> set[str]:
    """The worker_sdk modules ``path`` imports: ``from a import b`` imports ``a.b`` when that is
    a module, else ``a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _is_module(sub) else node.module)
    return {name for name in found if name.split(".")[0] == "worker_sdk"}


def _sdk_imports_outside_the_contract(path: Path) -> set[str]:
    """The worker_sdk modules ``path`` imports that the daemon may not."""
    return {
        name
        for name in _sdk_modules_imported(path)
        if not any(name == ok or name.startswith(f"{ok}.") for ok in _DAEMON_MAY_IMPORT)
    }


@pytest.mark.parametrize("path", SUPERVISOR_MODULES, ids=lambda p: str(p.relative_to(SUPERVISOR)))
def test_the_daemon_imports_only_the_contract(path: Path) -> None:
    """No module of supervisor/ imports any part of worker_sdk but the contract (and the two
    torch-free spawn pieces named above): the rest of the SDK is the ranks' side."""
    bad = _sdk_imports_outside_the_contract(path)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}; use worker_sdk.contract"


# What the integrations (worker_sdk/integrations/: the callbacks of Hugging Face's and Lightning's
# Trainers) may import of worker_sdk: its public calls (the package itself), the contract and each
# other. The daemon never imports them (they are not in _DAEMON_MAY_IMPORT).
_INTEGRATIONS = ROOT / "worker_sdk" / "integrations"
_INTEGRATIONS_MAY_IMPORT = ("worker_sdk.contract", "worker_sdk.integrations")


@pytest.mark.parametrize(
    "path", sorted(_INTEGRATIONS.glob("*.py")), ids=lambda p: str(p.relative_to(_INTEGRATIONS))
)
def test_the_integrations_use_only_the_sdks_public_calls(path: Path) -> None:
    """A callback is what a user could write: ``worker_sdk.resume/step/checkpointed`` and the
    contract's names, nothing of the runtime's or the checkpoints' insides."""
    bad = {
        name
        for name in _sdk_modules_imported(path)
        if name != "worker_sdk"
        and not any(name == ok or name.startswith(f"{ok}.") for ok in _INTEGRATIONS_MAY_IMPORT)
    }
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    assert not any(ok.startswith("worker_sdk.integrations") for ok in _DAEMON_MAY_IMPORT)


def test_the_daemon_launches_only_spawn_entry_points() -> None:
    """Every worker_sdk module the daemon names in a string (to run it with ``python -m``) is
    one of the spawn entry points, and each of those exists."""
    named: set[str] = set()
    for path in SUPERVISOR_MODULES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"worker_sdk(\.\w+)+", value):
                named.add(value)
    assert named <= _DAEMON_MAY_LAUNCH, sorted(named - _DAEMON_MAY_LAUNCH)
    for module in _DAEMON_MAY_LAUNCH:
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file(), module


def test_the_contract_checker_sees_a_private_sdk_import(tmp_path: Path) -> None:
    """The contract scan is not blind: runtime and private spawn modules are reported, the
    contract and names imported from it are not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from worker_sdk.contract import protocol\n"
        "from worker_sdk.contract.protocol import EXIT_OOM\n"
        "from worker_sdk.spawn import zygote\n"
        "import worker_sdk.runtime.channel\n"
        "from worker_sdk import checkpoint\n"
    )
    assert _sdk_imports_outside_the_contract(bad) == {
        "worker_sdk.spawn.zygote",
        "worker_sdk.runtime.channel",
        "worker_sdk.checkpoint",
    }


def test_the_contract_imports_nothing_outside_it() -> None:
    """A fresh interpreter importing the contract (and the spawn pieces the daemon may import)
    loads no torch, no third-party module, and no part of worker_sdk outside them."""
    contract = sorted(p.stem for p in (ROOT / "worker_sdk" / "contract").glob("*.py"))
    modules = [
        *(f"worker_sdk.contract.{name}" for name in contract if name != "__init__"),
        "worker_sdk.spawn.cgroup",
        "worker_sdk.spawn.zygote_wire",
    ]
    code = (
        "import sys, json; before = set(sys.modules); import " + ", ".join(modules) + "; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    loaded: list[str] = json.loads(_fresh_interpreter(code))
    sdk = {m for m in loaded if m == "worker_sdk" or m.startswith("worker_sdk.")}
    allowed = {"worker_sdk", "worker_sdk.contract", "worker_sdk.spawn", *modules}
    assert sdk <= allowed, sorted(sdk - allowed)
    foreign = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"worker_sdk"}
    assert not foreign, sorted(foreign)  # torch, zmq, numpy, ... (and "_..." C helpers are stdlib)


# ---------------------------------------------------------------- supervisor's subpackages
SUBPACKAGES = sorted(p.name for p in SUPERVISOR.iterdir() if (p / "__init__.py").is_file())


def _subpackage_graph() -> dict[str, set[str]]:
    """Which subpackage of supervisor/ imports which other one (from the source)."""
    graph: dict[str, set[str]] = {name: set() for name in SUBPACKAGES}
    for name in SUBPACKAGES:
        for path in (SUPERVISOR / name).rglob("*.py"):
            for module in _absolute_imports(path):
                parts = module.split(".")
                if parts[0] == "supervisor" and len(parts) > 1 and parts[1] in graph:
                    graph[name].add(parts[1])
        graph[name].discard(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found is not None:
                return found
    return None


def test_supervisor_subpackages_import_each_other_without_cycles() -> None:
    """The subpackages of supervisor/ form layers: no chain of imports leads from one back to
    itself."""
    graph = _subpackage_graph()
    cycle = _cycle(graph)
    assert cycle is None, "import cycle between supervisor's subpackages: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_a_cycle() -> None:
    """The cycle check is not blind: a -> b -> c -> b is found and named; a layered graph is
    not a cycle."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# ---------------------------------------------------------------- modules: no cycle anywhere
PACKAGES = ("supervisor", "worker_sdk", "benchmarks", "tests")


def _module_names() -> dict[str, Path]:
    """Every module of the tree's packages by its dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _module_graph() -> dict[str, set[str]]:
    """Which module imports which, counting every import of the source: at the top, inside a
    function (a deferred import), under ``TYPE_CHECKING``, relative or absolute; an import of
    a name from a module counts as one of that module."""
    modules = _module_names()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                found = owner(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def test_no_module_imports_itself_through_others() -> None:
    """No chain of imports, deferred ones and ``TYPE_CHECKING`` ones included, leads from a
    module of the tree (supervisor, worker_sdk, benchmarks, tests) back to itself: a cycle
    hidden behind a deferred import is a cycle all the same."""
    cycle = _cycle(_module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_module_graph_sees_deferred_and_relative_imports() -> None:
    """The graph is not blind: a deferred relative import (device_wait's of the EventRing is at
    the top; stragglers' of device_wait is relative) and a TYPE_CHECKING one are edges."""
    graph = _module_graph()
    assert "worker_sdk.runtime.device_wait" in graph["worker_sdk.runtime.stragglers"]
    assert "worker_sdk.runtime.channel" in graph["worker_sdk.runtime.exit_hooks"]
    assert "supervisor.slurm.commands" in graph["supervisor.process.launch_plan"]


# ---------------------------------------------------------------- one import path per name
# Modules that gather names defined elsewhere, for everyone to import from there: the history's
# events, the checkpoint directory's layout, and the SDK's public calls (its users' path).
FACADES: dict[str, tuple[str, ...]] = {
    "supervisor.record.schema": ("supervisor.record.schema.",),
    "worker_sdk.contract.layout": (
        "worker_sdk.contract.checkpoint_names",
        "worker_sdk.contract.manifest",
    ),
    "worker_sdk": (),
}


def _defined(path: Path) -> set[str]:
    """The names a module binds at its top level (not by importing them)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _name_imports() -> list[tuple[str, str, str]]:
    """(importing module, module imported from, name) for every ``from M import name`` of the
    tree where ``M.name`` is no module."""
    modules = _module_names()
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base in modules:
                found += [
                    (name, base, alias.name)
                    for alias in node.names
                    if f"{base}.{alias.name}" not in modules
                ]
    return found


def test_a_name_is_imported_from_where_it_is_defined() -> None:
    """Every ``from M import name`` of the tree takes the name from the module that defines it,
    or from a declared facade (the events, the checkpoint layout, the SDK's public names);
    and a name a facade gathers is imported through it, but inside the facade's own package."""
    modules = _module_names()
    defined = {name: _defined(path) for name, path in modules.items()}
    wrong = []
    for importer, base, name in _name_imports():
        if base not in FACADES and name not in defined[base]:
            wrong.append(f"{importer}: {name} from {base}, which does not define it")
        for facade, behind in FACADES.items():
            inside = importer.startswith(facade.rpartition(".")[0] + ".") or importer == facade
            hidden = any(base == b or (b.endswith(".") and base.startswith(b)) for b in behind)
            if hidden and not inside:
                wrong.append(f"{importer}: {name} from {base}, not through {facade}")
    assert not wrong, "\n".join(sorted(wrong))


# ---------------------------------------------------------------- module size
MAX_MODULE_LINES = 400  # a module that fits in a head; a new feature leaves ~20 lines of room
SOURCE_MODULES = sorted([*SUPERVISOR.rglob("*.py"), *(ROOT / "worker_sdk").rglob("*.py")])


def _too_long(paths: list[Path], limit: int, root: Path) -> dict[str, int]:
    """The modules among ``paths`` longer than ``limit`` lines, with their lengths (named
    relative to ``root``)."""
    lengths = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in paths}
    return {name: n for name, n in lengths.items() if n > limit}


def test_every_module_fits_in_a_head() -> None:
    """No module of supervisor/ or worker_sdk/ is longer than 400 lines: one that grows past it
    is split along a seam of its own (docs/architecture.md), not left to grow."""
    assert SOURCE_MODULES, "no module found"
    assert _too_long(SOURCE_MODULES, MAX_MODULE_LINES, ROOT) == {}


def test_the_size_check_sees_a_long_module(tmp_path: Path) -> None:
    """The size check is not blind: a module of 401 lines is reported, one of 400 is not."""
    (tmp_path / "pkg").mkdir()
    long, fits = tmp_path / "pkg" / "long.py", tmp_path / "pkg" / "fits.py"
    long.write_text("x = 1\n" * 401)
    fits.write_text("x = 1\n" * 400)
    assert _too_long([long, fits], MAX_MODULE_LINES, tmp_path) == {"pkg/long.py": 401}
