"""Bring your own checkpoint in one process (no rvsup, a checkpoint directory): step() asks for
the framework's checkpoint on rvsup's schedule, checkpointed() commits rvsup's marker of it,
and the next resume(external=True) names the newest one; a torn one is never named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import worker_sdk
from worker_sdk.contract import layout


@pytest.fixture(autouse=True)
def _fresh_sdk() -> Iterator[None]:
    worker_sdk._reset_for_tests()
    torch.manual_seed(0)  # each test is a script, which seeds (resume() warns otherwise)
    yield
    worker_sdk._reset_for_tests()


def test_step_asks_on_schedule_and_the_next_resume_names_the_newest_marked_checkpoint(
    tmp_path: Path,
) -> None:
    """every_steps=5: step() is True after steps 4 and 9 only; after checkpointed(9) the marker
    is a committed checkpoint of mode "external" naming the path, and a second process's
    resume(external=True) returns (10, that path) with the RNG as it was at the marker."""
    ckpt = tmp_path / "ckpt"
    start, path = worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5)
    assert (start, path) == (0, None)
    asked = []
    after_marker = None
    for s in range(12):
        if worker_sdk.step(s):
            asked.append(s)
            own = tmp_path / f"own-{s}.pt"
            own.write_bytes(b"the framework's bytes")
            worker_sdk.checkpointed(s, own)
            if s == 9:
                after_marker = torch.rand(3)
    assert asked == [4, 9]
    info = layout.latest(ckpt)
    assert info is not None and info.step == 9 and info.mode == "external"
    assert info.external == str(tmp_path / "own-9.pt")
    manifest = json.loads((info.path / "MANIFEST.json").read_text())
    assert manifest["mode"] == "external" and manifest["objects"] == []
    worker_sdk._reset_for_tests()
    torch.manual_seed(12345)  # a new process: other RNG states until the marker's come back
    start, path = worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5)
    assert (start, path) == (10, str(tmp_path / "own-9.pt"))
    assert after_marker is not None and torch.equal(torch.rand(3), after_marker)


def test_a_checkpoint_the_script_never_reported_is_not_resumed(tmp_path: Path) -> None:
    """Asked at step 4, the script dies before checkpointed(4) (its own file may be torn): the
    next resume(external=True) starts afresh, never at 5."""
    ckpt = tmp_path / "ckpt"
    worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5)
    assert [s for s in range(5) if worker_sdk.step(s)] == [4]
    (tmp_path / "own-4.pt").write_bytes(b"torn")
    worker_sdk._reset_for_tests()
    assert worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5) == (0, None)


def test_external_mode_registers_nothing_and_checkpointed_needs_it(tmp_path: Path) -> None:
    """resume(model, external=True) and checkpointed() after a plain resume() are refused, each
    saying what to change; without a checkpoint directory step() never asks."""
    model = torch.nn.Linear(2, 2)
    with pytest.raises(worker_sdk.UsageError, match="pass no objects"):
        worker_sdk.resume(model, external=True)
    worker_sdk.resume(model)
    with pytest.raises(worker_sdk.UsageError, match="external=True"):
        worker_sdk.checkpointed(0, tmp_path / "x")
    worker_sdk._reset_for_tests()
    worker_sdk.resume(external=True, every_steps=1)
    assert not any(worker_sdk.step(s) for s in range(5))
    worker_sdk.checkpointed(4, tmp_path / "x")  # nothing to mark: a no-op


def test_a_frameworks_model_is_fingerprinted_never_saved(tmp_path: Path) -> None:
    """resume(external=True, fingerprint=[model]): the runtime watches the model (the resume
    check samples its parameters) while the checkpoints stay the framework's (step() asks,
    rvsup writes nothing of the model); fingerprint= without external, or with what is not a
    module, is refused."""
    model = torch.nn.Linear(2, 2)
    with pytest.raises(worker_sdk.UsageError, match="is for external=True"):
        worker_sdk.resume(model, fingerprint=[model])
    with pytest.raises(TypeError, match="takes torch modules"):
        worker_sdk.resume(external=True, fingerprint=["model"])
    ckpt = tmp_path / "ckpt"
    worker_sdk.resume(external=True, fingerprint=[model], checkpoint_dir=ckpt, every_steps=2)
    assert worker_sdk._current is not None and list(worker_sdk._current.objects) == [model]
    assert [s for s in range(4) if worker_sdk.step(s)] == [1, 3]
    assert not [p for p in ckpt.rglob("*") if p.is_file() and p.suffix == ".pt"]


def test_the_memory_tier_takes_no_snapshot_of_a_framework_that_saves_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory tier on (RVSUP_MEMORY_DIR, a snapshot every step): rvsup holds none of the
    framework's state, so a snapshot could only name a step the framework cannot load. No
    writer is started, no snapshot written, and the next resume names the framework's own
    checkpoint."""
    shm = tmp_path / "shm"
    monkeypatch.setenv("RVSUP_MEMORY_DIR", str(shm))
    monkeypatch.setenv("RVSUP_MEMORY_EVERY", "1")
    ckpt = tmp_path / "ckpt"
    worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5)
    for s in range(8):
        if worker_sdk.step(s):
            (tmp_path / f"own-{s}.pt").write_bytes(b"the framework's bytes")
            worker_sdk.checkpointed(s, tmp_path / f"own-{s}.pt")
    assert worker_sdk._current is not None and worker_sdk._current.memory is None
    assert not shm.exists() or not any(shm.iterdir())
    worker_sdk._reset_for_tests()
    start, path = worker_sdk.resume(external=True, checkpoint_dir=ckpt, every_steps=5)
    assert (start, path) == (5, str(tmp_path / "own-4.pt"))
