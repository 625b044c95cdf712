"""Which torchrun a job runs and on which interpreter its warm standby waits: the job's, never
rvsup's own (supervisor.config.torchrun), as the launch plan and the standby use it.

The environments are stand-ins built under tmp_path: executables that are never run, except by
the torch check of torchrun_issue (shell scripts that answer like Python would).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from supervisor.config.load import load_config
from supervisor.config.model import ConfigIssue, JobConfig
from supervisor.config.torchrun import (
    Torchrun,
    is_python,
    resolve_torchrun,
    script_python,
    torchrun_issue,
)
from supervisor.process import launcher
from supervisor.process.launch_plan import LaunchPlan, build_plan
from supervisor.process.launcher import Standby, standby_argv
from tests.helpers.jobs import write_job_file

M = ("-m", "torch.distributed.run")


def console_script(python: str) -> str:
    """What pip writes for torchrun: a #! line naming the interpreter, torchrun's main."""
    return f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"


def put(root: Path, rel: str, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    """An executable file at root/rel."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("{root}", str(root)))
    path.chmod(0o755)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Stand-in environments:

    - ``torchenv``: python3 and python, with a pip torchrun script beside them;
    - ``bare``: python3 and python3.11 without torchrun (torch importable or not: not looked at);
    - ``sysbin``: a torchrun whose #! is ``/usr/bin/env python3``, and python3 beside it;
    - ``wrap``: a torchrun that is a shell wrapper (what it runs is unknown);
    - ``rvsup``: rvsup's own interpreter, a torchrun beside it;
    - ``work/venv``: a python with torchrun, relative to the workdir.
    """
    put(tmp_path, "torchenv/bin/python3")
    put(tmp_path, "torchenv/bin/python")
    put(tmp_path, "torchenv/bin/torchrun", console_script("{root}/torchenv/bin/python3"))
    put(tmp_path, "bare/bin/python3")
    put(tmp_path, "bare/bin/python3.11")
    put(tmp_path, "sysbin/python3")
    put(tmp_path, "sysbin/torchrun", console_script("/usr/bin/env python3"))
    put(tmp_path, "wrap/torchrun", '#!/bin/sh\nexec /opt/site/torchrun "$@"\n')
    put(tmp_path, "rvsup/bin/python")
    put(tmp_path, "rvsup/bin/torchrun", console_script("{root}/rvsup/bin/python"))
    put(tmp_path, "work/venv/bin/python")
    put(tmp_path, "work/venv/bin/torchrun", console_script("{root}/work/venv/bin/python"))
    put(tmp_path, "work/train.sh")
    return tmp_path


@dataclass(frozen=True)
class Case:
    """One job: its command, [job] env PATH, rvsup's PATH and launch.torchrun (dirs relative to
    the stand-in root; "{root}" is replaced), and the expected resolution (None: none found)."""

    command: list[str]
    argv: tuple[str, ...] | None
    python: str | None = None
    origin: str = ""
    job_path: list[str] | None = None
    rvsup_path: list[str] = field(default_factory=list)
    setting: object = None
    rvsup_python: str = "rvsup/bin/python"


CASES = {
    "python-beside-torchrun": Case(
        ["{root}/torchenv/bin/python3", "train.py"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python3",
        "beside job.command[0]",
    ),
    "python-without-torchrun-runs-the-module": Case(
        ["{root}/bare/bin/python3.11", "train.py"],
        ("{root}/bare/bin/python3.11", *M),
        "{root}/bare/bin/python3.11",
        "job.command[0] -m",
    ),
    "python-name-on-the-job-path-first": Case(
        ["python3", "train.py"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python3",
        "beside job.command[0]",
        job_path=["torchenv/bin"],
        rvsup_path=["bare/bin"],
    ),
    "python-name-on-rvsup-path": Case(
        ["python3"],
        ("{root}/bare/bin/python3", *M),
        "{root}/bare/bin/python3",
        "job.command[0] -m",
        rvsup_path=["bare/bin", "torchenv/bin"],
    ),
    "python-name-not-on-the-job-path-then-rvsup-path": Case(
        ["python"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python",
        "beside job.command[0]",
        job_path=["wrap"],
        rvsup_path=["torchenv/bin"],
    ),
    "python-relative-to-workdir": Case(
        ["venv/bin/python", "train.py"],
        ("{root}/work/venv/bin/torchrun",),
        "{root}/work/venv/bin/python",
        "beside job.command[0]",
    ),
    "python-not-found": Case(["python3.11", "train.py"], None, rvsup_path=["torchenv/bin"]),
    "script-torchrun-on-the-job-path": Case(
        ["./train.sh"],
        ("{root}/sysbin/torchrun",),
        "{root}/sysbin/python3",
        "on PATH",
        job_path=["sysbin"],
        rvsup_path=["torchenv/bin"],
    ),
    "script-torchrun-on-rvsup-path": Case(
        ["./train.sh"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python3",
        "on PATH",
        rvsup_path=["bare/bin", "torchenv/bin"],
    ),
    "script-torchrun-beside-rvsup": Case(
        ["bash", "train.sh"],
        ("{root}/rvsup/bin/torchrun",),
        "{root}/rvsup/bin/python",
        "beside rvsup's interpreter",
        rvsup_path=["bare/bin"],
    ),
    "script-no-torchrun": Case(
        ["./train.sh"], None, rvsup_path=["bare/bin"], rvsup_python="bare/bin/python3"
    ),
    "script-wrapper-torchrun-has-no-standby": Case(
        ["./train.sh"], ("{root}/wrap/torchrun",), None, "on PATH", rvsup_path=["wrap"]
    ),
    "setting-absolute-path": Case(
        ["./train.sh"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python3",
        "launch.torchrun",
        setting="{root}/torchenv/bin/torchrun",
    ),
    "setting-relative-to-job-toml": Case(
        ["./train.sh"],
        ("{root}/torchenv/bin/torchrun",),
        "{root}/torchenv/bin/python3",
        "launch.torchrun",
        setting="torchenv/bin/torchrun",
    ),
    "setting-name-on-path": Case(
        ["./train.sh"],
        ("{root}/sysbin/torchrun",),
        "{root}/sysbin/python3",
        "launch.torchrun",
        rvsup_path=["sysbin"],
        setting="torchrun",
    ),
    "setting-module-form": Case(
        ["./train.sh"],
        ("{root}/bare/bin/python3", *M),
        "{root}/bare/bin/python3",
        "launch.torchrun",
        setting=["bare/bin/python3", *M],
    ),
    "setting-other-command-line-has-no-standby": Case(
        ["./train.sh"],
        ("{root}/bare/bin/python3", "my_launcher.py", "--x"),
        None,
        "launch.torchrun",
        setting=["bare/bin/python3", "my_launcher.py", "--x"],
    ),
    "setting-wins-over-the-command": Case(
        ["{root}/torchenv/bin/python3", "train.py"],
        ("{root}/work/venv/bin/torchrun",),
        "{root}/work/venv/bin/python",
        "launch.torchrun",
        setting="work/venv/bin/torchrun",
    ),
    "setting-missing": Case(
        ["{root}/torchenv/bin/python3"], None, setting="torchenv/bin/no-torchrun"
    ),
}


def job(root: Path, command: list[str], env_path: str | None, setting: object) -> JobConfig:
    """A job.toml in root (workdir root/work) with this command, PATH and launch.torchrun."""
    path = write_job_file(
        root,
        command=command,
        run_dir=None,
        checkpoint_dir=None,
        env=None if env_path is None else {"PATH": env_path},
        job_keys='workdir = "work"',
        tables={} if setting is None else {"launch": f"torchrun = {json.dumps(setting)}"},
    )
    return load_config(path)


def expand(root: Path, value: object) -> object:
    """``value`` with "{root}" replaced, in a string or in every string of a list."""
    if isinstance(value, str):
        return value.replace("{root}", str(root))
    if isinstance(value, list | tuple):
        return [expand(root, item) for item in value]
    return value


def resolve(root: Path, case: Case) -> Torchrun | None:
    """Resolve ``case`` with the stand-ins under ``root``."""
    job_path = None if case.job_path is None else ":".join(str(root / d) for d in case.job_path)
    command = [word.replace("{root}", str(root)) for word in case.command]
    cfg = job(root, command, job_path, expand(root, case.setting))
    environ = {"PATH": ":".join(str(root / d) for d in case.rvsup_path)}
    return resolve_torchrun(cfg, environ=environ, rvsup_python=str(root / case.rvsup_python))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_resolution_rules(root: Path, case: Case) -> None:
    """Each rule picks the job's torchrun (setting > beside the command's Python > its -m form;
    a non-Python command: PATH, then beside rvsup), and the standby's interpreter with it."""
    got = resolve(root, case)
    if case.argv is None:
        assert got is None
        return
    assert got is not None
    assert list(got.argv) == expand(root, list(case.argv))
    assert got.python == expand(root, case.python)
    assert got.origin == case.origin


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("python", True),
        ("python3", True),
        ("python3.10", True),
        ("python3.13t", True),
        ("/opt/venv/bin/python3.11", True),
        ("pythonw", False),
        ("python2", False),
        ("ipython", False),
        ("python3-config", False),
        ("py", False),
        ("/usr/bin/env", False),
        ("train.py", False),
    ],
)
def test_is_python(name: str, expected: bool) -> None:
    """Only interpreter names (python, python3, python3.X) count as the job's Python."""
    assert is_python(name) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#!{root}/torchenv/bin/python3\nfrom torch.distributed.run import main\n", "torchenv"),
        ("#!/usr/bin/env python3\nfrom torch.distributed.run import main\n", "sysbin"),
        (
            (
                "#!/bin/sh\n'''exec' \"{root}/torchenv/bin/python3\" \"$0\" \"$@\"\n' '''\n"
                "from torch.distributed.run import main\n"
            ),
            "torchenv",
        ),
        ("#!{root}/torchenv/bin/python3\nprint('not torchrun')\n", None),
        ('#!/bin/bash\nexec torchrun.real "$@"  # torch.distributed.run\n', None),
        ("#!{root}/nowhere/python3\nfrom torch.distributed.run import main\n", None),
        ("from torch.distributed.run import main\n", None),
    ],
    ids=["pip", "env", "distlib-sh", "other-python-script", "shell", "gone", "no-shebang"],
)
def test_script_python(root: Path, text: str, expected: str | None) -> None:
    """A torchrun script's interpreter comes from its #! line (pip's, env's, distlib's /bin/sh
    launcher); anything that is not a Python torchrun script has none."""
    script = put(root, "x/torchrun", text)
    got = script_python(str(script), [str(root / "sysbin")])
    want = {"torchenv": root / "torchenv/bin/python3", "sysbin": root / "sysbin/python3"}
    assert got == (None if expected is None else str(want[expected]))


@pytest.mark.parametrize(
    ("command", "setting", "message"),
    [
        (["./train.sh"], None, "no torchrun on the PATH of [job] env or rvsup's"),
        (["python3.9"], None, "cannot derive it: job.command[0] 'python3.9' not found"),
        (["./train.sh"], "gone/torchrun", "{root}/gone/torchrun does not exist"),
        (["./train.sh"], "work/train.sh.txt", "{root}/work/train.sh.txt is not executable"),
        (["./train.sh"], "no-such-torchrun", "'no-such-torchrun' not found on PATH"),
    ],
    ids=["script", "python-missing", "setting-missing", "setting-not-executable", "setting-name"],
)
def test_issue_when_none_is_found(
    root: Path, command: list[str], setting: str | None, message: str
) -> None:
    """No torchrun: one issue keyed launch.torchrun saying why and how to set it."""
    (root / "work" / "train.sh.txt").write_text("")
    cfg = job(root, command, None, setting)
    issue = torchrun_issue(cfg, environ={"PATH": str(root / "bare/bin")}, rvsup_python="/nowhere")
    assert issue is not None and issue.key == "launch.torchrun"
    assert issue.message.startswith(message.replace("{root}", str(root))), issue.message


@pytest.mark.parametrize(
    ("exit_code", "stderr", "fails"),
    [(0, "", False), (1, "", True), (1, "Traceback: broken site\n", False), (7, "", False)],
    ids=["found", "not-found", "crashed-unknown", "other"],
)
def test_issue_when_the_interpreter_has_no_torch(
    root: Path, exit_code: int, stderr: str, fails: bool
) -> None:
    """The -m form asks the interpreter whether torch is importable: "no" (exit 1, silent) is an
    issue; a crash or anything else is not held against the start."""
    echo = f"echo {stderr.strip()!r} >&2\n" if stderr else ""
    put(root, "fake/bin/python3", f"#!/bin/sh\n{echo}exit {exit_code}\n")
    cfg = job(root, [str(root / "fake/bin/python3"), "train.py"], None, None)
    issue = torchrun_issue(cfg, environ={"PATH": "/nowhere"})
    if not fails:
        assert issue is None
        return
    assert issue == ConfigIssue(
        "launch.torchrun",
        f"{root}/fake/bin/python3 cannot import torch, and job.command[0] has no torchrun "
        "beside it; install torch in that environment or set launch.torchrun to the torchrun "
        "of the job's environment",
    )


def test_issue_with_a_real_interpreter(root: Path) -> None:
    """This very interpreter, as ``[python, "-m", "torch.distributed.run"]``: an issue exactly
    when it cannot import torch (the check runs it for real)."""
    cfg = job(root, ["./train.sh"], None, [sys.executable, *M])
    issue = torchrun_issue(cfg, environ={"PATH": "/nowhere"})
    if importlib.util.find_spec("torch") is not None:
        assert issue is None
    else:
        assert issue is not None and "cannot import torch" in issue.message


# ---------------------------------------------------------------- the launch plan and standby


def test_build_plan_starts_with_the_jobs_torchrun(root: Path) -> None:
    """The attempt's command line is the job's torchrun command line, then torchrun's flags, and
    every rank still starts through the bootstrap on rvsup's own interpreter."""
    cfg = job(root, ["./train.sh", "--lr", "1"], None, ["bare/bin/python3", *M])
    torchrun = resolve_torchrun(cfg, environ={"PATH": ""})
    assert torchrun is not None
    plan = build_plan(cfg, attempt=1, torchrun=torchrun, rank_env={}, base_env={})
    assert plan.argv[:3] == (str(root / "bare/bin/python3"), *M)
    assert plan.argv[3].startswith("--nproc-per-node=")
    tail = (
        "--no-python",
        sys.executable,
        "-m",
        "worker_sdk.spawn.bootstrap",
        "./train.sh",
        "--lr",
        "1",
    )
    assert plan.argv[-len(tail) :] == tail


def test_build_plan_accepts_the_old_single_path(root: Path) -> None:
    """A plain path (what find_torchrun returned) is still a torchrun command line of one."""
    cfg = job(root, ["./train.sh"], None, None)
    plan = build_plan(cfg, attempt=1, torchrun="/x/torchrun", rank_env={}, base_env={})
    assert plan.argv[0] == "/x/torchrun" and plan.argv[1].startswith("--nproc-per-node=")


def test_standby_runs_rvsups_standby_file_on_the_jobs_interpreter() -> None:
    """The warm standby's command line: the job's interpreter running rvsup's own
    worker_sdk/spawn/standby.py by path (the job's environment needs no worker_sdk of its own)."""
    argv = standby_argv("/job/venv/bin/python")
    assert argv[0] == "/job/venv/bin/python" and argv[1] == "-c"
    repo = Path(launcher.__file__).resolve().parents[2]
    assert Path(argv[3]) == repo / "worker_sdk" / "spawn" / "standby.py"
    assert "worker_sdk.spawn.standby" in " ".join(argv)  # what tools and people look for in ps
    assert "torchrun" not in " ".join(argv)  # ... and not mistaken for the attempt's torchrun


def test_standby_without_an_interpreter_starts_nothing(tmp_path: Path) -> None:
    """A torchrun whose interpreter is unknown (a wrapper) gets no warm standby: prepare() starts
    no process and spawn() is a fresh launch."""
    standby = Standby(Torchrun(("/opt/wrap/torchrun",), None, "launch.torchrun"))
    plan = LaunchPlan(("/opt/wrap/torchrun", "--x"), {}, tmp_path, tmp_path / "logs", 1, 1)
    standby.prepare(plan)
    assert standby._proc is None
    standby.close()
