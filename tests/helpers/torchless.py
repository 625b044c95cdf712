"""Where torch is not installed (the daemon's own environment: Python 3.10 in CI, see
tests/run.sh), a test module that cannot be imported because torch is missing is reported as
one skip with the reason, instead of an error. Nothing is guessed from the source: the module is
imported, and only a ``ModuleNotFoundError`` for torch (or one of its submodules) skips it; any
other import error fails as usual. Where torch is installed this plugin changes nothing.

A test that needs torch only inside its body calls ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def missing_torch(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is the import of torch failing for its absence."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == "torch":
            return True
        error = error.__cause__
    return False


class TorchOptionalModule(pytest.Module):
    """A test module that is skipped, with the reason, when it cannot be imported without torch."""

    def _getobj(self) -> Any:
        try:
            return super()._getobj()
        except self.CollectError as error:
            if missing_torch(error):
                pytest.skip(f"{self.path.name} imports torch, which this environment does not have")
            raise


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(
    module_path: Path, parent: pytest.Collector
) -> pytest.Module | None:
    """Collect test modules as :class:`TorchOptionalModule` where torch is missing."""
    if HAVE_TORCH:
        return None
    return TorchOptionalModule.from_parent(parent, path=module_path)
