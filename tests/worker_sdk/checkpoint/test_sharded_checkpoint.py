"""Sharded state in one process (a 1-rank gloo group): FSDP1/FSDP2 through DCP inside rvsup's
commit, checksums, trust, refusals, and what is saved where."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.utils._pytree import tree_map

import worker_sdk
from tests.helpers.states import assert_same_state, write_format1
from worker_sdk.checkpoint import checkpointer as checkpoint
from worker_sdk.checkpoint import dcp as _dcp
from worker_sdk.checkpoint import parallel as _parallel
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.contract import layout
from worker_sdk.contract.layout import MANIFEST, committed_name

pytestmark = pytest.mark.usefixtures("one_process_group")


def build(kind: str, seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """A small MLP as `kind` ("plain", "fsdp1", "fsdp2"), Adam and a step LR schedule."""
    torch.manual_seed(seed)
    model: nn.Module = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    if kind == "fsdp2":
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.children():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind == "fsdp1":
        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(objects: tuple[nn.Module, torch.optim.Optimizer, Any], steps: int) -> None:
    model, opt, sched = objects
    for _ in range(steps):
        loss = model(torch.randn(8, 6)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
    """A copy of the full (unsharded) model and optimizer state, keyed by parameter names."""
    # cpu_offload=True crashes FSDP1 on CPU (torch 2.13): the tensors are on the CPU anyway
    state = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, state)


def ck(directory: Path, tag: str = "a1") -> Checkpointer:
    return Checkpointer(directory, rank=0, world_size=1, attempt_tag=tag, keep_last=3)


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1"])
def test_sharded_round_trip_through_dcp(tmp_path: Path, kind: str) -> None:
    """An FSDP model and its Adam go through dcp/ (checksummed in the manifest), the schedule
    through shared.pt; a fresh FSDP model gets the full state back bit-exactly."""
    t = build(kind, seed=1)
    train(t, 3)
    saved = full_state(t[0], t[1])
    saved_sched = t[2].state_dict()
    result = ck(tmp_path).save(2, list(t), extra={"k": 1})
    manifest = json.loads((result.path / MANIFEST).read_text())
    assert manifest["format"] == 2
    assert manifest["objects"] == [
        {"class": "Sequential", "state": "dcp"},
        {"class": "Adam", "state": "dcp"},
        {"class": "StepLR", "state": "shared"},
    ]
    assert sorted(manifest["checksums"]) == ["dcp/.metadata", "dcp/__0_0.distcp"]
    assert set(manifest["checksums"]) <= set(manifest["files"])
    assert oct(os.stat(result.path / "dcp" / "__0_0.distcp").st_mode & 0o777) == oct(0o600)

    fresh = build(kind, seed=7)
    loaded = ck(tmp_path, "a2").load_latest(list(fresh), extra=None)
    assert (loaded.step, loaded.extra, loaded.skipped, loaded.resharded_from) == (
        2,
        {"k": 1},
        (),
        None,
    )
    assert_same_state(saved, full_state(fresh[0], fresh[1]))
    assert_same_state(saved_sched, fresh[2].state_dict())


def test_sharded_checkpoint_loads_into_a_plain_model(tmp_path: Path) -> None:
    """An FSDP2 checkpoint restores the same model unwrapped (the manifest names the model's own
    class, not FSDP2's FSDPSequential)."""
    t = build("fsdp2", seed=1)
    train(t, 2)
    saved = full_state(t[0], t[1])
    ck(tmp_path).save(1, list(t), extra=None)
    plain = build("plain", seed=3)
    assert ck(tmp_path, "a2").load_latest(list(plain), extra=None).step == 1
    assert_same_state(saved, full_state(plain[0], plain[1]))


def flip_bytes(path: Path) -> None:
    """Overwrite bytes in the middle of a file: its size stays right, its content is wrong."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x5a" * 32)


def test_corrupt_dcp_file_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    """A DCP data file with the right size and wrong bytes fails its CRC: that checkpoint is
    skipped (and reported) and the previous one is loaded."""
    t = build("fsdp2", seed=1)
    train(t, 1)
    ck(tmp_path).save(0, list(t), extra="zero")
    first = full_state(t[0], t[1])
    train(t, 1)
    ck(tmp_path).save(1, list(t), extra="one")
    flip_bytes(tmp_path / committed_name(1) / "dcp" / "__0_0.distcp")
    fresh = build("fsdp2", seed=9)
    loaded = ck(tmp_path, "a2").load_latest(list(fresh), extra=None)
    assert (loaded.step, loaded.extra) == (0, "zero")
    [(path, why)] = loaded.skipped
    assert path == tmp_path / committed_name(1)
    assert "dcp/__0_0.distcp: CRC-32" in why
    assert_same_state(first, full_state(fresh[0], fresh[1]))


def test_dcp_files_others_can_write_are_never_unpickled(tmp_path: Path) -> None:
    """DCP unpickles its metadata: a checkpoint whose dcp/ files others can write is refused."""
    t = build("fsdp2", seed=1)
    train(t, 1)
    result = ck(tmp_path).save(0, list(t), extra=None)
    os.chmod(result.path / "dcp" / ".metadata", 0o666)
    with pytest.raises(RuntimeError, match=r"unpickles its files.*writable by group or others"):
        ck(tmp_path, "a2").load_latest(list(build("fsdp2", seed=2)), extra=None)


def test_optimizer_before_its_first_step_is_saved_as_it_is(tmp_path: Path) -> None:
    """An FSDP optimizer without state yet is saved replicated (empty), not given invented zero
    moments by DCP, and the live one stays empty."""
    t = build("fsdp2", seed=1)
    result = ck(tmp_path).save(0, list(t), extra=None)
    assert not t[1].state
    manifest = json.loads((result.path / MANIFEST).read_text())
    assert [o["state"] for o in manifest["objects"]] == ["dcp", "shared", "shared"]
    fresh = build("fsdp2", seed=2)
    assert ck(tmp_path, "a2").load_latest(list(fresh), extra=None).step == 0
    assert not fresh[1].state
    assert_same_state(full_state(t[0], t[1]), full_state(fresh[0], fresh[1]))


def test_format1_checkpoint_of_a_sharded_model_is_refused(tmp_path: Path) -> None:
    """A format-1 checkpoint (earlier releases: rank 0's shards only) is never loaded into a
    sharded model."""
    t = build("fsdp2", seed=1)
    train(t, 1)
    write_format1(tmp_path, 0, [t[1], t[2]], extra=None)  # what the old writer could save
    with pytest.raises(RuntimeError, match=r"earlier rvsup.*object 0 \(Sequential\) is sharded"):
        ck(tmp_path, "a2").load_latest(list(build("fsdp2", seed=2)), extra=None)


class FakeEngine:
    """Stands in for deepspeed.DeepSpeedEngine (recognised by its module, never imported)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


FakeEngine.__module__ = "deepspeed.runtime.engine"


class NoState:
    """Has no state_dict()."""


def zero_optimizer() -> Any:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(nn.Linear(2, 2).parameters(), optimizer_class=torch.optim.Adam)


def orphan_fsdp_optimizer() -> Any:
    _model, opt, _ = build("fsdp2", seed=1)
    return opt  # its module is not given


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (FakeEngine, TypeError, r"object 0 \(deepspeed\.runtime\.engine\.FakeEngine\).*DeepSpeed"),
        (zero_optimizer, TypeError, r"object 0 \(.*ZeroRedundancyOptimizer\).*partition"),
        (NoState, TypeError, r"object 0 \(.*NoState\) has no state_dict\(\)"),
        (orphan_fsdp_optimizer, ValueError, r"object 0 \(torch\.optim\.adam\.Adam\).*sharded"),
    ],
)
def test_resume_refuses_state_it_cannot_save_correctly(
    tmp_path: Path, make: Any, error: type[Exception], message: str
) -> None:
    """resume() raises a clear error naming the object rvsup would save wrongly, before any
    checkpoint is written."""
    obj = make()
    try:
        with pytest.raises(error, match=message):
            worker_sdk.resume(obj, checkpoint_dir=tmp_path / "c", every_steps=1)
    finally:
        worker_sdk._reset_for_tests()
    assert not (tmp_path / "c").exists() or not any(
        layout.COMMITTED_RE.match(p.name) for p in (tmp_path / "c").iterdir()
    )


@pytest.mark.parametrize(
    ("kind", "expected"), [("plain", "module"), ("fsdp1", "fsdp1"), ("fsdp2", "fsdp2")]
)
def test_plan_recognises_each_parallelism(kind: str, expected: str) -> None:
    """The plan names the model's parallelism, pairs the optimizer with it, and shards exactly
    the FSDP model and its optimizer."""
    objects: list[Stateful] = list(build(kind, seed=1))
    plan = _parallel.plan(objects)
    assert plan.kinds == (expected, "optimizer", "other")
    assert plan.parallelism == expected
    assert [(g.module_index, g.optimizer_indices) for g in plan.groups] == [(0, (1,))]
    assert plan.sharded == (frozenset({0, 1}) if kind != "plain" else frozenset())
    assert plan.classes == ("Sequential", "Adam", "StepLR")


def test_plan_of_a_ddp_model() -> None:
    """A DDP model is replicated (kind ddp), saved as its inner module's class."""
    model, opt, sched = build("plain", seed=1)
    plan = _parallel.plan([nn.parallel.DistributedDataParallel(model), opt, sched])
    assert (plan.kinds[0], plan.sharded, plan.classes[0]) == ("ddp", frozenset(), "Sequential")


def test_failure_before_the_sharded_write_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank that cannot write its own part fails the save before DCP writes anything: nothing
    is committed and the previous checkpoint stays the newest."""
    t = build("fsdp2", seed=1)
    train(t, 1)
    ck(tmp_path).save(0, list(t), extra="zero")

    def disk_full(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "write_durable", disk_full)
    with pytest.raises(checkpoint.SaveError, match="disk full") as err:
        ck(tmp_path).save(1, list(t), extra="one")
    assert isinstance(err.value.__cause__, OSError)
    monkeypatch.undo()
    assert not (tmp_path / committed_name(1)).exists()
    assert not list(tmp_path.glob(".tmp-step-0000000001-*/dcp/*"))
    fresh = build("fsdp2", seed=2)
    assert ck(tmp_path, "a2").load_latest(list(fresh), None).extra == "zero"


def test_each_rank_verifies_its_share_of_the_checksums(tmp_path: Path) -> None:
    """With 2 ranks, rank 0 checks files 0, 2, ... and rank 1 files 1, 3, ...: a bad file is
    found by exactly one rank (whose failure every rank then acts on)."""
    names = [f"dcp/f{i}" for i in range(4)]
    (tmp_path / "dcp").mkdir()
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    sums = [(name, _dcp.crc32_file(tmp_path / name)) for name in names]
    bad = [*sums[:3], ("dcp/f3", sums[3][1] ^ 1)]
    _dcp.verify(tmp_path, bad, rank=0, world_size=2)
    with pytest.raises(ValueError, match="dcp/f3: CRC-32"):
        _dcp.verify(tmp_path, bad, rank=1, world_size=2)
    _dcp.verify(tmp_path, sums, rank=1, world_size=2)
