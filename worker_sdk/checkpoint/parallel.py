"""What state each object given to ``resume()`` holds, and whether rvsup can save it correctly.

- a plain module or a DDP/DataParallel/``torch.compile`` wrapper: replicated (every rank holds
  the same state); written once, by rank 0, into ``shared.pt``;
- a module with FSDP1 (``FullyShardedDataParallel``), FSDP2 (``fully_shard``) or other DTensor
  parameters: sharded; every rank writes its own shards through torch.distributed.checkpoint
  (``get_state_dict``/``set_state_dict``), together with the optimizers over its parameters;
- an optimizer: sharded with the module that owns its parameters, else replicated;
- anything else with ``state_dict``/``load_state_dict`` (LR schedulers, user objects):
  replicated.

Refused, with an error naming the object: objects without ``state_dict``/``load_state_dict``,
a data loader Accelerate prepared without ``use_stateful_dataloader`` (its ``state_dict`` fails),
ZeroRedundancyOptimizer (each rank holds another partition; its ``state_dict`` needs a
consolidation rvsup does not do), DeepSpeed engines and optimizers (they partition their state
themselves and save it with ``save_checkpoint``), and an optimizer over sharded parameters whose
module was not given, or whose parameters span several modules.

FSDP and DTensor are recognised without importing them: a script that never imported
``torch.distributed.fsdp`` / ``torch.distributed.tensor`` cannot have created such objects, and
importing them costs about a second.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from worker_sdk.contract.layout import STATE_DCP

__all__ = [
    "Group",
    "StatePlan",
    "Stateful",
    "class_name",
    "dcp_groups",
    "local_of",
    "module_kind",
    "plan",
    "unwrap",
]

KIND_MODULE: Final = "module"
KIND_DDP: Final = "ddp"
KIND_FSDP1: Final = "fsdp1"
KIND_FSDP2: Final = "fsdp2"
KIND_DTENSOR: Final = "dtensor"
SHARDED_KINDS: Final = frozenset({KIND_FSDP1, KIND_FSDP2, KIND_DTENSOR})


class Stateful(Protocol):
    """Anything checkpointable: modules, optimizers, LR schedulers, user objects."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def unwrap(obj: Any) -> Any:
    """The module inside DDP/DataParallel wrappers and ``torch.compile``; others unchanged."""
    while True:
        if isinstance(obj, (DistributedDataParallel, DataParallel)):
            obj = obj.module
            continue
        inner = getattr(obj, "_orig_mod", None)
        if isinstance(obj, torch.nn.Module) and isinstance(inner, torch.nn.Module):
            obj = inner
            continue
        return obj


def local_of(t: Any) -> Any:
    """This rank's tensor of ``t``: a DTensor's local shard, any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass(frozen=True, slots=True)
class Group:
    """A module and the optimizers over its parameters, checkpointed together by DCP."""

    module_index: int  # position among the objects given to resume()
    module: nn.Module  # DDP / torch.compile wrappers removed; FSDP kept
    optimizer_indices: tuple[int, ...]
    optimizers: tuple[torch.optim.Optimizer, ...]
    kind: str  # KIND_*

    @property
    def model_key(self) -> str:
        """The module's key in the DCP state dict."""
        return f"model.{self.module_index}"

    @property
    def optim_key(self) -> str:
        """The key of its optimizers' (merged) state in the DCP state dict."""
        return f"optim.{self.module_index}"


@dataclass(frozen=True, slots=True)
class StatePlan:
    """How each object's state is saved."""

    kinds: tuple[str, ...]  # per object: KIND_* for modules, "optimizer" or "other"
    classes: tuple[str, ...]  # per object: the class a format-2 manifest names
    groups: tuple[Group, ...]  # one per module, in order (sharded or not)
    sharded: frozenset[int]  # objects whose state goes through DCP

    def group_of(self, index: int) -> Group | None:
        """The group whose module or optimizer is object ``index``."""
        for g in self.groups:
            if index == g.module_index or index in g.optimizer_indices:
                return g
        return None

    @property
    def parallelism(self) -> str:
        """One word for the job: the sharded kind if any, else "ddp" or "module"."""
        for kind in (KIND_FSDP2, KIND_FSDP1, KIND_DTENSOR, KIND_DDP, KIND_MODULE):
            if kind in self.kinds:
                return kind
        return KIND_MODULE


def plan(objects: Sequence[Stateful]) -> StatePlan:
    """Classify ``objects``; raise TypeError/ValueError naming any that cannot be saved right."""
    for i, obj in enumerate(objects):
        _refuse_unsupported(i, obj)
    kinds: list[str] = []
    param_ids: dict[int, set[int]] = {}  # module index -> ids of its parameters
    for i, obj in enumerate(objects):
        if isinstance(obj, nn.Module):
            kinds.append(module_kind(obj))
            param_ids[i] = {id(p) for p in obj.parameters()}
        elif isinstance(obj, torch.optim.Optimizer):
            kinds.append("optimizer")
        else:
            kinds.append("other")
    owned: dict[int, list[int]] = {i: [] for i in param_ids}
    sharded: set[int] = {i for i in param_ids if kinds[i] in SHARDED_KINDS}
    for i, obj in enumerate(objects):
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        params = [p for group in obj.param_groups for p in group["params"]]
        ids = {id(p) for p in params}
        owners = [m for m, mine in param_ids.items() if ids <= mine]
        if owners:
            owned[owners[0]].append(i)
            if owners[0] in sharded:
                sharded.add(i)
            continue
        touched = [m for m, mine in param_ids.items() if ids & mine and m in sharded]
        if touched or any(_is_dtensor(p) for p in params):
            where = (
                f"parameters of objects {touched} (sharded modules) and others"
                if touched
                else "sharded (DTensor) parameters of a module that was not given to resume()"
            )
            raise ValueError(
                f"object {i} ({_describe(obj)}) optimizes {where}: pass resume() each sharded "
                "model together with its optimizers, one optimizer per model (rvsup saves an "
                "optimizer's shards with the model that owns its parameters)"
            )
    groups = tuple(
        Group(
            m,
            unwrap(objects[m]),
            tuple(owned[m]),
            tuple(objects[o] for o in owned[m]),  # type: ignore[misc]
            kinds[m],
        )
        for m in param_ids
    )
    return StatePlan(
        tuple(kinds), tuple(class_name(o) for o in objects), groups, frozenset(sharded)
    )


def class_name(obj: Any) -> str:
    """The class a manifest names: wrappers (DDP, torch.compile, FSDP1, FSDP2) removed.

    A checkpoint of an FSDP model names the model's own class, so that it loads into the same
    model wrapped another way (FSDP2 gives a module the class ``FSDP<name>``).
    """
    m = unwrap(obj)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None:
        while isinstance(m, fsdp.FullyShardedDataParallel):
            m = m.module
        cls = type(m)
        if issubclass(cls, fsdp.FSDPModule):
            cls = next(c for c in cls.__mro__[1:] if not issubclass(c, fsdp.FSDPModule))
        return cls.__qualname__
    return type(m).__qualname__


def _refuse_unsupported(i: int, obj: Any) -> None:
    mro = type(obj).__mro__
    if any(c.__module__.split(".")[0] == "deepspeed" for c in mro):
        raise TypeError(
            f"object {i} ({_describe(obj)}) is a DeepSpeed object: DeepSpeed partitions its state "
            "itself and saves it with engine.save_checkpoint(); rvsup cannot checkpoint it "
            "correctly. Give resume() plain torch modules and optimizers (DDP or FSDP)"
        )
    if any(c.__name__ == "ZeroRedundancyOptimizer" for c in mro):
        raise TypeError(
            f"object {i} ({_describe(obj)}) is a ZeroRedundancyOptimizer: each rank holds "
            "another partition of its state, and its state_dict() needs consolidate_state_dict() "
            "on every rank first; rvsup does not save it (it would save one rank's partition). "
            "Use FSDP (fully_shard) to shard optimizer state, or a plain optimizer"
        )
    if _is_prepared_loader(obj) and not getattr(obj, "use_stateful_dataloader", False):
        raise TypeError(
            f"object {i} ({_describe(obj)}) is a data loader prepared by Accelerate without "
            "use_stateful_dataloader: it holds no state to save (its state_dict() fails). Do "
            "not pass it to resume(): rvsup's checkpoints keep the state of its shuffling "
            "generator at every epoch's start, and the step resume() returns is its position: "
            "start the epoch loop at that step's epoch and skip the batches before it "
            "(accelerator.skip_first_batches(loader, n); docs/integrations.md, Accelerate)"
        )
    for method in ("state_dict", "load_state_dict"):
        if not callable(getattr(obj, method, None)):
            raise TypeError(
                f"object {i} ({_describe(obj)}) has no {method}(): resume() takes modules, "
                "optimizers, LR schedulers and other objects with state_dict()/load_state_dict()"
            )


def _is_prepared_loader(obj: Any) -> bool:
    """Whether ``obj`` is a data loader ``Accelerator.prepare()`` made (recognised without
    importing accelerate)."""
    return any(
        c.__module__.startswith("accelerate.") and c.__name__ == "DataLoaderAdapter"
        for c in type(obj).__mro__
    )


def module_kind(obj: nn.Module) -> str:
    """The parallelism of a module: one of the KIND_* values."""
    module = unwrap(obj)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None:
        subs = list(module.modules())
        if any(isinstance(s, fsdp.FullyShardedDataParallel) for s in subs):
            return KIND_FSDP1
        if any(isinstance(s, fsdp.FSDPModule) for s in subs):
            return KIND_FSDP2
    if any(_is_dtensor(p) for p in module.parameters()):
        return KIND_DTENSOR
    return KIND_DDP if _is_ddp(obj) else KIND_MODULE


def _is_ddp(obj: Any) -> bool:
    while True:
        if isinstance(obj, DistributedDataParallel):
            return True
        inner = getattr(obj, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return False
        obj = inner


def _is_dtensor(p: Any) -> bool:
    tensor_mod = sys.modules.get("torch.distributed.tensor")
    return tensor_mod is not None and isinstance(p, tensor_mod.DTensor)


def _describe(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def dcp_groups(plan: StatePlan, where: Sequence[str]) -> list[Group]:
    """The groups whose module's state is in DCP, each with its optimizers that are too."""
    return [
        dataclasses.replace(
            g,
            optimizer_indices=tuple(i for i in g.optimizer_indices if where[i] == STATE_DCP),
            optimizers=tuple(
                o
                for i, o in zip(g.optimizer_indices, g.optimizers, strict=True)
                if where[i] == STATE_DCP
            ),
        )
        for g in plan.groups
        if where[g.module_index] == STATE_DCP
    ]
