"""One adapter per compared tool, all with the same interface: launch, signal, observe, kill the tree.

Every trial runs in a fresh work directory; the workload writes its records there, the tool its logs.
Each launched tree carries a unique ``BENCH_RUN_MARK`` in its environment, so that cleanup also finds
processes that were re-parented (a rank orphaned by a killed launcher).
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import records

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "benchmarks" / "workload.py"
WORLD = 2
MARK = "BENCH_RUN_MARK"


@dataclass(frozen=True)
class Spec:
    """What one trial runs: the same for every tool."""

    steps: int
    ckpt_every: int
    fault: str = ""
    pg_timeout_s: float | None = None
    max_restarts: int = 3


def torchrun_path() -> str:
    here = Path(sys.executable).with_name("torchrun")
    return str(here) if here.exists() else "torchrun"


class Tool(abc.ABC):
    """A way of running the workload with restarts."""

    name: str = ""

    def unavailable(self) -> str | None:
        """Why this tool cannot run here, or None."""
        return None

    @abc.abstractmethod
    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment of a launch in ``workdir``."""

    @abc.abstractmethod
    def noticed(self, workdir: Path) -> list[float]:
        """Wall-clock times at which the tool noticed a failure (from its own logs)."""

    def launchers(self, root: psutil.Process) -> list[psutil.Process]:
        """The processes a preemption signal goes to."""
        return [root]

    def describe(self) -> str:
        return self.name

    def launch(self, spec: Spec, workdir: Path, env_extra: Mapping[str, str] | None = None) -> Run:
        """Start the tool in ``workdir`` (created) with its own process group."""
        workdir.mkdir(parents=True, exist_ok=True)
        argv, extra = self.command(spec, workdir)
        mark = uuid.uuid4().hex
        env = dict(os.environ)
        env.update(
            {
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                "BENCH_RECORD_DIR": str(workdir / "records"),
                "BENCH_CKPT_DIR": str(workdir / "plain-ckpt"),
                "BENCH_CKPT_EVERY": str(spec.ckpt_every),
                "BENCH_STEPS": str(spec.steps),
                "BENCH_FAULT": spec.fault,
                "BENCH_PG_TIMEOUT": "" if spec.pg_timeout_s is None else str(spec.pg_timeout_s),
                MARK: mark,
            }
        )
        env.update(extra)
        env.update(env_extra or {})
        log = open(workdir / "launcher.log", "ab")  # noqa: SIM115
        launch_t = time.time()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        return Run(self, spec, workdir, proc, launch_t, mark)


class Run:
    """A launched tool: its process tree and the records its ranks write."""

    def __init__(
        self,
        tool: Tool,
        spec: Spec,
        workdir: Path,
        proc: subprocess.Popen[bytes],
        launch_t: float,
        mark: str,
    ) -> None:
        self.tool = tool
        self.spec = spec
        self.workdir = workdir
        self.record_dir = workdir / "records"
        self.proc = proc
        self.launch_t = launch_t
        self.mark = mark

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_tree()

    def records(self) -> list[records.Record]:
        return records.load_records(self.record_dir)

    def wait(self, timeout_s: float) -> int | None:
        """The launcher's exit code, or None if it is still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_group_step(self, step: int, timeout_s: float) -> bool:
        """Wait until every rank finished ``step`` (or the launcher exited)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            done = records.group_step_before(self.records(), time.time(), WORLD)
            if done is not None and done >= step:
                return True
            time.sleep(0.02)
        return False

    def signal_launchers(self, sig: int) -> float:
        """Send ``sig`` to the tool's launcher process(es); returns the wall-clock time."""
        try:
            targets = self.tool.launchers(psutil.Process(self.proc.pid))
        except psutil.Error:
            targets = []
        t = time.time()
        for p in targets:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        return t

    def tree(self) -> list[psutil.Process]:
        """Every live process of this launch (descendants and re-parented ones)."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        for p in psutil.process_iter():
            if p.pid in found or p.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if p.environ().get(MARK) == self.mark:
                    found[p.pid] = p
        alive = []
        for p in found.values():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        return alive

    def wait_tree_gone(self, timeout_s: float) -> float | None:
        """Wall time when the launcher and every process of the tree were gone, or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not self.tree():
                return time.time()
            time.sleep(0.02)
        return None

    def kill_tree(self) -> None:
        """SIGKILL the whole tree (continued first, so stopped processes die too) and reap it."""
        procs = self.tree()
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# ---------------------------------------------------------------- the tools
@dataclass
class Rvsup(Tool):
    """``rvsup start job.toml``: the workload with the two SDK calls."""

    name: str = "rvsup"
    hang_timeout: str = "auto"
    on_oom: str = "restart"
    backoff: str | None = None  # None: the shipped [restart] defaults
    first_backoff: str | None = None
    script: Path = WORKLOAD  # what every rank runs
    nproc: int = WORLD
    zygote: bool = True  # False: every rank starts cold (interpreter, imports)
    native_stacks: bool = True  # False: a hang's diagnostics skip py-spy
    hang_timeout_max: str | None = None  # None: rvsup's default
    hang_timeout_idle: str | None = None  # None: rvsup's default
    memory_every_steps: int | str | None = "off"  # the memory tier's interval ("auto" or a
    # number of steps); "off" unless a figure is about the tier (rvsup's columns of the other
    # figures are storage-only, as before the tier's default became "auto"); None: the default

    def job_toml(self, spec: Spec) -> str:
        command = json.dumps([sys.executable, str(self.script)])
        return f"""[job]
name = "bench"
command = {command}
run_dir = "run"
checkpoint_dir = "ckpt"
env = {{ OMP_NUM_THREADS = "1" }}

[launch]
nproc_per_node = {self.nproc}
zygote = {json.dumps(self.zygote)}

[checkpoint]
every_steps = {spec.ckpt_every}
{self._memory_line()}
[heartbeat]
hang_timeout = {json.dumps(self.hang_timeout)}
native_stacks = {json.dumps(self.native_stacks)}
{self._hang_bound_lines()}
[restart]
max_restarts = {spec.max_restarts}
on_oom = {json.dumps(self.on_oom)}
{self._backoff_lines()}"""

    def _backoff_lines(self) -> str:
        """The backoff keys set (none: the shipped defaults)."""
        keys = (("backoff", self.backoff), ("first_backoff", self.first_backoff))
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys if v is not None)

    def _memory_line(self) -> str:
        if self.memory_every_steps is None:
            return ""
        return f"memory_every_steps = {json.dumps(self.memory_every_steps)}\n"

    def _hang_bound_lines(self) -> str:
        bounds = {
            "hang_timeout_max": self.hang_timeout_max,
            "hang_timeout_idle": self.hang_timeout_idle,
        }
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in bounds.items() if v is not None)

    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        job = workdir / "job.toml"
        job.write_text(self.job_toml(spec))
        return [sys.executable, "-m", "supervisor", "start", str(job)], {"BENCH_MODE": "rvsup"}

    def noticed(self, workdir: Path) -> list[float]:
        return records.rvsup_noticed(_lines(workdir / "run" / "events.jsonl"))

    def describe(self) -> str:
        return (
            f"{self.name}: hang_timeout={self.hang_timeout}, on_oom={self.on_oom}, "
            f"backoff={self.backoff or 'default'}, first_backoff={self.first_backoff or 'default'}, "
            f"zygote={self.zygote}"
            + (
                ""
                if self.memory_every_steps is None
                else f", memory_every_steps={self.memory_every_steps}"
            )
        )


@dataclass
class Torchrun(Tool):
    """``torchrun --max-restarts=K`` with the hand-written torch.save checkpoints."""

    name: str = "torchrun"
    share_store: bool = True  # False: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the workaround)

    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        argv = [
            torchrun_path(),
            "--standalone",
            f"--nproc-per-node={WORLD}",
            f"--max-restarts={spec.max_restarts}",
            str(WORKLOAD),
        ]
        env = {"BENCH_MODE": "plain"}
        if not self.share_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        return argv, env

    def noticed(self, workdir: Path) -> list[float]:
        log = workdir / "launcher.log"
        year = time.localtime(log.stat().st_mtime).tm_year if log.exists() else 1970
        return records.torch_log_noticed(_lines(log), year)

    def describe(self) -> str:
        env = "as shipped" if self.share_store else "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
        return f"{self.name}: --max-restarts=K, {env}"


@dataclass
class BashLoop(Tool):
    """``for i in $(seq K+1); do torchrun ... && break; done``."""

    name: str = "bash loop"

    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        script = (
            f"for i in $(seq {spec.max_restarts + 1}); do "
            f'"$BENCH_TORCHRUN" --standalone --nproc-per-node={WORLD} --max-restarts=0 '
            f'"$BENCH_WORKLOAD" && exit 0; '
            'echo "torchrun-exit $? $(date +%s.%N)"; done; exit 1'
        )
        env = {
            "BENCH_MODE": "plain",
            "BENCH_TORCHRUN": torchrun_path(),
            "BENCH_WORKLOAD": str(WORKLOAD),
        }
        return ["bash", "-c", script], env

    def noticed(self, workdir: Path) -> list[float]:
        return records.loop_noticed(_lines(workdir / "launcher.log"))

    def launchers(self, root: psutil.Process) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return [root, *root.children()]
        return [root]


@dataclass
class FtLauncher(Tool):
    """NVIDIA resiliency extension's ``ft_launcher``, ranks sending one heartbeat per step."""

    name: str = "ft_launcher"
    venv: str | None = None
    heartbeat_timeout_s: float | None = None  # None: the package's default

    def executable(self) -> Path | None:
        return None if self.venv is None else Path(self.venv) / "bin" / "ft_launcher"

    def unavailable(self) -> str | None:
        exe = self.executable()
        if exe is None:
            return "n/a (nvidia-resiliency-ext not installed; see README)"
        if not exe.exists():
            return f"n/a (no ft_launcher in {self.venv})"
        return None

    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        exe = self.executable()
        assert exe is not None
        argv = [
            str(exe),
            "--standalone",
            f"--nproc-per-node={WORLD}",
            f"--max-restarts={spec.max_restarts}",
            "--ft-initial-rank-heartbeat-timeout=300",
        ]
        if self.heartbeat_timeout_s is not None:
            argv.append(f"--ft-rank-heartbeat-timeout={self.heartbeat_timeout_s}")
        return [*argv, str(WORKLOAD)], {"BENCH_MODE": "nvrx"}

    def noticed(self, workdir: Path) -> list[float]:
        # its own lines, and (0.7.0) the elastic agent's glog lines it lets through
        log = workdir / "launcher.log"
        year = time.localtime(log.stat().st_mtime).tm_year if log.exists() else 1970
        lines = _lines(log)
        return sorted(records.ft_log_noticed(lines) + records.torch_log_noticed(lines, year))

    def describe(self) -> str:
        hb = "default" if self.heartbeat_timeout_s is None else f"{self.heartbeat_timeout_s:g}s"
        return f"{self.name}: --max-restarts=K, rank heartbeat timeout {hb}"


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
