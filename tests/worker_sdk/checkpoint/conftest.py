"""Fixtures of the checkpoint tests (sync and, below, background)."""

from __future__ import annotations

import pytest

from tests.helpers.sharded import References, Run


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Uninterrupted 16-step runs, one per parallelism, computed when first needed and shared
    by the sync and the async checkpoint tests (each kind run once in the whole test run: the
    tests only read them)."""
    return References(tmp_path_factory)
