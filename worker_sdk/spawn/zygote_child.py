"""The zygote's forked child: become the rank a cold exec would have started, then run it.

Loaded by path by ``worker_sdk/spawn/zygote.py`` (standard library only; torch and NumPy are only
touched when the zygote imported them). :func:`become` applies what the client sent (session,
parent-death signal, standard streams, working directory, umask, resource limits, CPU affinity,
environment, the dispositions of the signals the zygote ignores, signal mask); :func:`run`
gives the interpreter's state a cold start would have (``sys.argv``, ``sys.path[0]``, fresh
``sys.std*``, RNGs seeded from the OS) and runs the script or module in a fresh ``__main__``,
reporting an uncaught exception as the interpreter does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from .pdeathsig import die_with_parent

__all__ = ["SHIELDED", "Job", "become", "run", "set_cmdline"]

#: Signals the zygote ignores; a forked rank gets them back as its client had them.
SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class Job:
    """What a forked child runs once it has become the rank."""

    program: Any  # wire.Program
    cwd: str


def become(request: dict[str, Any], fds: list[int], zygote: int, added_env: dict[str, str]) -> None:
    """Make this forked child what a cold exec of the request would be (once its imports had
    run: what they set in the environment stays, unless the request sets it)."""
    import resource

    os.setsid()
    die_with_parent(parent=zygote)
    for target, fd in enumerate(fds):
        os.dup2(fd, target, inheritable=True)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.sched_setaffinity(0, request["affinity"])
    set_cmdline(request["argv"])
    os.environ.clear()
    os.environ.update({**added_env, **request["env"]})
    ignored = set(request.get("ignored", ()))
    for sig in SHIELDED:
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if int(sig) in ignored else default)
    signal.pthread_sigmask(signal.SIG_SETMASK, [signal.Signals(s) for s in request["sigmask"]])


def set_cmdline(argv: list[str]) -> bool:
    """Show ``argv`` as this process's command line (``ps``, ``/proc/PID/cmdline``) as
    setproctitle(3) does: the words joined by spaces, written over the original argv area (the
    zygote's command line leaves room), whose last byte is made non-NUL so that the kernel shows
    the text up to its first NUL. False when the kernel does not let us write it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48, 49
        size = end - start
        title = " ".join(argv).encode(errors="replace")[: size - 2]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title.ljust(size - 1, b"\0") + b" ")
    except (OSError, ValueError, IndexError):
        return False
    return True


def run(job: Job, base_path: list[str]) -> int:
    """Run the rank's script or module in a fresh ``__main__``, as ``python`` would."""
    program = job.program
    _fresh_stdio(program.unbuffered or bool(os.environ.get("PYTHONUNBUFFERED")))
    _reseed()
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __builtins__=__builtins__)
    if program.is_module:
        sys.path[:] = [job.cwd, *base_path]
        code, spec = _module_code(program.target)
        sys.argv = [spec.origin or program.target, *program.args]
        namespace.update(
            __file__=spec.origin,
            __cached__=spec.cached,
            __package__=spec.parent,
            __loader__=spec.loader,
            __spec__=spec,
        )
    else:
        script = os.path.join(job.cwd, program.target)
        sys.path[:] = [os.path.dirname(os.path.realpath(script)), *base_path]
        sys.argv = [program.target, *program.args]
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)
        namespace.update(
            __file__=script,  # absolute, not normalised: what the interpreter sets
            __cached__=None,
            __package__=None,
            __loader__=None,
            __spec__=None,
        )
    try:
        exec(code, namespace)  # noqa: S102 -- the rank's program, as the interpreter runs it
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 -- reported as the interpreter would
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code is not code:  # from the program's frame on
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):
            _die_of_sigint()
        return 1
    return 0


def _module_code(name: str) -> tuple[Any, Any]:
    """The code and spec ``python -m name`` runs (a package's ``__main__``)."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(name + ".__main__")
    if spec is None or spec.loader is None:
        raise SystemExit(f"{sys.executable}: No module named {name}")
    code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
    if code is None:
        raise SystemExit(f"{sys.executable}: No code object available for {name}")
    return code, spec


def _fresh_stdio(unbuffered: bool) -> None:
    """New ``sys.std*`` over fds 0-2, buffered by the interpreter's own rules: stdout
    line-buffered on a terminal, stderr always; with ``-u`` or PYTHONUNBUFFERED both unbuffered."""
    import io

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        write = fd > 0
        if old is not None and write:
            with contextlib.suppress(OSError, ValueError):
                old.flush()
        raw = unbuffered and write
        binary = open(fd, "wb" if write else "rb", buffering=0 if raw else -1, closefd=False)  # noqa: SIM115
        text = io.TextIOWrapper(
            binary,
            encoding=old.encoding if old is not None else None,
            errors=old.errors if old is not None else None,
            line_buffering=write and not raw and (os.isatty(fd) or name == "stderr"),
            write_through=raw,
        )
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)


def _reseed() -> None:
    """Every RNG a cold start seeds from the OS gets fresh entropy (random did at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()


def _die_of_sigint() -> None:
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001 -- the interpreter runs them before it re-raises
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
