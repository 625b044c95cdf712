"""Staging for asynchronous saves: tensors copied into shared memory that a writer process reads.

An :class:`Arena` is one shared-memory file (``memfd``) mapped by the rank and by its writer
process. It is allocated once, reserved up front (``posix_fallocate``: running out of shared
memory is an ``OSError`` here, never a ``SIGBUS`` in the middle of a copy) and reused by every
save, so the resident memory of a job does not grow with the number of saves; it grows only when
the state does.

:func:`stage` copies every tensor reachable through dicts, lists and tuples of a payload into an
arena and returns the payload's *skeleton*: the same structure with each tensor replaced by a
:class:`StagedTensor` (where its bytes are). The skeleton is small and pickled to the writer,
which rebuilds the tensors over the same memory with :func:`rebuild` (no copy). Anything else in a
payload is pickled by value with the skeleton, which is itself a copy.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import torch

__all__ = ["Arena", "StagedTensor", "rebuild", "stage", "tensors_in"]

ALIGN: Final = 64  # every staged tensor starts at a multiple of this many bytes


@dataclass(frozen=True, slots=True)
class StagedTensor:
    """Where one staged tensor's bytes are in an arena."""

    offset: int
    nbytes: int
    dtype: str  # e.g. "float32" (torch.<dtype>)
    shape: tuple[int, ...]


class Arena:
    """A reusable shared-memory region: the rank copies into it, its writer reads from it."""

    def __init__(self, fd: int, size: int) -> None:
        """Map the shared-memory file ``fd`` of ``size`` bytes (the arena owns ``fd``)."""
        self.fd, self.size = fd, size
        self._map = mmap.mmap(fd, size)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)  # the whole region

    @classmethod
    def create(cls, name: str, size: int) -> Arena:
        """A new arena of at least ``size`` bytes, its memory reserved."""
        size = max(size, ALIGN)
        fd = os.memfd_create(f"rvsup-stage-{name}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def view(self, staged: StagedTensor) -> torch.Tensor:
        """The staged tensor, over the arena's memory, as its own storage (torch.save of it
        writes just its bytes, not the arena)."""
        dtype = getattr(torch, staged.dtype)
        if staged.nbytes == 0:
            return torch.empty(staged.shape, dtype=dtype)
        flat = torch.frombuffer(
            self._map, dtype=torch.uint8, count=staged.nbytes, offset=staged.offset
        )
        return flat.view(dtype).view(staged.shape)

    def close(self) -> None:
        del self.bytes
        self._map.close()
        os.close(self.fd)


def tensors_in(payload: Any) -> Iterator[torch.Tensor]:
    """Every stageable tensor reachable through dicts, lists and tuples (each once)."""
    seen: set[int] = set()
    stack = [payload]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if _stageable(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)


def needed_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors)


def stage(payload: Any, arena: Arena, start: int = 0) -> tuple[Any, int]:
    """Copy ``payload``'s tensors into ``arena`` from byte ``start``; return (skeleton, end).

    The arena must be large enough (:func:`needed_bytes` of :func:`tensors_in`). A tensor that
    appears twice (tied weights) is staged once and comes back as one tensor.
    """
    placed: dict[int, StagedTensor] = {}
    offset = start
    for t in tensors_in(payload):
        nbytes = t.numel() * t.element_size()
        staged = StagedTensor(offset, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        if nbytes:
            if offset + nbytes > arena.size:
                raise ValueError(f"staging arena too small ({arena.size} bytes)")
            target = arena.bytes[offset : offset + nbytes].view(t.dtype).view(t.shape)
            target.copy_(t.detach())
        placed[id(t)] = staged
        offset += _aligned(nbytes)
    return _replace(payload, placed), offset


def rebuild(skeleton: Any, arena: Arena) -> Any:
    """The writer's side of :func:`stage`: the payload, its tensors over the arena's memory."""
    views: dict[StagedTensor, torch.Tensor] = {}

    def build(obj: Any) -> Any:
        if isinstance(obj, StagedTensor):
            if obj not in views:
                views[obj] = arena.view(obj)
            return views[obj]
        if isinstance(obj, dict):
            return _same_kind(obj, {k: build(v) for k, v in obj.items()})
        if isinstance(obj, list):
            return [build(v) for v in obj]
        if isinstance(obj, tuple):
            items = [build(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        return obj

    return build(skeleton)


def _replace(obj: Any, placed: dict[int, StagedTensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        staged = placed.get(id(obj))
        return staged if staged is not None else obj.detach().clone()
    if isinstance(obj, dict):
        return _same_kind(obj, {k: _replace(v, placed) for k, v in obj.items()})
    if isinstance(obj, list):
        return [_replace(v, placed) for v in obj]
    if isinstance(obj, tuple):
        values = [_replace(v, placed) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj


def _same_kind(original: dict[Any, Any], items: dict[Any, Any]) -> dict[Any, Any]:
    """``items`` as a dict of ``original``'s type (dict or OrderedDict) with its attributes (a
    module state dict's ``_metadata``, which ``load_state_dict`` reads)."""
    if type(original) is not OrderedDict:
        return items
    out: OrderedDict[Any, Any] = OrderedDict(items)
    out.__dict__.update(vars(original))
    return out


def _stageable(t: torch.Tensor) -> bool:
    return (
        (type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter))
        and t.layout is torch.strided
        and t.device.type in ("cpu", "cuda")
        and not t.is_quantized
    )


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
