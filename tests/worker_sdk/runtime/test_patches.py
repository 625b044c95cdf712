"""The SDK's changes to other libraries' objects (worker_sdk/runtime/patches.py): each undone at
the end of its scope, none made anywhere else, and what a runtime patched put back by its
shutdown."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader

from worker_sdk.checkpoint import rng
from worker_sdk.runtime import patches
from worker_sdk.runtime.loader_rng import LoaderWindow
from worker_sdk.runtime.patches import Patch
from worker_sdk.runtime.stragglers import TIMED, CollectiveWait

SDK = Path(__file__).parents[3] / "worker_sdk"
# process set-up, not patches: a forked rank's own stdout and stderr, a standby's argv (the
# process becomes the rank, or torchrun)
NOT_PATCHES = {("spawn/zygote_child.py", "sys"), ("spawn/standby.py", "sys")}


def test_a_module_attribute_is_put_back_and_listed_while_applied() -> None:
    """apply() replaces it and lists the patch; undo() puts the original back, unlists it, and
    says True; a second apply() of the same patch is refused."""
    mod = types.ModuleType("m")
    mod.f = original = lambda: 1  # type: ignore[attr-defined]
    patch = Patch(mod, "f", lambda: 2, "test").apply()
    assert mod.f() == 2 and patch.original is original and patch in patches.active()
    with pytest.raises(RuntimeError, match="applied already"):
        patch.apply()
    assert patch.undo() is True
    assert mod.f is original and patch not in patches.active()
    assert patch.undo() is False  # once only


def test_an_inherited_method_is_deleted_again_so_the_base_shows_through() -> None:
    """A class that only inherits the attribute gets it set on itself, and deleted at the
    undo: the base class's shows through again (a later change of the base included)."""

    class Base:
        def f(self) -> int:
            return 1

    class Child(Base):
        pass

    patch = Patch(Child, "f", lambda self: 2, "test").apply()
    assert Child().f() == 2 and Base().f() == 1
    assert patch.undo() is True
    assert "f" not in vars(Child) and Child().f() == 1


def test_a_wrapper_put_over_ours_is_left_in_place() -> None:
    """When something else replaced the attribute after us (a framework's own wrapper, which
    calls ours), the undo leaves it and says False."""
    mod = types.ModuleType("m")
    mod.f = lambda: 1  # type: ignore[attr-defined]
    patch = Patch(mod, "f", lambda: 2, "test").apply()
    theirs = mod.f = lambda: patch.replacement() + 10  # type: ignore[attr-defined]
    assert patch.undo() is False
    assert mod.f is theirs and patch not in patches.active()


def test_the_loader_window_puts_dataloader_iter_back_at_close() -> None:
    """DataLoader.__iter__ and a subclass's own are wrapped while the window is open and are
    the very same functions again once it is closed."""

    class OwnIter(DataLoader):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return super().__iter__()

    before = DataLoader.__dict__["__iter__"], OwnIter.__dict__["__iter__"]
    # another test of this process may hold a window of its own open: only ours are counted
    others = list(patches.active())
    window = LoaderWindow(rng.capture(), [])
    window.install()
    assert DataLoader.__dict__["__iter__"] is not before[0]
    assert OwnIter.__dict__["__iter__"] is not before[1]
    assert len([p for p in patches.active() if p.name == "__iter__" and p not in others]) >= 2
    window.close()
    assert (DataLoader.__dict__["__iter__"], OwnIter.__dict__["__iter__"]) == before
    assert list(patches.active()) == others


@pytest.mark.usefixtures("one_process_group")
def test_collective_timers_are_scoped_and_two_readers_count_apart() -> None:
    """Each reader wraps the collectives with its own total: a second one wraps the first's
    wrappers and both count; closing them (newest first) leaves torch.distributed's own
    functions in place."""
    import torch

    before = {name: getattr(dist, name) for name in TIMED if hasattr(dist, name)}
    first = CollectiveWait()
    second = CollectiveWait()
    t = torch.ones(1 << 14)
    for _ in range(5):
        dist.all_reduce(t)
    got = first.read(5), second.read(5)
    mine = [*first._patches, *second._patches]
    assert all(g is not None and g > 0 for g in got), got
    second.close()
    assert dist.all_reduce is not before["all_reduce"]  # the first's wrapper
    first.close()
    assert {name: getattr(dist, name) for name in before} == before
    assert not [p for p in mine if p in patches.active()]


def _assigned_modules(tree: ast.Module) -> set[str]:
    """Names of imported modules whose attributes ``tree`` assigns (``mod.x = ...``,
    ``setattr(mod, ...)``) or whose classes it assigns attributes of (``cls.__iter__ = ...``
    on a loop variable is caught by its dunder name)."""
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    defined = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    own = {node.name for node in ast.walk(tree) if isinstance(node, defined)}
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                dunder = target.attr.startswith("__") and target.value.id not in own
                if target.value.id in imported or dunder:
                    found.add(target.value.id)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"setattr", "delattr"}
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in imported
        ):
            found.add(node.args[0].id)
    return found


def test_no_module_but_patches_changes_another_librarys_objects() -> None:
    """No SDK module assigns an attribute of an imported module or a dunder of a class but
    through a Patch (the detector's own check: it finds ``sys.excepthook = ...``)."""
    assert _assigned_modules(ast.parse("import sys\nsys.excepthook = print\n")) == {"sys"}
    assert _assigned_modules(ast.parse("cls.__iter__ = f\n")) == {"cls"}
    offenders = []
    for path in sorted(SDK.rglob("*.py")):
        rel = path.relative_to(SDK).as_posix()
        if rel == "runtime/patches.py":
            continue
        names = _assigned_modules(ast.parse(path.read_text()))
        offenders += [f"{rel}: {name}" for name in names if (rel, name) not in NOT_PATCHES]
    assert not offenders, offenders


def test_the_exception_hook_is_ours_only_until_the_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """install_excepthook() replaces sys.excepthook with a patch that the runtime's shutdown
    undoes: a second resume() in one process does not stack hooks."""
    from worker_sdk.runtime.exit_hooks import install_excepthook

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    rt = types.SimpleNamespace(channel=None, last_step=-1, shutdown=lambda: None)
    patch = install_excepthook(rt)  # type: ignore[arg-type]
    assert sys.excepthook is patch.replacement and patch.original is sys.__excepthook__
    assert patch.undo() and sys.excepthook is sys.__excepthook__
