"""The zygote's forked child: become the rank a cold exec would have started, then run it.

Loaded by path by ``worker_sdk/spawn/zygote.py`` (standard library only; torch and NumPy are only
touched when the zygote imported them). :func:`become` applies what the client sent (session,
parent-death signal, standard streams, working directory, umask, resource limits, CPU affinity,
environment, the dispositions of the signals the zygote ignores, signal mask); :func:`run`
gives the interpreter's state a cold start would have (``sys.argv``, ``sys.path[0]``, fresh
``sys.std*``, RNGs seeded from the OS) and runs the script or module in a fresh ``__main__``,
reporting an uncaught exception as the interpreter does. Where the memory tier is on,
:func:`fork_writer` first forks the rank's snapshot writer beside it, torch already imported.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from .pdeathsig import die_with_parent

__all__ = ["FORKED_WRITER", "SHIELDED", "Job", "become", "fork_writer", "run", "set_cmdline"]

#: Signals the zygote ignores; a forked rank gets them back as its client had them.
SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Set in a rank whose snapshot writer was forked beside it: "FD PID", the rank's end of the
#: writer's socket and the writer's pid (worker_sdk.contract.protocol.ENV_FORKED_WRITER).
FORKED_WRITER = "RVSUP_FORKED_WRITER"
_MEMORY_DIR = "RVSUP_MEMORY_DIR"  # worker_sdk.contract.protocol.ENV_MEMORY_DIR
_WRITER = "worker_sdk.checkpoint.background.writer"


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


def fork_writer(job: Job, base_path: list[str]) -> int | None:
    """Where the supervisor asked for the memory tier (``RVSUP_MEMORY_DIR``) and every rank runs
    on this node, fork the rank's snapshot writer now, before any of the rank's code runs (no
    thread, no device touched yet): it starts with torch imported, in milliseconds, where a
    writer the rank starts itself runs a new interpreter and imports torch (seconds, during
    which no snapshot can complete). The writer is the rank's child, dies with it (the
    parent-death signal) and imports the writer module from the path the rank's program will
    import from; the rank finds it in ``RVSUP_FORKED_WRITER`` (its end of the socket, and the
    writer's pid), and starts one of its own when it is not there or has died. The writer's
    pid, or None."""
    env = os.environ
    if not env.get(_MEMORY_DIR):
        return None
    try:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    rank = os.getpid()
    pid = os.fork()
    if pid == 0:  # the writer: never returns into the rank's code
        code = 1
        try:
            mine.close()
            set_cmdline([sys.executable, "-m", _WRITER, "(forked beside its rank)"])
            sys.path[:] = _program_path(job, base_path)
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)  # what a writer the rank starts gets (OMP_NUM_THREADS)
            writer = importlib.import_module(_WRITER)
            code = int(writer.main([str(theirs.detach()), str(rank)]))
        except BaseException as exc:  # noqa: BLE001 -- the rank starts a writer of its own
            print(f"rvsup: the forked snapshot writer ended: {exc!r}", file=sys.stderr)
        finally:
            os._exit(code)
    theirs.close()
    env[FORKED_WRITER] = f"{mine.detach()} {pid}"
    return pid


def _program_path(job: Job, base_path: list[str]) -> list[str]:
    """``sys.path`` as the rank's program starts with it: its folder (a module: the working
    directory) first."""
    if job.program.is_module:
        return [job.cwd, *base_path]
    script = os.path.join(job.cwd, job.program.target)
    return [os.path.dirname(os.path.realpath(script)), *base_path]


def run(job: Job, base_path: list[str]) -> int:
    """Run the rank's script or module in a fresh ``__main__``, as ``python`` would."""
    program = job.program
    _fresh_stdio(program.unbuffered or bool(os.environ.get("PYTHONUNBUFFERED")))
    _reseed()
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __builtins__=__builtins__)
    sys.path[:] = _program_path(job, base_path)
    if program.is_module:
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
