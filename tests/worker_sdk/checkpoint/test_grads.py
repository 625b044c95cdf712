"""Gradients held across a save (accumulated over micro-batches, or never zeroed) are kept and
restored, in one process; a script that zeroes them before its next backward keeps none."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.states import assert_same_state
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.grads import GradWatch
from worker_sdk.contract.layout import committed_name, rank_file

K = 3  # micro-batches per optimizer step


class Loop:
    """A tiny model and SGD with momentum, one micro-batch per :meth:`micro` (its data drawn
    from ``step``), in one of the shapes scripts write."""

    def __init__(self, shape: str) -> None:
        torch.manual_seed(0)
        self.shape = shape
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def micro(self, step: int) -> None:
        """One micro-batch; the optimizer steps (and the grads are zeroed, as the shape says)."""
        g = torch.Generator().manual_seed(step)
        x = torch.randn(5, 4, generator=g)
        if self.shape == "zero-at-top":
            self.opt.zero_grad()
        self.model(x).pow(2).mean().backward()
        boundary = self.shape != "accumulate" or step % K == K - 1
        if boundary:
            self.opt.step()
        if boundary and self.shape in ("accumulate", "zero-at-end"):
            self.opt.zero_grad(set_to_none=self.shape == "accumulate")

    def state(self) -> dict[str, object]:
        grads = {n: p.grad for n, p in self.model.named_parameters()}
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "grads": grads}


SHAPES: dict[str, tuple[bool, ...]] = {
    # wanted() after steps 0..5 of each shape: the first optimizer step's gradients are kept
    # (the next backward, which says whether they were zeroed, has not been seen yet)
    "zero-at-top": (True, False, False, False, False, False),
    "zero-at-end": (True, False, False, False, False, False),  # zeros: none to keep
    "never-zero": (True, True, True, True, True, True),  # the next backward adds to them
    "accumulate": (True, True, True, True, True, False),  # kept between optimizer steps
}


@pytest.mark.parametrize(("shape", "wanted"), SHAPES.items(), ids=list(SHAPES))
def test_the_watch_learns_whether_gradients_outlive_a_step(
    shape: str, wanted: tuple[bool, ...]
) -> None:
    """After each step of each loop shape, a save keeps gradients exactly when the script's
    next backward would add to them (until it was seen, it keeps what it finds)."""
    loop = Loop(shape)
    watch = GradWatch([loop.model, loop.opt])
    seen = []
    for step in range(len(wanted)):
        loop.micro(step)
        seen.append(watch.wanted())
    assert tuple(seen) == wanted


def test_the_watch_keeps_no_gradient_the_script_let_go_of() -> None:
    """After ``optimizer.step()`` and ``zero_grad()`` (set to None), the gradient the watch
    looked at is freed: it holds it weakly (it may be an embedding's, gigabytes on a device)."""
    loop = Loop("zero-at-end")
    loop.opt.zero_grad(set_to_none=True)
    watch = GradWatch([loop.model, loop.opt])
    loop.model(torch.randn(5, 4)).pow(2).mean().backward()
    first = next(loop.model.parameters())
    assert first.grad is not None
    seen = weakref.ref(first.grad)
    loop.opt.step()
    loop.opt.zero_grad(set_to_none=True)
    assert seen() is None
    loop.model(torch.randn(5, 4)).pow(2).mean().backward()
    assert (watch.backwards, watch._carries) == (1, False)  # seen zeroed, even so


def _resumed(
    tmp: Path, shape: str, save_at: int, total: int, watch: Callable[[Loop], GradWatch | None]
) -> Loop:
    """``shape`` run to ``save_at`` and saved, then a new process's worth (a fresh loop)
    restored from it and run to ``total``."""
    first = Loop(shape)
    ck = Checkpointer(tmp, rank=0, world_size=1, attempt_tag="a1", keep_last=2)
    ck.gradients = watch(first)
    for step in range(save_at + 1):
        first.micro(step)
    ck.save(save_at, [first.model, first.opt], None)
    second = Loop(shape)
    again = Checkpointer(tmp, rank=0, world_size=1, attempt_tag="a2", keep_last=2)
    assert again.load_latest([second.model, second.opt], None).step == save_at
    for step in range(save_at + 1, total):
        second.micro(step)
    return second


@pytest.mark.parametrize("shape", ["accumulate", "never-zero"])
def test_a_resume_between_optimizer_steps_is_exact(tmp_path: Path, shape: str) -> None:
    """Saved after micro-batch 4 (the second of an accumulation of three) or in a loop that
    never zeroes, restored into a fresh model: the run ends bit for bit as an uninterrupted
    one, gradients included. Without them the same resume ends elsewhere."""
    reference = Loop(shape)
    for step in range(9):
        reference.micro(step)
    resumed = _resumed(tmp_path / "kept", shape, 4, 9, lambda loop: GradWatch([loop.model]))
    assert_same_state(reference.state(), resumed.state(), shape)

    dropped = _resumed(tmp_path / "dropped", shape, 4, 9, lambda _: _never())
    with pytest.raises(AssertionError):
        assert_same_state(reference.state(), dropped.state(), shape)


def _never() -> GradWatch:
    watch = GradWatch([])
    watch._carries = False  # keeps nothing: what rvsup did before
    return watch


def test_all_zero_gradients_are_kept_by_name_and_stale_ones_not_at_all(tmp_path: Path) -> None:
    """zero_grad(set_to_none=False) leaves zeros: a save keeps their names, not their bytes,
    and the restore gives zero tensors back (an optimizer steps a parameter with a zero
    gradient, not one with none). A loop that zeroes at the top of the next step keeps
    nothing, and the restore leaves no gradient."""
    loop = Loop("zero-at-end")
    for step in range(2):
        loop.micro(step)
    ck = Checkpointer(tmp_path, rank=0, world_size=1, attempt_tag="a1", keep_last=2)
    ck.save(1, [loop.model, loop.opt], None)  # no watch: everything found is kept
    part = torch.load(tmp_path / committed_name(1) / rank_file(0), weights_only=True)
    assert part["grads"]["0"] == {
        "tensors": {},
        "zero": ["0.weight", "0.bias", "2.weight", "2.bias"],
    }
    fresh = Loop("zero-at-end")
    ck.load_latest([fresh.model, fresh.opt], None)
    assert all(p.grad is not None and not p.grad.any() for p in fresh.model.parameters())

    top = Loop("zero-at-top")
    ck = Checkpointer(tmp_path / "top", rank=0, world_size=1, attempt_tag="a1", keep_last=2)
    ck.gradients = GradWatch([top.model, top.opt])
    for step in range(3):
        top.micro(step)
    ck.save(2, [top.model, top.opt], None)
    part = torch.load(tmp_path / "top" / committed_name(2) / rank_file(0), weights_only=True)
    assert part["grads"] == {}
    fresh = Loop("zero-at-top")
    fresh.micro(0)  # a backward before resume(): its gradients are not the saved state's
    ck.load_latest([fresh.model, fresh.opt], None)
    assert all(p.grad is None for p in fresh.model.parameters())


@pytest.mark.usefixtures("one_process_group")
def test_sharded_gradients_come_back_as_dtensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FSDP2 (a 1-rank mesh): each gradient's local shard is saved and comes back as a
    DTensor on the parameter's mesh with the same values. FSDP1 keeps its gradients in flat
    buffers: a save that finds them says once that they are not kept."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.tensor import DTensor

    def fsdp2() -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        return model

    model = fsdp2()
    model(torch.randn(5, 4)).pow(2).mean().backward()
    ck = Checkpointer(tmp_path, rank=0, world_size=1, attempt_tag="a1", keep_last=2)
    ck.save(0, [model], None)
    fresh = fsdp2()
    ck.load_latest([fresh], None)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters(), strict=True):
        saved, restored = p.grad, q.grad
        assert isinstance(saved, DTensor) and isinstance(restored, DTensor), name
        assert restored.placements == saved.placements
        assert torch.equal(restored.to_local(), saved.to_local()), name

    torch.manual_seed(0)
    flat = FullyShardedDataParallel(nn.Linear(4, 2), device_id=torch.device("cpu"))
    flat(torch.randn(5, 4)).sum().backward()
    ck = Checkpointer(tmp_path / "fsdp1", rank=0, world_size=1, attempt_tag="a1", keep_last=2)
    capsys.readouterr()
    ck.save(0, [flat], None)
    ck.save(1, [flat], None)
    assert capsys.readouterr().err.count("(FSDP1) held gradients") == 1
    part = torch.load(tmp_path / "fsdp1" / committed_name(1) / rank_file(0), weights_only=True)
    assert part["grads"] == {}
