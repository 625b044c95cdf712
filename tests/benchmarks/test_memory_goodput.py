"""Figure 13's parts that need no run: its columns and the job each rvsup column writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fig_memory_goodput import MEMORY, MEMORY_FIXED, STORAGE, goodput_tools
from benchmarks.profiles import PROFILES, Context
from benchmarks.tools import Rvsup, Spec
from supervisor.config.load import load_config


@pytest.mark.parametrize(
    ("every", "parsed"), [("auto", None), (5, 5), ("off", 0), (None, None), ("unset", 0)]
)
def test_an_rvsup_column_writes_its_memory_tier_into_the_job(
    tmp_path: Path, every: int | str | None, parsed: int | None
) -> None:
    """``memory_every_steps`` "auto", a number, "off", or nothing (the shipped default, "auto")
    is what the job rvsup loads says; a column that does not say is storage-only."""
    job = tmp_path / "job.toml"
    tool = Rvsup() if every == "unset" else Rvsup(memory_every_steps=every)
    job.write_text(tool.job_toml(Spec(steps=100, ckpt_every=50)))
    assert load_config(job).checkpoint.memory_every_steps == parsed


def test_the_columns_compare_the_memory_tier_with_storage_only_and_the_peers(
    tmp_path: Path,
) -> None:
    """The full figure has rvsup with the tier ("auto" and a number) and without, torchrun and
    ft_launcher; the smoke profile only the rvsup columns."""
    full = goodput_tools(Context(PROFILES["quick"], tmp_path, None))
    assert list(full)[:3] == [MEMORY, MEMORY_FIXED, STORAGE] and len(full) == 5
    memory = full[MEMORY]
    assert isinstance(memory, Rvsup)
    assert memory.memory_every_steps == "auto"
    smoke = goodput_tools(Context(PROFILES["smoke"], tmp_path, None))
    assert list(smoke) == [MEMORY, MEMORY_FIXED, STORAGE]
