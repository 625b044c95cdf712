"""Helpers of the tests that compare training state: bit-identical nested state, the final state
a trainer wrote, a checkpointer in one process, and a checkpoint in the previous release's format.
They need torch."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from worker_sdk.checkpoint import rng as _rng
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.parallel import Stateful, unwrap
from worker_sdk.contract.layout import MANIFEST, MARKER, SHARED, committed_name, rank_file

__all__ = ["assert_same_state", "load_final", "make_checkpointer", "write_format1"]


def load_final(path: Path) -> dict[str, Any]:
    """The state a trainer saved at its end (torch.save)."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def assert_same_state(a: Any, b: Any, where: str = "") -> None:
    """Recursive equality; tensors must be bit-identical (torch.equal, same dtype), sequences of
    the same type."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), where
        assert set(a) == set(b), f"{where}: keys differ"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), where
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def make_checkpointer(
    directory: Path, keep_last: int = 3, tag: str = "a1", **kw: int
) -> Checkpointer:
    """A Checkpointer of rank ``rank`` (0) of ``world_size`` (1) in ``directory``."""
    return Checkpointer(
        directory,
        rank=kw.get("rank", 0),
        world_size=kw.get("world_size", 1),
        attempt_tag=tag,
        keep_last=keep_last,
    )


def write_format1(directory: Path, step: int, objects: list[Stateful], extra: Any) -> Path:
    """A format-1 checkpoint (one rank) exactly as the previous release's writer made it:
    shared.pt with every object's state, rank-00000.pt, a manifest without objects/checksums."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).touch(mode=0o600)
    path = directory / committed_name(step)
    path.mkdir()
    table = {
        str(i): {"class": type(unwrap(obj)).__qualname__, "state": unwrap(obj).state_dict()}
        for i, obj in enumerate(objects)
    }
    torch.save({"format": 1, "objects": table}, path / SHARED)
    part = {"format": 1, "rank": 0, "rng": _rng.capture(), "extra": extra}
    torch.save(part, path / rank_file(0))
    files = {name: os.path.getsize(path / name) for name in (SHARED, rank_file(0))}
    manifest = {"format": 1, "step": step, "world_size": 1, "created": 1.0, "files": files}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return path
