"""The zygote: one process per node that imported torch once and forks every rank from there.

A cold rank spends seconds before its first step: the interpreter, ``import torch``, and
``torch._dynamo``, which DDP imports on construction. The supervisor starts this process once
per job on the job's interpreter and environment (``python -c ... zygote.py --socket NAME ...``).
It listens on an abstract Unix socket at once, imports, checks that nothing fork-unsafe
happened (:func:`_fork_unsafe`), freezes the heap for the garbage collector and then serves:
the rank's bootstrap (``worker_sdk.spawn.zygote_client``) hands it the rank's command line,
environment, working directory, limits and standard streams, and gets back a forked child that
becomes the rank exactly as a cold ``exec`` would have made it (:func:`_become`), then runs the
script or module in a fresh ``__main__``. Before the child may run, the zygote places it into its
client's cgroup (v2; the attempt's: ``worker_sdk.spawn.cgroup``'s rule, the one that starts a
process places it), so that the rank and all it starts belong to the attempt, not to the zygote,
and into its client's cgroup v1 memory group where that is not the zygote's (a node wrapper's,
where its agent counts the node's OOM kills); the child checks it is there before it becomes
the rank. A rank that cannot be placed there is refused (it starts cold, where its client is).

When a request cannot be served like a cold start (another interpreter, an option the fork
cannot honour, a different import-time environment) or the imports were not safe, the reply is
a refusal with the reason, and the client starts the rank cold. One JSON line per fact goes to
standard output for the supervisor (``listening``, ``ready``, ``unsafe``, ``refused``; with the
node's name under Slurm); the zygote ends when its standard input closes (the supervisor's end
of the pipe, or srun's on a multi-node job). It ignores SIGTERM, SIGINT and SIGHUP: Slurm's
preemption and time limit send SIGTERM to every process of the job, and the ranks, which die
with their zygote, must live on to save. Runs only on Linux.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PACKAGE = "_rvsup_spawn"


def _sibling(name: str) -> Any:
    """``worker_sdk/spawn/<name>.py`` loaded by path, as a module of this folder loaded as the
    package ``_rvsup_spawn`` (so that its relative imports resolve here): the job's environment
    need not have rvsup's worker_sdk (nor the same version of it)."""
    if _PACKAGE not in sys.modules:
        here = Path(__file__).parent
        spec = importlib.util.spec_from_file_location(
            _PACKAGE, here / "__init__.py", submodule_search_locations=[str(here)]
        )
        if spec is None or spec.loader is None:  # pragma: no cover - the files are side by side
            raise ImportError(f"{here}/__init__.py is missing")
        package = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{_PACKAGE}.{name}")


wire = _sibling("zygote_wire")
child = _sibling("zygote_child")
cgroups = _sibling("cgroup")
forked = _sibling("zygote_ranks")

_REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Served:
    """What every request is checked against."""

    unsafe: str | None  # why no rank may be forked, or None
    startup_env: dict[str, str]  # the zygote's environment before it imported anything
    added_env: dict[str, str]  # what the imports set (torch sets TORCHINDUCTOR_CACHE_DIR)
    cgroup: str | None = None  # the zygote's own cgroup v2 directory
    memory_cgroup: str | None = None  # the zygote's own cgroup v1 memory group directory


def main(argv: Sequence[str]) -> int:
    """Serve until standard input closes; in a forked child, run the rank's program."""
    name, preload, path = _parse(argv)
    for sig in child.SHIELDED:  # its end is its input's; its ranks must outlive a job's SIGTERM
        signal.signal(sig, signal.SIG_IGN)
    child.set_cmdline([sys.executable, "-m", "worker_sdk.spawn.zygote", "--socket", name])
    base_path = list(sys.path)
    startup_env = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    _say({"listening": name})
    t0 = time.monotonic()
    unsafe = _prepare(preload, path)
    added = {k: v for k, v in os.environ.items() if startup_env.get(k) != v}
    sys.path[:] = base_path
    seconds = round(time.monotonic() - t0, 3)
    _say({"unsafe": unsafe, "seconds": seconds} if unsafe else {"ready": seconds})
    gc.collect()
    gc.freeze()  # forked ranks share the imported heap instead of copying it on the first GC
    served = Served(
        unsafe, startup_env, added, cgroups.own_group_dir(), cgroups.own_memory_v1_dir()
    )
    job = _serve(listener, served)
    if job is None:
        return 0
    child.fork_writer(job, base_path)  # where the memory tier is on
    return int(child.run(job, base_path))


def _parse(argv: Sequence[str]) -> tuple[str, list[tuple[str, bool]], str | None]:
    """``--socket NAME [--preload M,...] [--optional M,...] [--path DIR]``: the modules to import
    (optional ones are skipped when absent) and a folder to import them from."""
    args = list(argv)
    name, preload, path = "", [], None
    while args:
        flag = args.pop(0)
        if flag == "--socket":
            name = args.pop(0)
        elif flag in ("--preload", "--optional"):
            preload += [(m, flag == "--optional") for m in args.pop(0).split(",") if m]
        elif flag == "--path":
            path = args.pop(0)
        elif flag == "--room":  # blank: room for the ranks' command lines (see set_cmdline)
            args.pop(0)
        else:
            raise SystemExit(f"zygote: unknown argument {flag}")
    if not name:
        raise SystemExit("zygote: --socket NAME is required")
    return name, preload, path


def _say(fact: dict[str, Any]) -> None:
    """One fact, one line (written at once: srun merges the nodes' lines), with the node."""
    node = os.environ.get("SLURMD_NODENAME")
    sys.stdout.write(json.dumps({**fact, "node": node} if node else fact) + "\n")
    sys.stdout.flush()


def _prepare(preload: Sequence[tuple[str, bool]], path: str | None) -> str | None:
    """Import everything; None when the process may fork ranks, else why not."""
    allowed = _threads_after_numpy()
    if path:
        sys.path.insert(0, path)
    for module, optional in preload:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if optional and exc.name == module:
                continue
            return f"import {module}: {exc}"
        except BaseException as exc:  # noqa: BLE001 -- a user module may raise anything
            return f"import {module}: {type(exc).__name__}: {exc}"
    return _fork_unsafe(allowed)


def _threads_after_numpy() -> int:
    """Threads once NumPy is imported: its OpenBLAS pool is fork-safe (it has atfork handlers)."""
    with contextlib.suppress(Exception):  # no NumPy, no pool
        importlib.import_module("numpy")
    return _thread_count()


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _fork_unsafe(allowed_threads: int) -> str | None:
    """Why forking now would give ranks a broken runtime, or None."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_initialized():
            return "CUDA was initialised while importing (a forked child cannot use it)"
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return "a process group was created while importing"
    threads = _thread_count()
    if threads > allowed_threads:
        names = sorted(
            Path(f"/proc/self/task/{t}/comm").read_text().strip()
            for t in os.listdir("/proc/self/task")
        )
        started = threads - allowed_threads
        return (
            f"{started} thread(s) started while importing (of {', '.join(names)}): a fork keeps one"
        )
    return None


def _serve(listener: socket.socket, served: Served) -> Any:
    """Answer requests until standard input closes (None); a forked child returns its job."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(0, selectors.EVENT_READ, "stdin")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    ranks: dict[int, Any] = {}  # pid -> forked.Rank
    while True:
        for key, _ in sel.select():
            if key.data == "stdin" and not os.read(0, 4096):
                return None
            if key.data == "wake":
                while _drain(wake_r):
                    pass
                forked.on_exits(ranks, sel)
            elif key.data == "accept":
                conn, _ = listener.accept()
                answer = _answer(conn, served)
                if isinstance(answer, child.Job):  # the child: leave every fd of the zygote behind
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sel.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    for sock in (listener, conn, *(other.conn for other in ranks.values())):
                        _let_go(sock)
                    return answer
                if answer is None:
                    conn.close()
                else:
                    ranks[answer] = forked.Rank(conn)
                    sel.register(conn, selectors.EVENT_READ, answer)
            elif isinstance(key.data, int):  # a client hung up (or spoke out of turn)
                forked.on_client(key.data, ranks, sel)


def _let_go(sock: socket.socket) -> None:
    """Close ``sock``'s descriptor and detach it from the object. A socket object that only had
    its number closed (``os.close(sock.fileno())``) still owns that number and closes it again
    when it is collected: in a forked rank, at the end of the script, when the number belongs to
    something else by then (the SDK's ZeroMQ signaler, whose poll then aborts the process)."""
    fd = sock.detach()
    if fd >= 0:
        os.close(fd)


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _answer(conn: socket.socket, served: Served) -> Any:
    """Read one request and fork its rank: the rank's pid, or its :class:`Job` in the child;
    None when refused or unreadable."""
    try:
        conn.settimeout(_REQUEST_TIMEOUT_S)
        client, uid = _peer(conn)
        if uid != os.getuid():
            return None
        request, fds = wire.recv(conn)
    except (OSError, wire.WireError):
        return None
    zygote = os.getpid()
    try:
        program = _check(request, fds, served)
        if isinstance(program, str):
            _say({"refused": program, "rank": _rank_of(request)})
            wire.send(conn, {"refused": program})
            return None
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            try:
                _wait_for_go(go_r)
                for key, where in (
                    ("place", cgroups.own_group_dir),
                    ("place_memory", cgroups.own_memory_v1_dir),
                ):
                    here = where()
                    if request.get(key) and here != request[key]:
                        raise RuntimeError(f"placed in {here}, not in {request[key]}")
                child.become(request, fds, zygote, served.added_env)
            except BaseException:  # noqa: BLE001 -- a child that cannot become the rank ends
                traceback.print_exc()
                os._exit(127)
            return child.Job(program, request["cwd"])
        os.close(go_r)
        unplaced = _place(pid, request.get("place")) or _place(pid, request.get("place_memory"))
        if unplaced is not None:
            os.close(go_w)  # it ends without running
            os.waitpid(pid, 0)
            _say({"refused": unplaced, "rank": _rank_of(request)})
            wire.send(conn, {"refused": unplaced})
            return None
        if _rank_of(request) is None:  # a launcher (the warm standby): the supervisor acts on it
            _say({"forked": pid, "client": client})
        _answer_then_go(conn, pid, go_w)
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return None
    else:
        return pid
    finally:
        for fd in fds:
            if fd > 2:
                os.close(fd)


def _place(pid: int, group: str | None) -> str | None:
    """Place the forked child ``pid`` into its client's group ``group`` (None: the zygote's own,
    where it is by birth); None when done, else why it was not."""
    if not group:
        return None
    try:
        cgroups.place(pid, group)
    except OSError as exc:
        return f"the rank cannot be placed in its client's cgroup {group}: {exc.strerror or exc}"
    return None


def _wait_for_go(go: int) -> None:
    """In the forked child: wait until the client has the rank's pid. Without it (the zygote
    died, or the client left, before the answer) the child ends here, before any of the rank's
    code runs, so that the client's cold start is the only run of the rank."""
    if not os.read(go, 1):
        os._exit(1)
    os.close(go)


def _answer_then_go(conn: socket.socket, pid: int, go: int) -> None:
    """Tell the client the rank's pid, then let the forked child run; when the client cannot
    be told, the child ends without running and is reaped here."""
    try:
        conn.settimeout(None)
        wire.send(conn, {"pid": pid})
        os.write(go, b"!")
    except OSError:
        os.close(go)
        os.waitpid(pid, 0)
        raise
    os.close(go)


def _rank_of(request: dict[str, Any]) -> int | None:
    try:
        return int(request["env"]["RANK"])
    except (KeyError, TypeError, ValueError):
        return None


def _peer(conn: socket.socket) -> tuple[int, int]:
    """The client's pid and uid."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)


def _check(request: dict[str, Any], fds: list[int], served: Served) -> Any:
    """The rank's program (a ``wire.Program``), or why it cannot start from this zygote as it
    would start cold."""
    if served.unsafe:
        return served.unsafe
    if len(fds) != 3:
        return "the client's standard streams did not arrive"
    env = request["env"]
    program = wire.parse_command(request["argv"], request["cwd"], env.get("PATH"), sys.executable)
    if isinstance(program, str):
        return program
    differ = wire.import_env_differences(env, served.startup_env)
    if differ:
        return "import-time environment differs: " + ", ".join(differ)
    place = cgroups.placement(request.get("cgroup"), served.cgroup)
    if place is False:
        return f"the rank cannot be placed in its client's cgroup ({request['cgroup']})"
    request["place"] = place
    memory = cgroups.placement(request.get("memory_cgroup"), served.memory_cgroup)
    if memory is False:
        return (
            f"the rank cannot be placed in its client's memory group ({request['memory_cgroup']})"
        )
    request["place_memory"] = memory
    import resource

    for name, (_soft, hard) in request["rlimits"].items():
        mine = resource.getrlimit(getattr(resource, name))[1]
        if mine != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > mine):
            return f"{name} of the rank is above the zygote's"
    return program


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
