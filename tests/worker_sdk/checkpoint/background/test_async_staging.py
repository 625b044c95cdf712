"""Staging for asynchronous saves: what a writer rebuilds from an arena is exactly what was staged,
and the arena is reused rather than grown."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from tests.helpers.states import assert_same_state
from worker_sdk.checkpoint.background import arena as _arena
from worker_sdk.checkpoint.background.arena import Arena, StagedTensor
from worker_sdk.contract import layout
from worker_sdk.runtime.settings import resolve


class Pair(NamedTuple):
    a: Any
    b: Any


def _roundtrip(payload: Any) -> tuple[Any, Any]:
    tensors = list(_arena.tensors_in(payload))
    arena = Arena.create("test", _arena.needed_bytes(tensors))
    try:
        skeleton, end = _arena.stage(payload, arena)
        assert end <= arena.size
        # the writer gets the skeleton pickled, and its own mapping of the same memory
        theirs = Arena(_dup(arena.fd), arena.size)
        try:
            rebuilt = _arena.rebuild(pickle.loads(pickle.dumps(skeleton)), theirs)
            return skeleton, _materialise(rebuilt)
        finally:
            theirs.close()
    finally:
        arena.close()


def _dup(fd: int) -> int:
    import os

    return os.dup(fd)


def _materialise(obj: Any) -> Any:
    """Copies of every tensor (the arena is unmapped after the test)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, OrderedDict):
        out: OrderedDict[Any, Any] = OrderedDict((k, _materialise(v)) for k, v in obj.items())
        out.__dict__.update(vars(obj))
        return out
    if isinstance(obj, dict):
        return {k: _materialise(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_materialise(v) for v in obj]
    if isinstance(obj, tuple):
        items = [_materialise(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def test_every_dtype_and_shape_comes_back_bit_identical() -> None:
    """Floats, ints, bools, bfloat16, complex, 0-d, empty and non-contiguous tensors, nested in
    dicts, lists, tuples and named tuples, come back with the same values, dtypes and shapes."""
    g = torch.Generator().manual_seed(0)
    payload = {
        "f32": torch.randn(7, 3, generator=g),
        "f64": torch.randn(5, dtype=torch.float64, generator=g),
        "bf16": torch.randn(9, generator=g).to(torch.bfloat16),
        "i64": torch.arange(11),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(4, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 8, generator=g).t()[::2],
        "nested": [1, "two", (torch.ones(2), {"deep": torch.full((3,), 7)})],
        "named": Pair(torch.ones(1), 2),
        "plain": {"lr": 0.1, "betas": (0.9, 0.99)},
    }
    _, back = _roundtrip(payload)
    assert_same_state(payload, back)
    assert isinstance(back["named"], Pair)
    assert back["strided"].is_contiguous()


def test_tied_tensors_are_staged_once_and_stay_tied() -> None:
    """A tensor reachable twice (tied weights) takes arena space once and comes back as one."""
    w = torch.randn(16, 16)
    payload = {"embed": w, "head": w}
    skeleton, back = _roundtrip(payload)
    assert skeleton["embed"] == skeleton["head"]
    assert _arena.needed_bytes(list(_arena.tensors_in(payload))) == 16 * 16 * 4
    assert torch.equal(back["embed"], w)


def test_a_module_state_dict_keeps_its_metadata() -> None:
    """A module's state dict comes back an OrderedDict with ``_metadata`` (which
    ``load_state_dict`` reads), and loads into a fresh module."""
    bn = torch.nn.BatchNorm1d(4)
    bn(torch.randn(8, 4))
    state = bn.state_dict()
    _, back = _roundtrip(state)
    assert isinstance(back, OrderedDict)
    assert back._metadata == state._metadata  # type: ignore[attr-defined]
    fresh = torch.nn.BatchNorm1d(4)
    fresh.load_state_dict(back)
    assert_same_state(bn.state_dict(), fresh.state_dict())


def test_a_staged_tensor_is_saved_as_its_own_bytes(tmp_path: Path) -> None:
    """torch.save of a tensor rebuilt over the arena writes that tensor's bytes, not the arena."""
    big = torch.randn(1 << 16)
    small = torch.randn(4)
    arena = Arena.create("test", _arena.needed_bytes([big, small]))
    try:
        skeleton, _ = _arena.stage([big, small], arena)
        torch.save(arena.view(skeleton[1]), tmp_path / "small.pt")
    finally:
        arena.close()
    assert (tmp_path / "small.pt").stat().st_size < 4096
    assert torch.equal(torch.load(tmp_path / "small.pt", weights_only=True), small)


def test_staging_refuses_an_arena_that_is_too_small() -> None:
    """Staging more than the arena holds raises instead of writing past its end."""
    arena = Arena.create("test", 64)
    try:
        with pytest.raises(ValueError, match="too small"):
            _arena.stage({"x": torch.zeros(1024)}, arena)
    finally:
        arena.close()


def test_staged_tensors_are_aligned() -> None:
    """Every staged tensor starts on an ALIGN-byte boundary (views of any dtype are legal)."""
    payload = [torch.zeros(3, dtype=torch.uint8), torch.zeros(5, dtype=torch.float64)]
    arena = Arena.create("test", _arena.needed_bytes(payload))
    try:
        skeleton, _ = _arena.stage(payload, arena)
    finally:
        arena.close()
    assert all(isinstance(s, StagedTensor) and s.offset % _arena.ALIGN == 0 for s in skeleton)


@pytest.mark.parametrize(
    ("env", "argument", "expected"),
    [
        ({}, None, False),
        ({"RVSUP_CKPT_ASYNC": "1"}, None, True),
        ({"RVSUP_CKPT_ASYNC": "1"}, False, False),
        ({}, True, True),
        ({"RVSUP_ENDPOINT": "ipc://x", "RVSUP_CKPT_ASYNC": "1"}, False, True),
        ({"RVSUP_ENDPOINT": "ipc://x", "RVSUP_CKPT_ASYNC": "0"}, True, False),
    ],
)
def test_async_setting_resolution(
    env: dict[str, str], argument: bool | None, expected: bool
) -> None:
    """Standalone, ``resume(async_save=...)`` beats RVSUP_CKPT_ASYNC; under rvsup job.toml (the
    environment the supervisor sets) wins."""
    settings = resolve(
        checkpoint_dir="/tmp/x",
        every_steps=None,
        every_s=None,
        keep_last=None,
        async_save=argument,
        env=env,
    )
    assert settings.async_save is expected


def test_manifest_mode_and_blocked_time_are_read_back(tmp_path: Path) -> None:
    """A manifest's mode and blocked_s reach CheckpointInfo; unknown or bad values read as None."""
    from worker_sdk.checkpoint.commit import commit

    for step, mode in ((1, "async"), (2, "sync")):
        tmp = tmp_path / layout.temp_name(step, "a1")
        tmp.mkdir()
        torch.save({}, tmp / layout.SHARED)
        torch.save({}, tmp / layout.rank_file(0))
        info = commit(
            directory=tmp_path,
            step=step,
            tmp=tmp,
            world_size=1,
            objects=(("Linear", layout.STATE_SHARED),),
            checksums={},
            keep_last=3,
            attempt_tag="a1",
            replace=False,
            mode=mode,
            blocked_s=0.25,
        )
        read = layout.validate(info.path)
        assert (read.mode, read.blocked_s) == (mode, 0.25)
    manifest = tmp_path / layout.committed_name(2) / layout.MANIFEST
    manifest.write_text(manifest.read_text().replace('"sync"', '"sideways"'))
    assert layout.validate(manifest.parent).mode is None
