"""What a rank does as it dies of an exception: the supervisor is told why (an out-of-memory
error ends the rank with :data:`~worker_sdk.contract.protocol.EXIT_OOM`), and a
:class:`worker_sdk.UsageError` ends it with :data:`~worker_sdk.contract.protocol.EXIT_USAGE`."""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Final

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p
from worker_sdk.contract.protocol import UsageError

from .patches import Patch

if TYPE_CHECKING:
    from .channel import Channel
    from .runtime import Runtime

__all__ = ["exit_on_usage_error", "install_excepthook", "is_oom", "report_failure"]


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (torch's, or one named so, or MemoryError)."""
    if "torch" in sys.modules:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    return type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError)


def report_failure(channel: Channel | None, step: int, exc: BaseException) -> bool:
    """Tell the supervisor why this rank dies (at ``step``); True when it is an out-of-memory
    error."""
    oom = is_oom(exc)
    if channel is not None:
        kind = "oom" if oom else "exception"
        channel.send(m.Failure(step, kind, type(exc).__name__, str(exc)[:2000]))
    return oom


_REPORT: Final = "report an uncaught exception (OOM) before the rank dies"
_USAGE: Final = "a UsageError before a runtime exists ends the rank with EXIT_USAGE"
_usage_hook: list[Patch] = []  # applied once per process


def install_excepthook(rt: Runtime) -> Patch:
    """Report uncaught exceptions (OOM in particular) before the rank dies; the patch is
    undone at the runtime's shutdown."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        oom = False
        try:
            oom = report_failure(rt.channel, rt.last_step + 1, exc)
            rt.shutdown()
        finally:
            previous(kind, exc, tb)
        if oom:
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(p.EXIT_OOM)

    return Patch(sys, "excepthook", hook, _REPORT).apply()


def exit_on_usage_error() -> None:
    """Make an uncaught :class:`worker_sdk.UsageError` end the rank with
    :data:`~worker_sdk.contract.protocol.EXIT_USAGE` once its traceback is printed, so that the
    supervisor gives up at once instead of restarting a script that fails the same way. For
    the rest of the process; once only."""
    if _usage_hook:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        previous(kind, exc, tb)
        if isinstance(exc, UsageError):
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(p.EXIT_USAGE)

    _usage_hook.append(Patch(sys, "excepthook", hook, _USAGE).apply())
