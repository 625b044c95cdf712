"""resume()'s warning about torch's global generator never seeded (worker_sdk.runtime.determinism):
torch starts every process with a random seed, so what a script builds from it before resume()
differs after a restart."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import worker_sdk
from worker_sdk.runtime.determinism import unseeded_warning


@pytest.fixture
def generator_state() -> Iterator[None]:
    """The global generator's seed and state, put back afterwards."""
    seed, state = torch.initial_seed(), torch.get_rng_state()
    yield
    torch.manual_seed(seed)
    torch.set_rng_state(state)


def test_a_process_that_never_seeds_starts_with_a_random_seed_and_is_warned() -> None:
    """A fresh interpreter's seed differs from another's, and is taken for torch's random one."""
    code = (
        "import torch\n"
        "from worker_sdk.runtime.determinism import unseeded_warning\n"
        "print(torch.initial_seed(), unseeded_warning() is not None)\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    (seed_a, warned_a), (seed_b, warned_b) = (r.stdout.split() for r in runs)
    assert seed_a != seed_b
    assert warned_a == warned_b == "True"


@pytest.mark.parametrize(
    ("seed", "warned"),
    [(0, False), (42, False), (2**32 - 1, False), (67280421310721, False), (2**40 + 3, True)],
    ids=["zero", "42", "largest-32-bit", "the-old-fixed-start", "a-64-bit-random-one"],
)
@pytest.mark.usefixtures("generator_state")
def test_a_seed_a_script_sets_is_no_warning(seed: int, warned: bool) -> None:
    """Scripts seed with small numbers; torch's old fixed start seed was reproducible too; a
    64-bit seed is taken for a random start."""
    torch.manual_seed(seed)
    assert (unseeded_warning() is not None) == warned


@pytest.mark.usefixtures("generator_state")
def test_resume_warns_once_and_says_what_to_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume() on rank 0 of a script that never seeded: one RuntimeWarning naming
    torch.manual_seed and the resume check; none once seeded."""
    monkeypatch.setenv("RVSUP_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    worker_sdk._reset_for_tests()
    torch.manual_seed(2**40 + 3)  # as torch's random start would
    try:
        with pytest.warns(RuntimeWarning, match=r"torch\.manual_seed\(0\)") as caught:
            worker_sdk.resume(nn.Linear(2, 2))
        [warned] = [str(w.message) for w in caught if "never seeded" in str(w.message)]
        assert "docs/resume-check.md" in warned
        worker_sdk._reset_for_tests()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            worker_sdk.resume(nn.Linear(2, 2))
    finally:
        worker_sdk._reset_for_tests()
