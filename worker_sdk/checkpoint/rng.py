"""Capture and restore every random number generator a training step may draw from.

The captured form holds only tuples, ints, floats, strings and tensors, so a checkpoint
holding it loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is optional for training scripts
    np = None  # type: ignore[assignment]


def capture() -> dict[str, Any]:
    """The current states of Python's, NumPy's (if importable), torch's CPU and CUDA RNGs.

    CUDA states are captured only once CUDA is initialised in this process, so a CPU-only
    script on a GPU host does not create CUDA contexts just to be checkpointed.
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (version, tuple(internal), gauss),
        "torch": torch.get_rng_state(),
    }
    np_state = None if np is None else np.random.get_state(legacy=True)
    if isinstance(np_state, tuple):
        kind, keys, pos, has_gauss, cached = np_state
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore(state: Mapping[str, Any]) -> None:
    """Put back the states :func:`capture` returned (those present in ``state``)."""
    prepare(state)()


def prepare(state: Mapping[str, Any]) -> Callable[[], None]:
    """A function that puts back ``state``, converted once (restored many times: 0.1 ms)."""
    version, internal, gauss = state["python"]
    python = (int(version), tuple(int(x) for x in internal), gauss)
    cpu = _byte_tensor(state["torch"])
    saved_np = state.get("numpy")
    numpy_state = None
    if np is not None and saved_np is not None:
        numpy_state = (
            str(saved_np["kind"]),
            saved_np["keys"].numpy().astype(np.uint32),
            int(saved_np["pos"]),
            int(saved_np["has_gauss"]),
            float(saved_np["cached_gaussian"]),
        )
    saved_cuda = state.get("cuda")
    cuda = []
    if saved_cuda and torch.cuda.is_available():
        cuda = [_byte_tensor(c) for c in saved_cuda[: torch.cuda.device_count()]]

    def put_back() -> None:
        random.setstate(python)
        torch.set_rng_state(cpu)
        if numpy_state is not None:
            np.random.set_state(numpy_state)
        for index, cuda_state in enumerate(cuda):
            torch.cuda.set_rng_state(cuda_state, index)

    return put_back


def derived_seed(step: int, rank: int) -> int:
    """The seed of a rank that has no saved RNG states (a resume on more ranks than saved).

    The first 8 bytes of SHA-256 of ``"rvsup-rng:<step>:<rank>"`` as a little-endian integer,
    top bit cleared: the same for every run, different for every (step, rank).
    """
    digest = hashlib.sha256(f"rvsup-rng:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's (if importable), torch's CPU and every CUDA RNG from ``seed``."""
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CUDA devices too


def _byte_tensor(value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"an RNG state must be a tensor, got {type(value).__name__}")
    return value.detach().to(device="cpu", dtype=torch.uint8).contiguous()
