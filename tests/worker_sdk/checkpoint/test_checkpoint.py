"""Checkpointer in one process: bit-exact round trips, unwrapping, corruption, commit rules."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.states import assert_same_state, make_checkpointer, write_format1
from worker_sdk.checkpoint import checkpointer as checkpoint
from worker_sdk.checkpoint import rng as _rng
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.parallel import Stateful, unwrap
from worker_sdk.checkpoint.restore import LoadResult
from worker_sdk.contract import layout
from worker_sdk.contract.layout import (
    MANIFEST,
    MARKER,
    SHARED,
    committed_name,
    rank_file,
    temp_name,
)
from worker_sdk.contract.private_paths import dir_identity
from worker_sdk.contract.protocol import ENV_RESUME_BEFORE
from worker_sdk.runtime.determinism import reordered_sums_warning


@dataclass
class Cursor:
    """A non-tensor object in ``extra``: weights-only loading rejects it."""

    epoch: int
    offset: int


class Trainer:
    """A tiny model, Adam and a step LR schedule, trained on torch-random data."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)

    @property
    def objects(self) -> list[Stateful]:
        return [self.model, self.opt, self.sched]

    def step(self) -> None:
        x = torch.randn(16, 4)
        loss = self.model(x).pow(2).mean() + random.random() + float(np.random.rand())
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()


def draws() -> tuple[list[float], list[float], torch.Tensor]:
    return [random.random() for _ in range(3)], list(np.random.rand(3)), torch.rand(3)


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    """Model, Adam moments, LR schedule, extra and every RNG come back exactly."""
    t = Trainer(seed=1)
    for _ in range(3):
        t.step()
    extra = (torch.arange(5), 7, torch.tensor([1.5, -2.0]))
    result = make_checkpointer(tmp_path).save(2, t.objects, extra)
    assert (result.committed, result.step, result.path) == (True, 2, tmp_path / committed_name(2))
    assert result.nbytes == layout.validate(result.path).nbytes > 0
    assert result.seconds > 0
    saved = [obj.state_dict() for obj in t.objects]
    expected_draws = draws()

    fresh = Trainer(seed=2)
    fresh.step()
    random.seed(5)
    np.random.seed(5)
    loaded = make_checkpointer(tmp_path).load_latest(fresh.objects, extra=None)
    assert (loaded.step, loaded.path, loaded.skipped) == (2, result.path, ())
    assert_same_state(loaded.extra, extra)
    for before, obj in zip(saved, fresh.objects, strict=True):
        assert_same_state(before, obj.state_dict())
    assert fresh.opt.state_dict()["state"][0]["exp_avg_sq"].abs().sum() > 0
    got = draws()
    assert got[:2] == expected_draws[:2]
    assert torch.equal(got[2], expected_draws[2])


def test_format1_checkpoint_of_the_previous_release_still_loads(tmp_path: Path) -> None:
    """A checkpoint in the previous release's format 1 loads bit-exactly (state, extra, RNG),
    and the next save next to it is format 2."""
    t = Trainer(seed=1)
    for _ in range(3):
        t.step()
    path = write_format1(tmp_path, 2, t.objects, extra=(torch.arange(3), "x"))
    expected_draws = draws()
    assert layout.validate(path).format == 1
    saved = [obj.state_dict() for obj in t.objects]
    fresh = Trainer(seed=2)
    loaded = make_checkpointer(tmp_path).load_latest(fresh.objects, extra=None)
    assert (loaded.step, loaded.path, loaded.skipped) == (2, path, ())
    assert_same_state(loaded.extra, (torch.arange(3), "x"))
    for before, obj in zip(saved, fresh.objects, strict=True):
        assert_same_state(before, obj.state_dict())
    got = draws()
    assert got[:2] == expected_draws[:2]
    assert torch.equal(got[2], expected_draws[2])
    make_checkpointer(tmp_path).save(3, fresh.objects, extra=None)
    assert layout.validate(tmp_path / committed_name(3)).format == 2


def test_resumed_training_equals_uninterrupted(tmp_path: Path) -> None:
    """Training resumed from a checkpoint computes exactly what the uninterrupted run does."""
    t = Trainer(seed=1)
    for step in range(6):
        t.step()
        if step == 2:
            make_checkpointer(tmp_path).save(step, t.objects, extra=None)
    resumed = Trainer(seed=3)
    start = make_checkpointer(tmp_path).load_latest(resumed.objects, extra=None).step
    assert start == 2
    for _ in range(start + 1, 6):
        resumed.step()
    assert_same_state(t.model.state_dict(), resumed.model.state_dict())
    assert_same_state(t.opt.state_dict(), resumed.opt.state_dict())


def test_fresh_start_returns_given_extra(tmp_path: Path) -> None:
    """With nothing committed load_latest is a fresh start and hands back the given extra."""
    t = Trainer(seed=1)
    assert make_checkpointer(tmp_path / "none").load_latest(t.objects, extra=(1, 2)) == LoadResult(
        None, None, (1, 2), ()
    )


def test_save_layout_on_disk(tmp_path: Path) -> None:
    """A save leaves the marker, the committed directory with its manifest, and nothing else."""
    make_checkpointer(tmp_path / "c").save(4, Trainer(1).objects, extra=None)
    assert sorted(os.listdir(tmp_path / "c")) == [MARKER, committed_name(4)]
    assert (os.stat(tmp_path / "c" / MARKER).st_mode & 0o777) == 0o600
    path = tmp_path / "c" / committed_name(4)
    assert sorted(os.listdir(path)) == sorted([MANIFEST, SHARED, rank_file(0)])
    manifest = json.loads((path / MANIFEST).read_text())
    assert (manifest["format"], manifest["step"], manifest["world_size"]) == (2, 4, 1)
    assert manifest["objects"] == [
        {"class": "Sequential", "state": "shared"},
        {"class": "Adam", "state": "shared"},
        {"class": "StepLR", "state": "shared"},
    ]
    assert manifest["checksums"] == {}
    shared = torch.load(path / SHARED, weights_only=True)
    assert [e["class"] for e in shared["objects"].values()] == ["Sequential", "Adam", "StepLR"]


@pytest.mark.usefixtures("one_process_group")
def test_ddp_model_is_saved_unwrapped(tmp_path: Path) -> None:
    """A DDP model is saved as its inner module and loads into wrapped and plain models."""
    t = Trainer(seed=1)
    ddp = nn.parallel.DistributedDataParallel(t.model)
    make_checkpointer(tmp_path / "c").save(0, [ddp, t.opt], extra=None)
    shared = torch.load(tmp_path / "c" / committed_name(0) / SHARED, weights_only=True)
    keys = list(shared["objects"]["0"]["state"])
    assert keys
    assert not any(k.startswith("module.") for k in keys)
    plain = Trainer(seed=2)
    make_checkpointer(tmp_path / "c").load_latest([plain.model, plain.opt], extra=None)
    assert_same_state(t.model.state_dict(), plain.model.state_dict())
    wrapped = Trainer(seed=3)
    make_checkpointer(tmp_path / "c").load_latest(
        [nn.parallel.DistributedDataParallel(wrapped.model), wrapped.opt], None
    )
    assert_same_state(t.model.state_dict(), wrapped.model.state_dict())


def test_unwrap() -> None:
    """unwrap sees through DataParallel and torch.compile, and leaves other objects alone."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert unwrap(model) is model
    assert unwrap(opt) is opt
    assert unwrap(nn.DataParallel(model)) is model
    assert unwrap(torch.compile(model)) is model
    assert unwrap(torch.compile(nn.DataParallel(model))) is model


def scribble(path: Path) -> None:
    """Overwrite bytes in the middle of shared.pt: the size stays right, the content is wrong."""
    with open(path / SHARED, "r+b") as f:
        f.seek(os.path.getsize(path / SHARED) // 2)
        f.write(b"\x5a" * 64)


def truncate(path: Path) -> None:
    with open(path / rank_file(0), "r+b") as f:
        f.truncate(os.path.getsize(path / rank_file(0)) - 10)


@pytest.mark.parametrize(("damage", "reason"), [(truncate, "bytes"), (scribble, "damaged archive")])
def test_damaged_newest_is_skipped_and_reported(tmp_path: Path, damage: Any, reason: str) -> None:
    """A torn or corrupt newest checkpoint is passed over, reported, and the older one loaded."""
    t = Trainer(seed=1)
    ck = make_checkpointer(tmp_path)
    ck.save(1, t.objects, extra="one")
    t.step()
    ck.save(2, t.objects, extra="two")
    damage(tmp_path / committed_name(2))
    loaded = make_checkpointer(tmp_path).load_latest(Trainer(seed=2).objects, extra=None)
    assert (loaded.step, loaded.extra) == (1, "one")
    [(path, why)] = loaded.skipped
    assert path == tmp_path / committed_name(2)
    assert reason in why


def test_temp_dir_is_never_loaded(tmp_path: Path) -> None:
    """A complete-looking temporary directory of a newer step is ignored by load."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path).save(1, t.objects, extra="committed")
    tmp = tmp_path / temp_name(9, "a0")
    shutil.copytree(tmp_path / committed_name(1), tmp)
    manifest = json.loads((tmp / MANIFEST).read_text())
    (tmp / MANIFEST).write_text(json.dumps(manifest | {"step": 9}))
    loaded = make_checkpointer(tmp_path, tag="a2").load_latest(t.objects, extra=None)
    assert (loaded.step, loaded.extra, loaded.skipped) == (1, "committed", ())


def test_same_step_twice_keeps_the_first(tmp_path: Path) -> None:
    """Saving a step that is already validly committed keeps it and leaves no temp behind."""
    t = Trainer(seed=1)
    first = make_checkpointer(tmp_path).save(3, t.objects, extra="first")
    again = make_checkpointer(tmp_path, tag="a2").save(3, t.objects, extra="second")
    assert (again.committed, again.path, again.nbytes) == (True, first.path, first.nbytes)
    assert sorted(os.listdir(tmp_path)) == [MARKER, committed_name(3)]
    assert make_checkpointer(tmp_path).load_latest(t.objects, None).extra == "first"


def test_same_step_replaces_a_torn_one(tmp_path: Path) -> None:
    """Saving a step whose committed directory is torn replaces it with the new one."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path).save(3, t.objects, extra="first")
    truncate(tmp_path / committed_name(3))
    make_checkpointer(tmp_path, tag="a2").save(3, t.objects, extra="second")
    assert sorted(os.listdir(tmp_path)) == [MARKER, committed_name(3)]
    assert make_checkpointer(tmp_path).load_latest(t.objects, None).extra == "second"


def test_same_step_replaces_one_that_failed_to_load(tmp_path: Path) -> None:
    """A checkpoint with right sizes that failed to load is replaced when its step is re-saved."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path).save(3, t.objects, extra="first")
    scribble(tmp_path / committed_name(3))
    ck = make_checkpointer(tmp_path, tag="a2")
    assert ck.load_latest(t.objects, None).step is None
    ck.save(3, t.objects, extra="second")
    loaded = make_checkpointer(tmp_path).load_latest(t.objects, None)
    assert (loaded.step, loaded.extra, loaded.skipped) == (3, "second", ())


def test_a_rollback_loads_no_checkpoint_of_the_onset_or_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With RVSUP_RESUME_BEFORE (a rollback's onset) the newest checkpoint before it loads,
    never a later one; without it the newest."""
    ck = make_checkpointer(tmp_path, keep_last=5)
    t = Trainer(seed=1)
    for step in (9, 19, 29):
        ck.save(step, t.objects, extra=step)
    monkeypatch.setenv(ENV_RESUME_BEFORE, "25")
    assert make_checkpointer(tmp_path).load_latest(t.objects, None).step == 19
    monkeypatch.setenv(ENV_RESUME_BEFORE, "9")
    assert make_checkpointer(tmp_path).load_latest(t.objects, None).step is None
    monkeypatch.delenv(ENV_RESUME_BEFORE)
    assert make_checkpointer(tmp_path).load_latest(t.objects, None).step == 29


def test_keep_last_prunes_older_checkpoints(tmp_path: Path) -> None:
    """After several saves only the newest keep_last committed checkpoints remain."""
    ck = make_checkpointer(tmp_path, keep_last=2)
    t = Trainer(seed=1)
    for step in range(5):
        ck.save(step, t.objects, extra=step)
    assert sorted(os.listdir(tmp_path)) == [MARKER, committed_name(3), committed_name(4)]


def test_failure_mid_save_commits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If writing a part fails with a storage error, save() raises SaveError (which the runtime
    reports as checkpoint_failed and trains on), the step is not committed and the previous one
    stays newest."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path).save(1, t.objects, extra="one")
    real_save = torch.save

    def dies_on_rank_file(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if "rng" in obj:
            raise OSError("disk full")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr("torch.save", dies_on_rank_file)
    with pytest.raises(checkpoint.SaveError, match="step 2 is not committed: disk full") as err:
        make_checkpointer(tmp_path).save(2, t.objects, extra="two")
    assert isinstance(err.value.__cause__, OSError)
    monkeypatch.undo()
    assert not (tmp_path / committed_name(2)).exists()
    assert make_checkpointer(tmp_path, tag="a2").load_latest(t.objects, None).extra == "one"


def test_ranks_without_process_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch.distributed rank 0 commits only once every rank's part is there,
    and each rank loads its own part."""
    t = Trainer(seed=1)
    monkeypatch.setattr(checkpoint, "_PART_WAIT_S", 0.2)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\]"):
        make_checkpointer(tmp_path, world_size=2).save(1, t.objects, extra="r0")
    assert not (tmp_path / committed_name(1)).exists()
    r1 = make_checkpointer(tmp_path, rank=1, world_size=2).save(1, t.objects, extra="r1")
    assert not r1.committed
    assert make_checkpointer(tmp_path, world_size=2).save(1, t.objects, extra="r0").committed
    for rank in (0, 1):
        loaded = make_checkpointer(tmp_path, rank=rank, world_size=2).load_latest(t.objects, None)
        assert (loaded.step, loaded.extra) == (1, f"r{rank}")


def test_world_size_change_follows_the_per_rank_rule(tmp_path: Path) -> None:
    """A 1-rank checkpoint loads on 2 ranks: replicated state on both, rank 0 its own RNG and
    extra, the new rank 1 the given extra and RNGs seeded from (step, rank)."""
    t = Trainer(seed=1)
    t.step()
    make_checkpointer(tmp_path).save(1, t.objects, extra="r0")
    after_save = draws()
    results = []
    for rank in (0, 1):
        fresh = Trainer(seed=2 + rank)
        loaded = make_checkpointer(tmp_path, rank=rank, world_size=2).load_latest(
            fresh.objects, "given"
        )
        results.append((loaded, draws()))
        for saved, obj in zip(t.objects, fresh.objects, strict=True):
            assert_same_state(saved.state_dict(), obj.state_dict())
    (r0, draws0), (r1, draws1) = results
    assert (r0.step, r0.extra, r0.saved_world_size, r0.resharded_from, r0.own_part) == (
        1,
        "r0",
        1,
        1,
        True,
    )
    assert (r1.step, r1.extra, r1.resharded_from, r1.own_part) == (1, "given", 1, False)
    assert draws0[:2] == after_save[:2]
    assert torch.equal(draws0[2], after_save[2])
    _rng.seed_all(_rng.derived_seed(1, 1))
    expected1 = draws()
    assert draws1[:2] == expected1[:2]
    assert torch.equal(draws1[2], expected1[2])
    assert _rng.derived_seed(1, 1) not in (_rng.derived_seed(1, 0), _rng.derived_seed(2, 1))


@pytest.mark.parametrize(
    ("pick", "message"),
    [(lambda t: [t.opt, t.model, t.sched], "order"), (lambda t: [t.model], "holds 3 objects")],
)
def test_different_objects_are_refused(tmp_path: Path, pick: Any, message: str) -> None:
    """Objects given in another order or number than saved are refused with a clear error."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path).save(1, t.objects, extra=None)
    with pytest.raises(RuntimeError, match=message):
        make_checkpointer(tmp_path).load_latest(pick(Trainer(seed=2)), None)


def test_pickled_extra_loads_from_the_users_own_directory(tmp_path: Path) -> None:
    """extra that needs unpickling (a script's own class) loads from the user's own
    directory, whose files are private (0600, in 0700 directories)."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path / "c").save(1, t.objects, extra=Cursor(2, 30))
    assert make_checkpointer(tmp_path / "c").load_latest(t.objects, None).extra == Cursor(2, 30)
    step_dir = tmp_path / "c" / committed_name(1)
    assert stat.S_IMODE(step_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in step_dir.iterdir()} == {0o600}


@pytest.mark.parametrize(
    ("opened", "why"),
    [
        ("step", "writable by group or others"),
        ("file", "writable by group or others"),
        ("directory", "writable by others"),
        ("owner", "owned by uid 54321"),
    ],
)
def test_nothing_loads_from_a_checkpoint_others_could_have_written(
    tmp_path: Path, opened: str, why: str
) -> None:
    """Not even weights-only: a step directory or a file others can write, a checkpoint
    directory others can write, a file of another user: the load is refused, naming why
    (weights planted there would be resumed from as the job's own)."""
    if opened == "owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    t = Trainer(seed=1)
    make_checkpointer(tmp_path / "c").save(1, t.objects, extra=None)
    step_dir = tmp_path / "c" / committed_name(1)
    target = {
        "step": step_dir,
        "file": step_dir / SHARED,
        "directory": tmp_path / "c",
        "owner": step_dir / rank_file(0),
    }[opened]
    if opened == "owner":
        os.chown(target, 54321, -1)
    else:
        os.chmod(target, 0o777 if target.is_dir() else 0o666)
    with pytest.raises(RuntimeError, match="not loaded") as caught:
        make_checkpointer(tmp_path / "c").load_latest(t.objects, None)
    assert why in str(caught.value)


def test_a_checkpoint_that_is_a_symbolic_link_is_skipped(tmp_path: Path) -> None:
    """A committed name that is a link (to a checkpoint elsewhere) is never loaded through:
    skipped with the reason, and the newest real one is loaded."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path / "c").save(1, t.objects, extra=None)
    make_checkpointer(tmp_path / "elsewhere").save(5, t.objects, extra=None)
    (tmp_path / "c" / committed_name(5)).symlink_to(tmp_path / "elsewhere" / committed_name(5))
    result = make_checkpointer(tmp_path / "c").load_latest(t.objects, None)
    assert result.step == 1
    assert [(p.name, why) for p, why in result.skipped] == [
        (committed_name(5), "a symbolic link (rvsup never loads through one)")
    ]


def test_a_checkpoint_directory_replaced_since_the_start_is_refused(tmp_path: Path) -> None:
    """The directory rvsup start checked (its identity) was replaced by another since: nothing
    is loaded from it, and nothing is saved into it."""
    t = Trainer(seed=1)
    make_checkpointer(tmp_path / "c").save(1, t.objects, extra=None)
    identity = dir_identity(tmp_path / "c")
    (tmp_path / "c").rename(tmp_path / "moved")
    make_checkpointer(tmp_path / "planted").save(9, t.objects, extra=None)
    (tmp_path / "planted").rename(tmp_path / "c")
    ck = Checkpointer(
        tmp_path / "c", rank=0, world_size=1, attempt_tag="a1", keep_last=3, identity=identity
    )
    with pytest.raises(RuntimeError, match="replaced since"):
        ck.load_latest(t.objects, None)
    with pytest.raises(checkpoint.SaveError, match="nothing is saved"):
        ck.save(10, t.objects, extra=None)
    assert layout.latest(tmp_path / "c").step == 9  # type: ignore[union-attr]


@pytest.mark.usefixtures("one_process_group")
@pytest.mark.parametrize(
    ("find_unused", "world_size", "warned"),
    [(False, 4, True), (False, 3, True), (False, 2, False), (True, 4, False)],
)
def test_resume_warns_when_ddp_will_reorder_sums(
    find_unused: bool, world_size: int, warned: bool
) -> None:
    """A DDP model that rebuilds its buckets, with 3+ ranks, gets a warning naming the fix
    (find_unused_parameters=True); 2 ranks or a DDP that keeps its buckets get none."""
    ddp = nn.parallel.DistributedDataParallel(
        Trainer(seed=1).model, find_unused_parameters=find_unused
    )
    warning = reordered_sums_warning([ddp], world_size)
    assert (warning is not None) == warned
    assert warning is None or "find_unused_parameters=True" in warning
    assert reordered_sums_warning([Trainer(seed=1).model], 4) is None
