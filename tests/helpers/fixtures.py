"""Fixtures shared by the whole suite (registered by tests/conftest.py): an uninterrupted
reference run of the trainer; a real 1-process gloo group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.harness import rvsup, write_job


@pytest.fixture(scope="session")
def reference_final(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of an uninterrupted 60-step run under rvsup (checkpoint every 10 steps),
    with ranks started cold: the tests' runs fork theirs from the zygote (the default)."""
    tmp = tmp_path_factory.mktemp("reference")
    final = tmp / "final.pt"
    job = write_job(
        tmp,
        env={"FINAL": str(final)},
        launch='term_timeout = "3s"\nstop_timeout = "30s"\nzygote = false',
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    return final


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A real 1-process gloo group (file store in tmp_path), destroyed afterwards (torch is
    imported here, not at the top: the suite also runs where torch is not installed)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
