"""What torchrun starts on every rank under rvsup: arm the parent-death signal, then exec the command.

``python -m worker_sdk.spawn.bootstrap CMD [ARGS...]`` asks the kernel to SIGKILL this process when its
parent (torchrun) dies, then replaces itself with ``CMD``. The setting survives ``execve``, so the
training process dies with torchrun, which itself dies with the supervisor (set by the supervisor
the same way): killing the supervisor with SIGKILL leaves no orphaned rank behind, even one stopped
with SIGSTOP or stuck before it imported the SDK. Imports nothing heavy: it costs a few milliseconds.

On multi-node attempts (``RVSUP_REPORT_EXIT=1``) it forks instead of exec'ing and stays behind
as the rank's parent, to tell the supervisor how the rank ended (see :mod:`.exit_report`).

``python -m worker_sdk.spawn.bootstrap --cgroup DIR FD ...``: before anything else, this process
waits until the supervisor, which started it, has placed it into the cgroup v2 directory ``DIR``
(the attempt's, or the zygote's) and closed its end of the pipe whose read end is ``FD``, so that
everything it starts, whatever it does later, is a member of that group; it moves nothing itself
(:mod:`.cgroup`), and exits 126 when it is not there.

``python -m worker_sdk.spawn.bootstrap --zygote NAME CMD [ARGS...]``: the rank is forked from the
node's zygote ``NAME``, which imported torch already, and this process stands in for it (see
:mod:`.zygote_client`); when the zygote cannot serve ``CMD`` as a cold start would run it, the rank
starts cold as above, with a line on stderr saying why.
"""

from __future__ import annotations

import os
import sys

from .pdeathsig import die_with_parent


def main(argv: list[str]) -> int:
    """Entry point: exec ``argv`` with the parent-death signal armed."""
    if argv[:1] == ["--cgroup"] and len(argv) > 3:
        from .cgroup import wait_placed

        wrong = wait_placed(int(argv[2]), argv[1])
        if wrong is not None:
            print(f"rvsup: cannot run the attempt: {wrong}", file=sys.stderr)
            return 126
        argv = argv[3:]
    zygote = None
    if argv[:1] == ["--zygote"] and len(argv) > 2:
        zygote, argv = argv[1], argv[2:]
    if not argv:
        usage = "usage: python -m worker_sdk.spawn.bootstrap [--cgroup DIR FD] [--zygote NAME] CMD [ARGS...]"
        print(usage, file=sys.stderr)
        return 2
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 1
    from .exit_report import ReportTo, run_and_report  # multi-node or zygote only

    report_to = ReportTo.from_env(os.environ)
    if zygote:  # forked from the zygote; returns only when the rank must start cold
        from .zygote_client import run as run_forked

        why = run_forked(argv, zygote, report_to)
        print(f"rvsup: rank starts cold: {why}", file=sys.stderr, flush=True)
    if report_to is not None:
        run_and_report(argv, report_to, die_with_parent)
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - the command is the user's job
    except OSError as exc:
        print(f"rvsup: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
