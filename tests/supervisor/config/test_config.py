"""job.toml: durations, valid files and their defaults, rendering round-trip, loading."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.durations import format_duration, parse_duration
from supervisor.config.load import load_config, parse_config
from supervisor.config.model import (
    CheckpointSection,
    ConfigError,
    FrozenEnv,
    HealthSection,
    HeartbeatSection,
    JobConfig,
    JobSection,
    LaunchSection,
    RestartSection,
    SlurmSection,
)
from supervisor.config.render import render_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Parsing never touches the file system, so pure tests use a made-up location.
JOB_TOML = Path("/jobs/demo/job.toml")
MINIMAL = '[job]\nname = "toy"\ncommand = ["python", "train.py"]\n'
DESIGN_EXAMPLE = """
[job]
name = "gpt-small"                      # required; names the run directory
command = ["python", "train.py", "--config", "small.yaml"]   # what torchrun runs on every rank
workdir = "."                           # relative paths are relative to job.toml
run_dir = "runs/gpt-small"              # events.jsonl, rank logs, control socket, diagnostics
checkpoint_dir = "checkpoints/gpt-small"
env = { OMP_NUM_THREADS = "4" }

[launch]
nproc_per_node = "auto"                 # GPUs visible, else 1; or a number
nnodes = "auto"                         # from the Slurm allocation, else 1
torchrun_args = []

[checkpoint]
every_steps = 500
every = "30m"                           # whichever comes first
keep_last = 3

[heartbeat]
interval = "1s"
startup_timeout = "10m"                 # launch -> first finished step
hang_timeout = "auto"                   # or a duration; auto learns from observed step times

[restart]
max_restarts = 5                        # for the whole job, across allocations
backoff = "5s"                          # first delay, doubled each time, with jitter
backoff_max = "5m"
max_no_progress = 2                     # restarts in a row without a new checkpoint -> give up
on_oom = "restart"                      # or "fail"

[slurm]
requeue = "auto"                        # requeue the allocation on preemption / time limit
stop_before_end = "5m"                  # checkpoint and stop this long before the time limit
"""


def parse(text: str, path: Path = JOB_TOML) -> JobConfig:
    return parse_config(tomllib.loads(text), path)


def with_section(section: str, body: str) -> str:
    """The minimal job plus one more section (or more [job] keys)."""
    if section == "job":
        return MINIMAL + body + "\n"
    return f"{MINIMAL}\n[{section}]\n{body}\n"


def attribute(cfg: JobConfig, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), cfg)


# ------------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("2d", 172800.0),
        ("0", 0.0),
        ("45", 45.0),
        (" 1h 30m ", 5400.0),
        ("1d2h3m4s5ms", 93784.005),
        (12, 12.0),
        (0.25, 0.25),
        (0, 0.0),
        ("-0s", 0.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    """Numbers are seconds and unit strings add up their parts."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "expected a duration like 90s, 5m, 2h or a number of seconds, got 'abc'"),
        ("", "expected a duration like"),
        ("5x", "expected a duration like"),
        ("1e3", "expected a duration like"),
        ("5 m x", "expected a duration like"),
        ("--5s", "expected a duration like"),
        ("30m1h", "largest first"),
        ("5m5m", "largest first"),
        ("-5s", "must not be negative"),
        ("-1h30m", "must not be negative"),
        (-1, "must not be negative"),
        (-0.5, "must not be negative"),
        (True, "expected a duration like"),
        (None, "expected a duration like"),
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        (10**400, "too large"),
        ("9" * 400 + "d", "too large"),
    ],
)
def test_parse_duration_rejects(value: object, message: str) -> None:
    """Malformed, negative, boolean and non-finite durations raise ValueError saying why."""
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5400, "1h30m"),
        (90, "1m30s"),
        (0.5, "0.5s"),
        (0, "0s"),
        (60, "1m"),
        (300, "5m"),
        (86400 * 2 + 1.25, "2d1.25s"),
        (3600.5, "1h0.5s"),
        (1e-05, "0.00001s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    """Seconds are shown split into units, largest first, with no exponent notation."""
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "seconds", [0.1 + 0.2, 5400.3, 1234567.891, 1e-9, 2.0**52 + 1, 1e300, 7.0, 59.999999]
)
def test_format_duration_round_trips(seconds: float) -> None:
    """Whatever format_duration writes parses back to exactly the same float."""
    assert parse_duration(format_duration(seconds)) == seconds


# ------------------------------------------------------------------------------ valid files


def test_minimal_file_gets_every_default() -> None:
    """A file with only name and command resolves every other key to its documented default."""
    base = JOB_TOML.parent
    assert parse(MINIMAL) == JobConfig(
        path=JOB_TOML,
        job=JobSection(
            name="toy",
            command=("python", "train.py"),
            workdir=base,
            run_dir=base / "runs" / "toy",
            checkpoint_dir=base / "checkpoints" / "toy",
            env=FrozenEnv(),
        ),
        launch=LaunchSection(None, None, (), term_timeout_s=5.0, stop_timeout_s=60.0),
        checkpoint=CheckpointSection(every_steps=500, every_s=1800.0, keep_last=3),
        heartbeat=HeartbeatSection(1.0, 600.0, None, 1800.0, "auto"),
        restart=RestartSection(5, 5.0, 300.0, 2, "restart", "restart"),
        slurm=SlurmSection("auto", 300.0),
    )
    # the memory tier is on ("auto", None), in /dev/shm: not merely the dataclass's default
    assert (parse(MINIMAL).checkpoint.memory_every_steps, parse(MINIMAL).checkpoint.memory_dir) == (
        None,
        "/dev/shm",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            DESIGN_EXAMPLE,
            {
                "job.name": "gpt-small",
                "job.command": ("python", "train.py", "--config", "small.yaml"),
                "job.run_dir": JOB_TOML.parent / "runs/gpt-small",
                "job.env": {"OMP_NUM_THREADS": "4"},
                "checkpoint.every_s": 1800.0,
                "heartbeat.startup_timeout_s": 600.0,
                "restart.backoff_max_s": 300.0,
                "slurm.stop_before_end_s": 300.0,
            },
            id="design-example",
        ),
        pytest.param(
            MINIMAL.replace('["python", "train.py"]', "\"python 'my train.py' -v\""),
            {"job.command": ("python", "my train.py", "-v")},
            id="command-as-string",
        ),
        pytest.param(
            MINIMAL.replace("[job]", '[job]\nworkdir = "../work"\nrun_dir = "/var/runs/x"'),
            {
                "job.workdir": Path("/jobs/work"),
                "job.run_dir": Path("/var/runs/x"),
                "job.checkpoint_dir": Path("/jobs/work/checkpoints/toy"),
            },
            id="relative-paths",
        ),
        pytest.param(MINIMAL, {"health.exclude_stragglers": False}, id="health-default"),
        pytest.param(
            with_section("health", "exclude_stragglers = true"),
            {"health.exclude_stragglers": True, "health.stragglers_excluded": True},
            id="exclude-stragglers",
        ),
        pytest.param(  # exclusion off: stragglers' nodes too
            with_section("health", "exclude_stragglers = true\nexclude_after = 0"),
            {"health.exclude_stragglers": True, "health.stragglers_excluded": False},
            id="exclude-stragglers-exclusion-off",
        ),
        pytest.param(
            with_section("checkpoint", 'every = "off"'),
            {"checkpoint.every_s": None},
            id="every-off",
        ),
        pytest.param(
            with_section("checkpoint", "every = false"),
            {"checkpoint.every_s": None},
            id="every-false",
        ),
        pytest.param(
            with_section("checkpoint", "every = 0"), {"checkpoint.every_s": None}, id="every-0"
        ),
        pytest.param(
            with_section("checkpoint", 'every = "0s"\nevery_steps = 0'),
            {"checkpoint.every_s": None, "checkpoint.every_steps": 0},
            id="every-0s",
        ),
        pytest.param(
            with_section("checkpoint", "every = 90.5"),
            {"checkpoint.every_s": 90.5},
            id="every-float",
        ),
        pytest.param(
            with_section("heartbeat", 'hang_timeout = "1h"'),
            {"heartbeat.hang_timeout_s": 3600.0, "heartbeat.hang_timeout_max_s": 3600.0},
            id="hang-timeout-raises-the-default-max",
        ),
        pytest.param(
            with_section("heartbeat", 'hang_timeout_max = "2m"'),
            {"heartbeat.hang_timeout_s": None, "heartbeat.hang_timeout_max_s": 120.0},
            id="hang-timeout-max",
        ),
        pytest.param(
            with_section("heartbeat", 'hang_timeout_max = "1m"'),
            {"heartbeat.hang_timeout_max_s": 60.0, "heartbeat.hang_timeout_idle_s": 60.0},
            id="hang-timeout-max-lowers-the-default-idle",
        ),
        pytest.param(
            with_section("heartbeat", 'hang_timeout_idle = "10m"'),
            {"heartbeat.hang_timeout_idle_s": 600.0, "heartbeat.hang_timeout_max_s": 1800.0},
            id="hang-timeout-idle",
        ),
        pytest.param(
            with_section("slurm", "requeue = true"), {"slurm.requeue": "always"}, id="requeue-true"
        ),
        pytest.param(
            with_section("slurm", "requeue = false\nstop_before_end = 0"),
            {"slurm.requeue": "never", "slurm.stop_before_end_s": 0.0},
            id="requeue-false",
        ),
        pytest.param(
            with_section("launch", "nproc_per_node = 8\nnnodes = 2"),
            {"launch.nproc_per_node": 8, "launch.nnodes": 2},
            id="counts",
        ),
        pytest.param(
            with_section("launch", 'torchrun_args = ["--redirects", "3", "--log-dir=x"]'),
            {"launch.torchrun_args": ("--redirects", "3", "--log-dir=x")},
            id="torchrun-args",
        ),
        pytest.param(
            with_section("launch", 'torchrun = "auto"'),
            {"launch.torchrun": None},
            id="torchrun-auto",
        ),
        pytest.param(
            with_section("launch", 'torchrun = "/opt/venv/bin/torchrun"'),
            {"launch.torchrun": ("/opt/venv/bin/torchrun",)},
            id="torchrun-absolute",
        ),
        pytest.param(
            with_section("launch", 'torchrun = "../venv/bin/torchrun"'),
            {"launch.torchrun": ("/jobs/venv/bin/torchrun",)},
            id="torchrun-relative-to-job-toml",
        ),
        pytest.param(
            with_section("launch", 'torchrun = "torchrun"'),
            {"launch.torchrun": ("torchrun",)},
            id="torchrun-bare-name-left-for-path",
        ),
        pytest.param(
            with_section("launch", 'torchrun = ["venv/bin/python", "-m", "torch.distributed.run"]'),
            {"launch.torchrun": ("/jobs/demo/venv/bin/python", "-m", "torch.distributed.run")},
            id="torchrun-argv",
        ),
        pytest.param(
            with_section("launch", 'torchrun = "/opt/my torch/bin/torchrun"'),
            {"launch.torchrun": ("/opt/my torch/bin/torchrun",)},
            id="torchrun-path-not-split",
        ),
        pytest.param(
            with_section(
                "heartbeat",
                'hang_timeout = "2m"\ntransport = "ipc"\ninterval = 0.5\nnative_stacks = false',
            ),
            {
                "heartbeat.hang_timeout_s": 120.0,
                "heartbeat.transport": "ipc",
                "heartbeat.interval_s": 0.5,
                "heartbeat.native_stacks": False,
            },
            id="heartbeat",
        ),
        pytest.param(
            with_section(
                "restart",
                'backoff = 0\nbackoff_max = 0\non_oom = "fail"\n'
                'on_node_failure = "fail"\nmax_restarts = 0',
            ),
            {
                "restart.backoff_max_s": 0.0,
                "restart.on_oom": "fail",
                "restart.on_node_failure": "fail",
                "restart.max_restarts": 0,
            },
            id="restart",
        ),
    ],
)
def test_valid_files(text: str, expected: dict[str, object]) -> None:
    """Valid files resolve to the expected values (paths, durations, aliases)."""
    cfg = parse(text)
    for dotted, value in expected.items():
        assert attribute(cfg, dotted) == value, dotted


def test_home_is_expanded_in_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A leading ~ in a path means the user's home directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = parse(MINIMAL + 'checkpoint_dir = "~/ckpt"\n')
    assert cfg.job.checkpoint_dir == tmp_path / "ckpt"


def test_home_is_expanded_in_launch_torchrun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A leading ~ in launch.torchrun's program means the user's home; its arguments are kept."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = parse(with_section("launch", 'torchrun = ["~/venv/bin/python", "-m", "~x"]'))
    assert cfg.launch.torchrun == (str(tmp_path / "venv" / "bin" / "python"), "-m", "~x")


def test_config_is_frozen_and_hashable() -> None:
    """The resolved config cannot be changed, env included, and can key a dict."""
    cfg = parse(DESIGN_EXAMPLE)
    with pytest.raises(AttributeError):
        cfg.job.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.job.env["X"] = "1"  # type: ignore[index]
    assert {cfg: 1}[parse(DESIGN_EXAMPLE)] == 1


# ------------------------------------------------------------------------------ rendering

ROUND_TRIP = [
    MINIMAL,
    DESIGN_EXAMPLE,
    with_section(
        "job", 'env = { A = "quote\\" back\\\\slash \\u00e9 \\u007f tab\\t", B = "" }'
    ).replace("[job]", '[job]\nworkdir = "dir with \\"quotes\\""'),
    with_section("checkpoint", 'every = "off"\nevery_steps = 0')
    + '[heartbeat]\nhang_timeout = "1h30m0.25s"\ninterval = 0.1\n'
    + '[launch]\nnproc_per_node = 2\nnnodes = 3\nterm_timeout = "1.5s"\nwarm_standby = false\n'
    + 'torchrun_args = ["--log-dir=x y", "--redirects"]\n'
    + 'torchrun = ["venv/bin/python", "-m", "torch.distributed.run"]\n'
    + '[restart]\nbackoff = 0.3\nbackoff_max = "2d"\non_oom = "fail"\n'
    + "[slurm]\nrequeue = false\nstop_before_end = 0\n",
    with_section("launch", 'torchrun = "../bin/torchrun"'),
    with_section("anomaly", "spike_factor = 6.5\nwindow = 20\npatience = 2\nmax_rollbacks = 0"),
    with_section(
        "health",
        'command = "nhc -t 30"\ntimeout = "2m"\ncheckpoint_free = "20G"\nshm_free = 0\n'
        'memory_free = "1.5GiB"\ngpus = 8\nexclude_after = 0\nenabled = false',
    ),
    with_section("health", "exclude_stragglers = true"),
]


@pytest.mark.parametrize(
    "text",
    ROUND_TRIP,
    ids=[
        "minimal",
        "design",
        "strings",
        "non-default",
        "torchrun-path",
        "anomaly",
        "health",
        "health-stragglers",
    ],
)
def test_render_config_round_trips(text: str) -> None:
    """Rendered TOML parses back to an equal JobConfig."""
    cfg = parse(text)
    assert parse(render_config(cfg), cfg.path) == cfg


def test_render_config_shows_auto_and_durations() -> None:
    """Defaults are rendered as "auto" and as unit durations, every key present."""
    rendered = render_config(parse(MINIMAL))
    for line in [
        'nproc_per_node = "auto"',
        'hang_timeout = "auto"',
        'every = "30m"',
        'stop_timeout = "1m"',
        'term_timeout = "5s"',
        'torchrun = "auto"',
        'command = ["python", "train.py"]',
        'workdir = "/jobs/demo"',
        "env = {}",
        "keep_last = 3",
    ]:
        assert line in rendered.splitlines()


def test_health_section_defaults_and_sizes() -> None:
    """[health] defaults to checks on, 60 s, "auto" thresholds, 1 GiB memory, exclusion after
    2 failures; sizes take K/M/G/T suffixes in powers of 1024."""
    assert parse(MINIMAL).health == HealthSection(
        enabled=True,
        command=(),
        timeout_s=60.0,
        checkpoint_free=None,
        shm_free=None,
        memory_free=1 << 30,
        gpus=None,
        exclude_after=2,
    )
    cfg = parse(
        with_section("health", 'checkpoint_free = "1.5K"\nmemory_free = "2M"\nshm_free = "3GiB"')
    )
    assert (cfg.health.checkpoint_free, cfg.health.memory_free) == (1536, 2 << 20)
    assert cfg.health.shm_free == 3 << 30


# -------------------------------------------------------------------------------- loading


def test_load_config_resolves_paths_against_the_file(tmp_path: Path) -> None:
    """load_config reads the file; relative paths start at the file's folder."""
    (tmp_path / "job.toml").write_text(MINIMAL)
    cfg = load_config(tmp_path / "job.toml")
    assert cfg.path == tmp_path / "job.toml"
    assert cfg.job.run_dir == tmp_path / "runs" / "toy"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read: No such file or directory"),
        (b'[job]\nname = "x"\ncommand = [\n', "invalid TOML: "),
        (b"[job]\nname = \n", "(at line 2, column 8)"),
        (b'[job]\nname = "\xff"\n', "invalid TOML"),
    ],
    ids=["missing", "unterminated", "no-value", "not-utf8"],
)
def test_load_config_file_problems(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    """A missing file or bad TOML is a ConfigError with one line naming the file."""
    path = tmp_path / "job.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [line] = str(info.value).splitlines()
    assert line.startswith(f"{path}: ")
    assert fragment in line
