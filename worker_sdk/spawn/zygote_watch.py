"""A node's zygote on a multi-node job, and the word of its end: the task of the zygote step.

``python -m worker_sdk.spawn.zygote_watch ZYGOTE_ARGV...`` is what srun runs once on every node of
a multi-node job (``supervisor/process/zygote.py``). It starts the zygote as its child, tied to
it by the parent-death signal, waits for it, and when it ends says so on standard output as
the zygote's own facts are said (one JSON line, with the node): ``{"gone": "killed by signal 9",
"node": "node2"}``. The supervisor, which cannot see processes on other nodes, learns that the
node's next ranks start cold, and starts the step again before the next attempt.

Like the zygote, it ignores SIGTERM, SIGINT and SIGHUP (Slurm sends SIGTERM to every process of
a job it preempts, and the ranks must live on to save): it ends when the zygote ends, which
ends when its input closes, or with the step (SIGKILL). Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence

from .pdeathsig import die_with_parent
from .zygote_child import SHIELDED

__all__ = ["describe", "main"]


def describe(status: int) -> str:
    """How a process with the ``waitpid`` status ``status`` ended, in words."""
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def main(argv: Sequence[str]) -> int:
    """Run ``argv`` (the zygote) as a child until it ends; say how it ended."""
    if not argv:
        print("usage: python -m worker_sdk.spawn.zygote_watch ZYGOTE_ARGV...", file=sys.stderr)
        return 2
    for sig in SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - replaced by the zygote at once
        die_with_parent(parent=parent)
        try:
            os.execvp(argv[0], list(argv))  # noqa: S606 -- the zygote's command line, ours
        except OSError as exc:
            print(f"rvsup: cannot run the zygote {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    _, status = os.waitpid(pid, 0)  # retried by Python on EINTR
    fact: dict[str, str] = {"gone": describe(status)}
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        fact["node"] = node
    sys.stdout.write(json.dumps(fact) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
