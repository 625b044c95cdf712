"""The node's zygote, seen from the supervisor: start it, hand its name to the ranks, hear it.

The zygote (``worker_sdk/_zygote.py``) runs on the job's interpreter with the job's environment,
imports torch once, and forks every rank of every attempt on request (see that module). The
supervisor starts it at the job's first attempt, so that its imports overlap torchrun's own
start, and keeps it for the whole job: a restart then costs little more than the process
group's set-up and the checkpoint's load. The ranks' command line names it
(``worker_sdk._bootstrap --zygote NAME``); every rank is reported by its client when it ends
(``RVSUP_REPORT_EXIT``), since the zygote, not torchrun, is the rank's parent.

What it says on its standard output (``ready``, ``unsafe``, ``refused``) becomes ``cold_start``
events; a zygote that died is started again for the next attempt. Only the daemon's main
thread may start one (the parent-death signal is tied to the thread that forked).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import worker_sdk._zygote
from supervisor.record.schema import ColdStart
from worker_sdk import protocol as p

__all__ = ["DEFAULT_PRELOAD", "Zygote", "zygote_argv"]

#: What every rank imports, and what DDP imports when it is constructed.
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
#: Imported when the job's environment has it: the SDK (and ZeroMQ with it).
OPTIONAL_PRELOAD = ("worker_sdk",)
_LISTEN_WAIT_S = 5.0
_CMDLINE_ROOM = 4096

# Runs rvsup's own copy of worker_sdk/_zygote.py on the job's interpreter, by path, under a
# module name of its own: the job's environment need not have worker_sdk. sys.path loses ""
# (the cwd) as a script's would; the first line names the process for people and ps.
_ZYGOTE_CODE = (
    "# worker_sdk._zygote: rvsup's zygote, forks the ranks\n"
    "import importlib.util, sys\n"
    "if sys.path and not sys.path[0]:\n"
    "    del sys.path[0]\n"
    "spec = importlib.util.spec_from_file_location('_rvsup_zygote', sys.argv[1])\n"
    "zygote = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = zygote\n"
    "spec.loader.exec_module(zygote)\n"
    "sys.exit(zygote.main(sys.argv[2:]))\n"
)


def zygote_argv(
    python: str, name: str, preload: Sequence[str], *, path: str | None = None
) -> tuple[str, ...]:
    """The zygote's command line on the job's interpreter ``python``."""
    argv = [python, "-c", _ZYGOTE_CODE, str(Path(worker_sdk._zygote.__file__).resolve())]  # noqa: SLF001 -- our own module
    argv += ["--socket", name, "--preload", ",".join(preload)]
    argv += ["--optional", ",".join(OPTIONAL_PRELOAD)]
    if path:
        argv += ["--path", path]
    argv += ["--room", " " * _CMDLINE_ROOM]  # forked ranks write their command lines over it
    return tuple(argv)


class Zygote:
    """The zygote of this node for one ``rvsup start``."""

    def __init__(
        self,
        python: str,
        preload: Sequence[str],
        *,
        path: str | None = None,
        defaults: Sequence[str] = DEFAULT_PRELOAD,
    ) -> None:
        self.python = python
        self.preload = (*defaults, *(m for m in preload if m not in defaults))
        self.path = path
        self.name = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._said: list[dict[str, object]] = []
        self._gone_reported = False
        self.ready_s: float | None = None
        """Its imports' duration once it said it is ready to fork ranks."""

    def ensure(self, env: Mapping[str, str], cwd: Path, nproc: int) -> None:
        """Start it unless it runs; ``env`` is the attempt's (torchrun's import-time additions
        are made here, so that its ranks' environment matches the zygote's)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._reap()
        self.name = f"rvsup-zygote-{os.getpid()}-{secrets.token_hex(6)}"
        zenv = {k: v for k, v in env.items() if not k.startswith("RVSUP_")}
        if nproc > 1:  # as torchrun sets it for every rank when the user did not
            zenv.setdefault("OMP_NUM_THREADS", "1")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker_sdk._bootstrap",
                *zygote_argv(self.python, self.name, self.preload, path=self.path),
            ],
            env=zenv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._buffer = b""
        self._gone_reported = False
        self.ready_s = None
        self._wait_listening()

    def _wait_listening(self) -> None:
        """Until its socket listens (it binds before importing: ~0.1 s), so that the first
        ranks find it; not longer than :data:`_LISTEN_WAIT_S` nor past its death."""
        deadline = time.monotonic() + _LISTEN_WAIT_S
        needle = f" @{self.name}\n".encode()
        while time.monotonic() < deadline and self.alive():
            with contextlib.suppress(OSError), open("/proc/net/unix", "rb") as f:
                if needle in f.read():
                    return
            time.sleep(0.005)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rank_command(self, command: Sequence[str]) -> list[str]:
        """The bootstrap's arguments that run ``command`` forked from this zygote."""
        return ["--zygote", self.name, *command]

    def cold_starts(self) -> list[ColdStart]:
        """What it said since last asked, as events: ranks refused (and why), an unsafe import,
        its death."""
        out: list[ColdStart] = []
        for fact in self._read():
            if "refused" in fact:
                rank = fact.get("rank")
                ranks = (rank,) if isinstance(rank, int) else ()
                out.append(ColdStart(ranks=ranks, reason=str(fact["refused"])))
            elif "unsafe" in fact:
                out.append(ColdStart(ranks=(), reason=f"zygote unsafe: {fact['unsafe']}"))
            elif isinstance(fact.get("ready"), (int, float)):
                self.ready_s = float(fact["ready"])  # type: ignore[arg-type]
        if self._proc is not None and self._proc.poll() is not None and not self._gone_reported:
            self._gone_reported = True
            rc = self._proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            out.append(ColdStart(ranks=(), reason=f"the zygote {how}"))
        return out

    def _read(self) -> list[dict[str, object]]:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return []
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            while chunk := os.read(proc.stdout.fileno(), 65536):
                self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        facts = []
        for line in lines:
            with contextlib.suppress(ValueError):
                fact = json.loads(line)
                if isinstance(fact, dict):
                    facts.append(fact)
        return facts

    def close(self) -> None:
        """End it (its input closes; SIGKILL if it lingers) and reap it."""
        self._reap()

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def rank_env_for_zygote() -> dict[str, str]:
    """What the ranks' environment gets when they are forked: their clients report their ends."""
    return {p.ENV_REPORT_EXIT: "1"}
