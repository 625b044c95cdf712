"""A write that meets a full disk fails with the disk's own error (ENOSPC, its errno), not
torch's, which names neither: the failed save's reason says the disk is full, and the memory
tier pauses on that errno instead of turning itself off."""

from __future__ import annotations

import errno
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.tmpfs import tmpfs  # noqa: E402
from worker_sdk.checkpoint.commit import save_into, write_durable  # noqa: E402


class _FullAfter(io.RawIOBase):
    """A file that takes ``room`` bytes, then raises ENOSPC on every write."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return len(data)


def test_torch_alone_names_no_cause() -> None:
    """What save_into is for: torch.save turns the write's ENOSPC into its own RuntimeError,
    with no errno and no word of the disk (if torch ever says it, save_into may go)."""
    with pytest.raises(RuntimeError) as caught:
        torch.save({"w": torch.zeros(4096)}, _FullAfter(200))
    assert "No space left" not in str(caught.value)


@pytest.mark.parametrize("room", [0, 200, 5000])
def test_save_into_raises_the_writes_enospc(room: int) -> None:
    """Whichever write meets the full disk (the first, one in the header, one in the data), the
    error raised is that write's OSError, ENOSPC (with torch's error as its cause, where torch
    had caught it)."""
    with pytest.raises(OSError, match="No space left") as caught:
        save_into(cast(BinaryIO, _FullAfter(room)), {"w": torch.zeros(4096)})
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.__cause__ is None or isinstance(caught.value.__cause__, RuntimeError)


def test_save_into_with_room_writes_what_torch_save_writes() -> None:
    """With room, the bytes are torch.save's, and load back to the same tensors."""
    state = {"w": torch.arange(10.0)}
    ours, theirs = io.BytesIO(), io.BytesIO()
    save_into(ours, state)
    torch.save(state, theirs)
    assert ours.getvalue() == theirs.getvalue()
    assert torch.equal(torch.load(io.BytesIO(ours.getvalue()), weights_only=True)["w"], state["w"])


def test_an_error_that_is_no_write_is_torchs() -> None:
    """An object torch cannot save raises torch's (pickle's) error unchanged: only a write's
    OSError is put in its place."""
    with pytest.raises(TypeError, match="pickle"):
        save_into(io.BytesIO(), {"lock": threading.Lock()})


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root; skipped otherwise)."""
    with tmpfs(tmp_path / "tiny", "64k", mode="0700") as mounted:
        yield mounted


def test_write_durable_on_a_full_tmpfs_raises_enospc(tiny_tmpfs: Path) -> None:
    """A part bigger than the tmpfs: write_durable raises ENOSPC (torch alone said "unexpected
    pos"), and leaves no file of that name."""
    target = tiny_tmpfs / "rank-0.pt"
    with pytest.raises(OSError, match="No space left") as caught:
        write_durable(target, {"w": torch.zeros(100_000)})
    assert caught.value.errno == errno.ENOSPC
    assert not target.exists()
