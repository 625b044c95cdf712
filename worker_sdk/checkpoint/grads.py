"""The gradients a save finds in the parameters of the modules given to ``resume()``: kept in
each rank's rank file, put back by the restore.

Two common scripts hold gradients from one ``step()`` to the next:

- gradient accumulation (an optimizer step every K micro-batches, ``no_sync()`` for the others
  under DDP) with ``step()`` after every micro-batch: a save between two optimizer steps finds
  the micro-batches' gradients summed so far;
- a script that never zeroes its gradients (pytorch/examples' FSDP + tensor-parallel example):
  every step adds to the last.

A checkpoint without them resumes to another state. Each rank keeps its own (under
``no_sync()`` they differ between ranks): the local tensor of each parameter's gradient (a
DTensor's local shard), or only its name when it is all zeros (``zero_grad(set_to_none=False)``).
A script that zeroes with ``set_to_none`` (torch's default) before it saves has none to keep.
The restore sets every parameter's gradient to what was saved (``None`` where none was), so the
resumed attempt's next backward adds to what the failed attempt's would have.

Gradients are restored to the same world size only: on another, what each rank had summed
belongs to a split of the data that no longer exists, and resume() says it starts from none.
FSDP1 keeps the gradients of its flat parameters in its own buffers; a save that finds any
says they are not kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Final

import torch
from torch import nn

from .parallel import KIND_FSDP1, local_of, unwrap

__all__ = ["GradWatch", "capture", "fsdp1_note", "held", "restore"]

_TENSORS: Final = "tensors"  # parameter name -> its gradient's local tensor
_ZERO: Final = "zero"  # names of parameters whose gradient is all zeros


class GradWatch:
    """Whether a save must keep the gradients it finds, learnt from the script as it runs.

    After ``optimizer.step()`` the gradients it used are kept only if the script adds the next
    backward's to them: at the first backward after an optimizer step, a hook on one parameter
    (the first trainable one of the first module that has one; what a script does to one
    gradient it does to all) sees whether its gradient is still the one the step used,
    untouched (carried over), or was set to None or zeroed. A backward since the last optimizer step means
    gradients being accumulated: they are kept whatever the script does after its optimizer
    step. Until the script was seen at both (no optimizer given to ``resume()``, FSDP2's
    sharded parameters, which get no backward hook), every gradient found is kept.

    Its hooks do no I/O and no device work: two attribute reads and a comparison per backward
    and per optimizer step.
    """

    __slots__ = ("_carries", "_param", "_seen_at_step", "_stepped", "_version", "backwards")

    def __init__(self, objects: Sequence[Any]) -> None:
        self.backwards = 0  # backwards since the last optimizer step (or since resume())
        self._stepped = False  # an optimizer stepped, and no backward has been seen since
        self._carries: bool | None = None  # None: not seen yet
        # the watched parameter's gradient at the last optimizer step, weakly: a gradient the
        # script sets to None is freed at once (one parameter's may be an embedding's, GBs)
        self._seen_at_step: weakref.ref[torch.Tensor] | None = None
        self._version = -1
        self._param: torch.Tensor | None = None
        for obj in objects:
            if isinstance(obj, torch.optim.Optimizer):
                _innermost(obj).register_step_post_hook(self._after_optimizer_step)
        for obj in objects:
            if not isinstance(obj, nn.Module):
                continue
            p = next((p for p in unwrap(obj).parameters() if p.requires_grad), None)
            if p is not None and local_of(p) is p:  # not a DTensor's shard
                p.register_hook(self._before_accumulation)
                self._param = p
                break

    def wanted(self) -> bool:
        """Whether a save now keeps the gradients it finds."""
        return self.backwards > 0 or self._carries is not False

    def _after_optimizer_step(self, *_: Any) -> None:
        self.backwards = 0
        self._stepped = True
        grad = None if self._param is None else self._param.grad
        self._seen_at_step = None if grad is None else weakref.ref(grad)
        # the version counter every in-place change (zero_(), an accumulation) advances
        self._version = -1 if grad is None else grad._version  # noqa: SLF001

    def _before_accumulation(self, _incoming: torch.Tensor) -> None:
        self.backwards += 1
        if self._stepped:
            self._stepped = False
            grad = None if self._param is None else self._param.grad
            self._carries = (
                grad is not None
                and self._seen_at_step is not None
                and grad is self._seen_at_step()
                and grad._version == self._version  # noqa: SLF001
            )
        self._seen_at_step = None


def capture(objects: Sequence[Any], kinds: Sequence[str]) -> tuple[dict[str, Any], list[int]]:
    """Each module's parameters' gradients, by the module's position among ``objects``
    (references, nothing copied), and the FSDP1 modules whose gradients are not kept."""
    out: dict[str, Any] = {}
    fsdp1: list[int] = []
    for i, obj in enumerate(objects):
        if not isinstance(obj, nn.Module):
            continue
        tensors: dict[str, torch.Tensor] = {}
        zero: list[str] = []
        for name, p in unwrap(obj).named_parameters():
            g = p.grad
            if g is None:
                continue
            local = local_of(g)
            if bool(local.any()):
                tensors[name] = local.detach()
            else:
                zero.append(name)
        if not tensors and not zero:
            continue
        if kinds[i] == KIND_FSDP1:
            fsdp1.append(i)
            continue
        out[str(i)] = {_TENSORS: tensors, _ZERO: zero}
    return out, fsdp1


def fsdp1_note(indices: Sequence[int]) -> str:
    """What a save that found gradients in FSDP1 modules (``indices``) says, once."""
    return (
        f"rvsup: object(s) {list(indices)} (FSDP1) held gradients at a save: FSDP1 keeps them "
        "in buffers rvsup does not save, so a resume from it starts without them. Save after "
        "zero_grad() (call step() once per optimizer step), or use FSDP2 (fully_shard)"
    )


def held(saved: Any) -> bool:
    """Whether a rank file's gradients (``saved``) hold any."""
    return isinstance(saved, Mapping) and any(saved.values())


def restore(objects: Sequence[Any], saved: Mapping[str, Any]) -> None:
    """Set every parameter's gradient of every module in ``objects`` to what ``saved`` holds
    for it (None where nothing)."""
    for i, obj in enumerate(objects):
        if not isinstance(obj, nn.Module):
            continue
        entry = saved.get(str(i)) or {}
        tensors: Mapping[str, torch.Tensor] = entry.get(_TENSORS, {})
        zero = set(entry.get(_ZERO, ()))
        for name, p in unwrap(obj).named_parameters():
            if name in tensors:
                p.grad = _like(p, tensors[name])
            elif name in zero:
                p.grad = _like(p, None)
            else:
                p.grad = None


def _like(p: Any, value: torch.Tensor | None) -> torch.Tensor:
    """A gradient for ``p`` laid out as autograd makes it, holding ``value`` (None: zeros)."""
    local = local_of(p)
    grad: torch.Tensor = torch.zeros_like(local.detach(), memory_format=torch.preserve_format)
    if value is not None:
        if value.shape != grad.shape:
            raise ValueError(
                f"a saved gradient has shape {tuple(value.shape)}, the parameter's "
                f"{tuple(grad.shape)}: the model is not the one that was saved"
            )
        grad.copy_(value)
    if local is p:
        return grad
    from torch.distributed.tensor import DTensor  # a DTensor parameter: the module is loaded

    made: torch.Tensor = DTensor.from_local(
        grad, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
    )
    return made


def _innermost(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside a wrapper that subclasses Optimizer without being one (an
    Accelerate ``AcceleratedOptimizer``: its ``step()`` steps the one it wraps, skipped while
    gradients accumulate)."""
    while isinstance(inner := getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = inner
    return optimizer
