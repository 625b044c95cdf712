"""Epoch loops resume bit-exactly in one process (no rvsup, a checkpoint directory): the loop as
the training guides write it, a DataLoader per epoch made again after resume(), AMP."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import worker_sdk
from tests.helpers.harness import REPO
from tests.helpers.states import assert_same_state

EPOCHS = 3
SAMPLES = 96
BATCH = 8  # 12 steps per epoch
EVERY = 5  # checkpoints after steps 4, 9, 14, 19, ...
STATEFUL = pytest.mark.skipif(
    importlib.util.find_spec("torchdata") is None, reason="needs torchdata (the data extra)"
)
TORCHDATA_WARNING = "ignore:'set_vital' is deprecated:UserWarning"
SKIPPED_EPOCHS = r"ignore:rvsup. \d+ batches were fetched:RuntimeWarning"  # a loop from epoch 0


@dataclass
class Run:
    """What one process of the epoch script leaves: the weights, the scaler's state per step."""

    start: int = 0
    final: dict[str, Any] | None = None  # None: killed
    scaler_after: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> state_dict
    scaler_at_resume: dict[str, Any] | None = None


def epoch_script(
    ckpt: Path, *, loader_kind: str, kill_before: int | None = None, every: int = EVERY
) -> Run:
    """The guides' epoch loop with the two calls added the obvious way: every epoch from 0, the
    batches below ``start`` skipped (a StatefulDataLoader: from the checkpoint's epoch, nothing
    skipped). ``kill_before``: the process ends before that step."""
    worker_sdk._reset_for_tests()
    torch.manual_seed(0)
    x, y = torch.randn(SAMPLES, 6), torch.randn(SAMPLES, 1)
    dataset = TensorDataset(x, y)
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=True
    )
    gen = torch.Generator()
    loader: Any
    if loader_kind == "default":
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    elif loader_kind == "shuffle":  # no sampler: a RandomSampler seeded from the global RNG
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True)
    elif loader_kind == "workers":
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2)
    elif loader_kind == "shuffle-generator":
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=gen)
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    stateful = [loader] if loader_kind == "stateful" else []
    start, _ = worker_sdk.resume(
        model, opt, scaler, *stateful, checkpoint_dir=ckpt, every_steps=every
    )
    run = Run(start=start, scaler_at_resume=dict(scaler.state_dict()))
    steps_per_epoch = len(loader)
    step = start
    epoch = start // steps_per_epoch if stateful else 0
    while epoch < EPOCHS:
        sampler.set_epoch(epoch)
        gen.manual_seed(1234 + epoch)
        for i, (xb, yb) in enumerate(loader):
            if not stateful:
                step = epoch * steps_per_epoch + i
            if step < start:
                continue
            if step == kill_before:
                worker_sdk._reset_for_tests()
                return run
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(xb).float(), yb)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            worker_sdk.step(step)
            run.scaler_after[step] = dict(scaler.state_dict())
            step += 1
        # a StatefulDataLoader restored after an epoch's last batch first yields nothing
        epoch = step // steps_per_epoch if stateful else epoch + 1
    worker_sdk._reset_for_tests()
    run.final = {"model": model.state_dict(), "opt": opt.state_dict()}
    return run


def in_a_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run in a Python process of its own, its warnings raised again here. For
    the scripts whose DataLoader forks worker processes: as a user's script does, they fork
    from a process of one script, not from a pytest worker with threads (and state) of its own,
    where such a fork once hung in multiprocessing's fd sharing."""
    with tempfile.TemporaryDirectory() as scratch:
        call, answer = Path(scratch, "call"), Path(scratch, "answer")
        call.write_bytes(pickle.dumps((fn, args)))
        code = f"from {__name__} import answer_call; answer_call({str(call)!r}, {str(answer)!r})"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr[-4000:]
        result, caught = pickle.loads(answer.read_bytes())  # written just now, by the call above
    for category, message in caught:
        warnings.warn(message, category, stacklevel=2)
    return result


def answer_call(call: str, answer: str) -> None:
    """In the fresh process: the call read from ``call``, its result and warnings written to
    ``answer``."""
    fn, args = pickle.loads(Path(call).read_bytes())  # the test's own file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    found = [(w.category, str(w.message)) for w in caught]
    Path(answer).write_bytes(pickle.dumps((result, found)))


def killed_then_resumed(ckpt: Path, loader_kind: str) -> Run:
    """The epoch script killed before step 17, then resumed to its end."""
    epoch_script(ckpt, loader_kind=loader_kind, kill_before=17)
    return epoch_script(ckpt, loader_kind=loader_kind)


def resumed(
    tmp_path: Path, loader_kind: str, kill_before: int, every: int = EVERY
) -> tuple[Run, Run]:
    """An uninterrupted run, and one killed before ``kill_before`` then resumed to the end."""
    reference = epoch_script(tmp_path / "ref", loader_kind=loader_kind, every=every)
    killed = epoch_script(
        tmp_path / "ckpt", loader_kind=loader_kind, kill_before=kill_before, every=every
    )
    assert killed.final is None
    return reference, epoch_script(tmp_path / "ckpt", loader_kind=loader_kind, every=every)


@pytest.mark.parametrize(
    ("kill_before", "start"),
    [(17, 15), (26, 25), (24, 20), (12, 10)],
    ids=["mid-epoch", "just-after-a-save", "checkpoint-ends-epoch-1", "epoch-0-checkpoint"],
)
def test_default_dataloader_epoch_loop_resumes_bit_exactly(
    tmp_path: Path, kill_before: int, start: int
) -> None:
    """DistributedSampler + set_epoch, a default DataLoader made again every epoch, dropout, bf16
    autocast with a GradScaler: killed mid-epoch or after a checkpoint that ends an epoch (12
    steps an epoch; 24 begins epoch 2 while the checkpoint of step 19 is mid-epoch), the resumed
    run ends with the uninterrupted run's weights and optimizer, and the GradScaler's state right
    after resume() is the uninterrupted run's after the checkpoint's step. The only warning says
    that the loop read the epochs done only to skip them, and how not to."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference, run = resumed(tmp_path, "default", kill_before)
    assert run.start == start
    # the one note: the loop reads the epochs done only to skip them (from epoch 1 on)
    notes = [str(w.message) for w in caught]
    assert len(notes) == (start >= 12), notes
    assert all(n.startswith(f"rvsup: {start + 1} batches were fetched") for n in notes), notes
    assert all("range(start // len(loader), epochs)" in n for n in notes), notes
    assert run.final is not None and reference.final is not None
    assert_same_state(reference.final, run.final)
    assert run.scaler_at_resume == reference.scaler_after[start - 1]
    assert len({s["scale"] for s in reference.scaler_after.values()}) > 1  # the scale moved


@pytest.mark.filterwarnings(SKIPPED_EPOCHS)
def test_a_checkpoint_at_an_epochs_last_step_resumes_bit_exactly(tmp_path: Path) -> None:
    """The checkpoint of step 23 (every 12 steps) is the last batch of epoch 1: the resumed run's
    first step is the first of epoch 2, whose iterator draws its seed from the checkpoint's RNG
    state as in the uninterrupted run; the weights end bit-identical."""
    reference, run = resumed(tmp_path, "default", 30, every=12)
    assert run.start == 24
    assert run.final is not None and reference.final is not None
    assert_same_state(reference.final, run.final)


def test_a_shuffling_dataloader_without_generator_is_named_and_the_advice_works(
    tmp_path: Path,
) -> None:
    """DataLoader(shuffle=True) draws its permutation from the global RNG when its iterator is
    made: resumed mid-epoch, the first step() warns, saying what to change; the same loader
    with its own generator seeded at the top of every epoch (the change asked for) resumes
    bit-exactly, without a warning."""
    epoch_script(tmp_path / "ckpt", loader_kind="shuffle", kill_before=17)
    with pytest.warns(RuntimeWarning, match=r"generator=g.*g\.manual_seed\(seed \+ epoch\)"):
        epoch_script(tmp_path / "ckpt", loader_kind="shuffle")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", r"rvsup: \d+ batches were fetched")
        reference, run = resumed(tmp_path / "fixed", "shuffle-generator", 17)
    assert run.final is not None and reference.final is not None
    assert_same_state(reference.final, run.final)


def test_worker_processes_seeded_from_the_global_rng_are_named(tmp_path: Path) -> None:
    """A DataLoader with worker processes and no generator, resumed mid-epoch: the workers'
    seeds come from the global RNG when the iterator is made again, so random draws in them
    would differ; the first step() says so, and what to change."""
    with pytest.warns(RuntimeWarning, match=r"worker processes seeded from the global RNG"):
        in_a_fresh_process(killed_then_resumed, tmp_path / "ckpt", "workers")


@STATEFUL
@pytest.mark.filterwarnings(TORCHDATA_WARNING)
@pytest.mark.parametrize(("kill_before", "every"), [(17, 5), (30, 12)], ids=["mid", "boundary"])
def test_stateful_dataloader_with_workers_resumes_bit_exactly(
    tmp_path: Path, kill_before: int, every: int
) -> None:
    """torchdata's StatefulDataLoader with 2 worker processes, given to resume(): killed mid-epoch,
    or after a checkpoint at an epoch's last batch, the resumed run continues where the
    checkpoint left the loader and ends bit-identical to the uninterrupted run."""
    reference, run = in_a_fresh_process(resumed, tmp_path, "stateful", kill_before, every)
    assert run.final is not None and reference.final is not None
    assert_same_state(reference.final, run.final)


def accumulating_script(ckpt: Path, *, kill_before: int | None = None) -> dict[str, Any] | None:
    """An epoch loop accumulating gradients over 2 batches, ``step()`` once per optimizer step
    (its number the optimizer step's), dropout in the model, the batches before the resumed
    step skipped; a checkpoint every 2 optimizer steps. The final state, or None when killed
    before batch ``kill_before``."""
    worker_sdk._reset_for_tests()
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(SAMPLES, 6), torch.randn(SAMPLES, 1))
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=torch.Generator())
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    start, _ = worker_sdk.resume(model, opt, checkpoint_dir=ckpt, every_steps=2)
    first = start * 2  # the batch after the optimizer step resumed from
    per_epoch = len(loader)
    for epoch in range(first // per_epoch, EPOCHS):
        for i, (xb, yb) in enumerate(loader):
            batch = epoch * per_epoch + i
            if batch < first:
                continue
            if batch == kill_before:
                worker_sdk._reset_for_tests()
                return None
            (nn.functional.mse_loss(model(xb), yb) / 2).backward()
            if batch % 2 == 1:
                opt.step()
                opt.zero_grad()
                worker_sdk.step(batch // 2)
    worker_sdk._reset_for_tests()
    return {"model": model.state_dict(), "opt": opt.state_dict()}


def test_step_once_per_optimizer_step_resumes_bit_exactly(tmp_path: Path) -> None:
    """Killed before batch 19: the checkpoint of optimizer step 7 ends batch 15, mid-epoch 1;
    the resumed loop skips batches 12 to 15 and trains on 16 and 17 before its first step().
    The checkpoint's RNG states are put back for the skipped batches and the first trained
    one, never again once the model ran (batch 17's dropout masks were batch 16's before), and
    the run ends bit-identical to the uninterrupted one."""
    reference = accumulating_script(tmp_path / "ref")
    assert accumulating_script(tmp_path / "ckpt", kill_before=19) is None
    resumed_run = accumulating_script(tmp_path / "ckpt")
    assert reference is not None and resumed_run is not None
    assert_same_state(reference, resumed_run)
