"""job.toml: durations, validation (every issue with its key), rendering, loading, preflight."""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import (
    CHECKPOINT_MARKER,
    CheckpointSection,
    ConfigError,
    ConfigIssue,
    FrozenEnv,
    HeartbeatSection,
    JobConfig,
    JobSection,
    LaunchSection,
    RestartSection,
    SlurmSection,
    load_config,
    parse_config,
    preflight,
    render_config,
)
from supervisor.durations import format_duration, parse_duration

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
            with_section("heartbeat", 'hang_timeout = "2m"\ntransport = "ipc"\ninterval = 0.5'),
            {
                "heartbeat.hang_timeout_s": 120.0,
                "heartbeat.transport": "ipc",
                "heartbeat.interval_s": 0.5,
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


def test_config_is_frozen_and_hashable() -> None:
    """The resolved config cannot be changed, env included, and can key a dict."""
    cfg = parse(DESIGN_EXAMPLE)
    with pytest.raises(AttributeError):
        cfg.job.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.job.env["X"] = "1"  # type: ignore[index]
    assert {cfg: 1}[parse(DESIGN_EXAMPLE)] == 1


# ---------------------------------------------------------------------------- invalid files

VALID_LAUNCH_KEYS = "valid keys: nnodes, nproc_per_node, stop_timeout, term_timeout, torchrun_args"
NOT_A_DURATION = "expected a duration like 90s, 5m, 2h or a number of seconds"

INVALID: list[Any] = [
    # unknown names
    pytest.param(
        with_section("launch", "nproc_per_nod = 2"),
        [("launch.nproc_per_nod", "did you mean 'nproc_per_node'?")],
        id="key-suggestion",
    ),
    pytest.param(
        with_section("launch", "nprocs = 2"),
        [("launch.nprocs", f"unknown key; {VALID_LAUNCH_KEYS}")],
        id="unknown-key",
    ),
    pytest.param(
        with_section("trainer", "lr = 1"),
        [
            (
                "trainer",
                "unknown section; valid sections: checkpoint, heartbeat, job, "
                "launch, restart, slurm",
            )
        ],
        id="unknown-section",
    ),
    pytest.param(
        with_section("restarts", "max_restarts = 1"),
        [("restarts", "did you mean 'restart'?")],
        id="section-suggestion",
    ),
    pytest.param(
        "launch = 3\n" + MINIMAL,
        [("launch", "expected a table, got integer 3")],
        id="section-not-a-table",
    ),
    # required keys
    pytest.param('[job]\nname = "x"\n', [("job.command", "required")], id="missing-command"),
    pytest.param('[job]\ncommand = ["x"]\n', [("job.name", "required")], id="missing-name"),
    pytest.param(
        "[launch]\nnnodes = 1\n",
        [("job.name", "required"), ("job.command", "required")],
        id="missing-job",
    ),
    # wrong types, one per kind of field
    pytest.param(
        with_section("checkpoint", 'keep_last = "5"'),
        [("checkpoint.keep_last", "expected an integer, got string '5'")],
        id="int-string",
    ),
    pytest.param(
        with_section("checkpoint", "every_steps = 1.5"),
        [("checkpoint.every_steps", "expected an integer, got float 1.5")],
        id="int-float",
    ),
    pytest.param(
        with_section("restart", "max_restarts = true"),
        [("restart.max_restarts", "expected an integer, got boolean true")],
        id="int-bool",
    ),
    pytest.param(
        with_section("launch", 'nproc_per_node = "four"\nnnodes = false'),
        [
            ("launch.nproc_per_node", "expected \"auto\" or an integer, got string 'four'"),
            ("launch.nnodes", 'expected "auto" or an integer, got boolean false'),
        ],
        id="auto-int",
    ),
    pytest.param(
        with_section("restart", "backoff = [1]\nbackoff_max = true"),
        [
            ("restart.backoff", f"{NOT_A_DURATION}, got an array"),
            ("restart.backoff_max", f"{NOT_A_DURATION}, got boolean true"),
        ],
        id="duration-type",
    ),
    pytest.param(
        with_section("checkpoint", "every = true"),
        [("checkpoint.every", 'expected "off" or a duration like')],
        id="every-true",
    ),
    pytest.param(
        with_section("heartbeat", 'hang_timeout = "never"'),
        [
            (
                "heartbeat.hang_timeout",
                'expected "auto" or a duration like 90s, 5m, 2h or '
                "a number of seconds, got 'never'",
            )
        ],
        id="hang-word",
    ),
    pytest.param(
        with_section("restart", 'on_oom = "retry"\non_node_failure = 1'),
        [
            (
                "restart.on_oom",
                'expected one of "restart", "fail", got string \'retry\'; '
                "did you mean 'restart'?",
            ),
            ("restart.on_node_failure", "got integer 1"),
        ],
        id="choice",
    ),
    pytest.param(
        with_section("heartbeat", 'transport = "IPC"'),
        [("heartbeat.transport", "did you mean 'ipc'?")],
        id="choice-case",
    ),
    pytest.param(
        with_section("slurm", 'requeue = "sometimes"'),
        [("slurm.requeue", 'expected one of "auto", "always", "never"')],
        id="requeue",
    ),
    pytest.param(
        '[job]\nname = 3\ncommand = ["x"]\n',
        [("job.name", "expected a string, got integer 3")],
        id="name-type",
    ),
    pytest.param(
        with_section("job", 'workdir = 1\nrun_dir = ""'),
        [
            ("job.workdir", "expected a string (a path), got integer 1"),
            ("job.run_dir", "non-empty path"),
        ],
        id="path-type",
    ),
    pytest.param(
        '[job]\nname = "x"\ncommand = { a = 1 }\n',
        [("job.command", "expected an array of strings, got a table")],
        id="array-type",
    ),
    pytest.param(
        with_section("job", 'env = "A=1"'),
        [("job.env", "expected a table, got string 'A=1'")],
        id="table-type",
    ),
    # values out of range
    pytest.param(
        with_section("restart", 'backoff = "-5s"'),
        [("restart.backoff", "must not be negative")],
        id="negative-duration",
    ),
    pytest.param(
        with_section("slurm", "stop_before_end = -1"),
        [("slurm.stop_before_end", "must not be negative")],
        id="negative-number",
    ),
    pytest.param(
        with_section("heartbeat", 'interval = "fast"'),
        [("heartbeat.interval", f"{NOT_A_DURATION}, got 'fast'")],
        id="bad-duration",
    ),
    pytest.param(
        with_section("heartbeat", 'interval = "2m"\nstartup_timeout = 0'),
        [
            ("heartbeat.interval", "must be at most 1m, got 2m"),
            ("heartbeat.startup_timeout", "must be greater than 0"),
        ],
        id="duration-range",
    ),
    pytest.param(
        with_section("heartbeat", 'hang_timeout = "0s"'),
        [("heartbeat.hang_timeout", "must be greater than 0")],
        id="hang-zero",
    ),
    pytest.param(
        with_section("heartbeat", 'interval = "2s"\nhang_timeout = "1s"'),
        [("heartbeat.hang_timeout", "longer than heartbeat.interval (2s)")],
        id="hang-short",
    ),
    pytest.param(
        with_section("checkpoint", "keep_last = 0\nevery_steps = -1"),
        [
            ("checkpoint.keep_last", "must be at least 1, got 0"),
            ("checkpoint.every_steps", "must be at least 0, got -1"),
        ],
        id="int-range",
    ),
    pytest.param(
        with_section("launch", "nnodes = 0"),
        [("launch.nnodes", "must be at least 1, got 0")],
        id="nnodes-zero",
    ),
    pytest.param(
        with_section("restart", 'backoff = "10s"\nbackoff_max = "5s"'),
        [("restart.backoff_max", "must be at least restart.backoff (10s), got 5s")],
        id="backoff-max-below-backoff",
    ),
    pytest.param(
        with_section("restart", 'backoff = "-10s"\nbackoff_max = "5s"'),
        [("restart.backoff", "must not be negative")],
        id="no-cross-check-on-bad-value",
    ),
    # job specifics
    pytest.param(
        '[job]\nname = "x"\ncommand = []\n',
        [("job.command", "must not be empty")],
        id="empty-command",
    ),
    pytest.param(
        '[job]\nname = "x"\ncommand = "  "\n',
        [("job.command", "must not be empty")],
        id="blank-command-string",
    ),
    pytest.param(
        '[job]\nname = "x"\ncommand = ["", "a"]\n',
        [("job.command[0]", "must not be empty")],
        id="empty-program",
    ),
    pytest.param(
        '[job]\nname = "x"\ncommand = ["python", 3, "a", false]\n',
        [
            ("job.command[1]", "expected a string, got integer 3"),
            ("job.command[3]", "expected a string, got boolean false"),
        ],
        id="command-item",
    ),
    pytest.param(
        '[job]\nname = "x"\ncommand = "python \'train.py"\n',
        [("job.command", "cannot split")],
        id="command-unbalanced-quote",
    ),
    pytest.param(
        with_section("job", 'env = { OMP_NUM_THREADS = 4, "1X" = "a", RVSUP_JOB = "b" }'),
        [
            ("job.env.OMP_NUM_THREADS", "expected a string (in quotes), got integer 4"),
            ("job.env.1X", "not a valid variable name"),
            ("job.env.RVSUP_JOB", "set by rvsup"),
        ],
        id="env",
    ),
    pytest.param(
        '[job]\nname = "a b"\ncommand = ["x"]\n', [("job.name", "got 'a b'")], id="name-space"
    ),
    pytest.param(
        '[job]\nname = ".."\ncommand = ["x"]\n', [("job.name", "must be 1 to 64")], id="name-dots"
    ),
    pytest.param(
        f'[job]\nname = "{"n" * 65}"\ncommand = ["x"]\n',
        [("job.name", "must be 1 to 64")],
        id="name-long",
    ),
    pytest.param(
        with_section("job", 'run_dir = "a"\ncheckpoint_dir = "a"'),
        [("job.run_dir", "outside job.checkpoint_dir")],
        id="same-dirs",
    ),
    pytest.param(
        with_section("job", 'run_dir = "ck/run"\ncheckpoint_dir = "ck"'),
        [("job.run_dir", "outside job.checkpoint_dir")],
        id="run-dir-in-checkpoint-dir",
    ),
    pytest.param(
        with_section("launch", 'torchrun_args = "--redirects 3 --standalone"'),
        [
            (
                "launch.torchrun_args[2]",
                "'--standalone' is not allowed: rvsup sets up the rendezvous",
            )
        ],
        id="torchrun-args-string",
    ),
    # many at once
    pytest.param(
        '[job]\nname = "x"\ncommand = []\nbogus = 1\n[restart]\nbackoff = "-1s"\non_oom = 3\n'
        '[heartbeat]\ninterval = "1 sec"\n[extra]\n',
        [
            ("job.command", "must not be empty"),
            ("job.bogus", "unknown key"),
            ("restart.backoff", "must not be negative"),
            ("restart.on_oom", "expected one of"),
            ("heartbeat.interval", NOT_A_DURATION),
            ("extra", "unknown section"),
        ],
        id="several-at-once",
    ),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_invalid_files_report_every_issue(text: str, expected: list[tuple[str, str]]) -> None:
    """Exactly the expected keys are reported, each with a message containing the expected text."""
    with pytest.raises(ConfigError) as info:
        parse(text)
    got = [(issue.key, issue.message) for issue in info.value.issues]
    assert sorted(key for key, _ in got) == sorted(key for key, _ in expected)
    for key, fragment in expected:
        assert any(k == key and fragment in message for k, message in got), (key, got)


OWNED_FLAGS = [
    "--nnodes",
    "--nnodes=2",
    "--nproc-per-node=4",
    "--nproc_per_node",
    "--max-restarts=3",
    "--max_restarts",
    "--rdzv-backend=c10d",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--standalone",
    "--node-rank=0",
    "--node_rank",
    "--no-python",
    "--no_python",
    "--nproc",
    "--max-re",
]


@pytest.mark.parametrize("flag", OWNED_FLAGS)
def test_torchrun_args_owned_by_rvsup_are_rejected(flag: str) -> None:
    """A torchrun flag rvsup sets itself (or an abbreviation argparse would accept) says why."""
    text = with_section("launch", f'torchrun_args = ["--redirects", "3", "{flag}"]')
    with pytest.raises(ConfigError) as info:
        parse(text)
    [issue] = info.value.issues
    assert issue.key == "launch.torchrun_args[2]"
    assert issue.message.startswith(f"{flag!r} is not allowed: rvsup ")


def test_error_text_is_one_line_per_issue_with_path_and_key() -> None:
    """str(ConfigError) is '<path>: <key>: <message>' per issue, in the order found."""
    text = with_section("restart", 'backoff = "-1s"\nmax_restarts = -1')
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text), Path("job.toml"))
    assert str(info.value).splitlines() == [
        "job.toml: restart.max_restarts: must be at least 0, got -1",
        "job.toml: restart.backoff: must not be negative",
    ]
    assert info.value.path == Path("job.toml")


# ------------------------------------------------------------------------------ rendering

ROUND_TRIP = [
    MINIMAL,
    DESIGN_EXAMPLE,
    with_section(
        "job", 'env = { A = "quote\\" back\\\\slash \\u00e9 \\u007f tab\\t", B = "" }'
    ).replace("[job]", '[job]\nworkdir = "dir with \\"quotes\\""'),
    with_section("checkpoint", 'every = "off"\nevery_steps = 0')
    + '[heartbeat]\nhang_timeout = "1h30m0.25s"\ninterval = 0.1\n'
    + '[launch]\nnproc_per_node = 2\nnnodes = 3\nterm_timeout = "1.5s"\n'
    + 'torchrun_args = ["--log-dir=x y", "--redirects"]\n'
    + '[restart]\nbackoff = 0.3\nbackoff_max = "2d"\non_oom = "fail"\n'
    + "[slurm]\nrequeue = false\nstop_before_end = 0\n",
]


@pytest.mark.parametrize("text", ROUND_TRIP, ids=["minimal", "design", "strings", "non-default"])
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
        'command = ["python", "train.py"]',
        'workdir = "/jobs/demo"',
        "env = {}",
        "keep_last = 3",
    ]:
        assert line in rendered.splitlines()


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


# ------------------------------------------------------------------------------ preflight


def write_job(tmp_path: Path, body: str = "", command: str | None = None) -> JobConfig:
    """A job in tmp_path whose program is this Python (found by absolute path)."""
    program = command if command is not None else f"[{sys.executable!r}, 'train.py']"
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\nname = "toy"\ncommand = {program}\n{body}\n')
    return load_config(path)


def check(cfg: JobConfig) -> list[tuple[str, str]]:
    return [(i.key, i.message) for i in preflight(cfg, torchrun=sys.executable)]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_preflight_creates_private_dirs_and_marker(tmp_path: Path) -> None:
    """A fresh job passes: run and checkpoint dirs made 0700, the marker 0600, no probe left."""
    cfg = write_job(tmp_path)
    assert check(cfg) == []
    assert mode(cfg.job.run_dir) == mode(cfg.job.checkpoint_dir) == 0o700
    assert os.listdir(cfg.job.run_dir) == []
    assert os.listdir(cfg.job.checkpoint_dir) == [CHECKPOINT_MARKER]
    assert mode(cfg.job.checkpoint_dir / CHECKPOINT_MARKER) == 0o600
    assert check(cfg) == []  # a second start accepts the directory it marked


def test_preflight_marks_an_existing_empty_checkpoint_dir(tmp_path: Path) -> None:
    """An empty private checkpoint directory gets the marker; rvsup-only entries are accepted."""
    cfg = write_job(tmp_path, 'checkpoint_dir = "ck"')
    (tmp_path / "ck").mkdir(mode=0o700)
    assert check(cfg) == []
    assert (tmp_path / "ck" / CHECKPOINT_MARKER).is_file()
    (tmp_path / "ck" / CHECKPOINT_MARKER).unlink()
    (tmp_path / "ck" / "step-0000000100").mkdir()
    (tmp_path / "ck" / ".tmp-step-0000000200-host1").mkdir()
    assert check(cfg) == []
    assert not (tmp_path / "ck" / CHECKPOINT_MARKER).exists()  # only new/empty dirs get one


def test_preflight_missing_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torchrun on PATH the issue is keyed 'launch' and says how to fix it."""
    cfg = write_job(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert preflight(cfg) == [
        ConfigIssue("launch", "torchrun not found on PATH; install torch in this environment")
    ]


@pytest.mark.parametrize(
    ("command", "files", "found"),
    [
        ('["rvsup-test-no-such-program", "x"]', [], False),
        ('["./run.sh"]', [], False),
        ('["./run.sh"]', ["run.sh"], True),
        ('["train.py"]', ["train.py"], True),
        ('["sh", "-c", "true"]', [], True),
    ],
)
def test_preflight_finds_the_program(
    tmp_path: Path, command: str, files: list[str], found: bool
) -> None:
    """command[0] must be on PATH or a file relative to workdir, else job.command[0] is reported."""
    for name in files:
        (tmp_path / name).write_text("")
    issues = check(write_job(tmp_path, command=command))
    assert [key for key, _ in issues] == ([] if found else ["job.command[0]"])


def test_preflight_uses_path_from_job_env(tmp_path: Path) -> None:
    """A program found only on the PATH given in [job] env counts as found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mytool").write_text("#!/bin/sh\n")
    (bin_dir / "mytool").chmod(0o755)
    assert check(write_job(tmp_path, f"env = {{ PATH = {str(bin_dir)!r} }}", '["mytool"]')) == []
    assert check(write_job(tmp_path, "", '["mytool"]'))[0][0] == "job.command[0]"


def test_preflight_missing_workdir_creates_nothing(tmp_path: Path) -> None:
    """A missing workdir is reported and not created as a side effect of making run_dir."""
    issues = check(write_job(tmp_path, 'workdir = "nowhere"'))
    assert [key for key, _ in issues] == ["job.workdir"]
    assert "does not exist" in issues[0][1]
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("key", ["run_dir", "checkpoint_dir"])
def test_preflight_uncreatable_dir(tmp_path: Path, key: str) -> None:
    """A directory that cannot be created (under a regular file) is reported with its key."""
    (tmp_path / "plain-file").write_text("x")
    issues = check(write_job(tmp_path, f'{key} = "plain-file/sub"'))
    assert [k for k, _ in issues] == [f"job.{key}"]
    assert "cannot create it" in issues[0][1]


def test_preflight_dir_that_is_a_file(tmp_path: Path) -> None:
    """A run_dir that exists as a regular file is not a directory."""
    (tmp_path / "runfile").write_text("x")
    assert check(write_job(tmp_path, 'run_dir = "runfile"')) == [
        ("job.run_dir", f"{tmp_path / 'runfile'} is not a directory")
    ]


@pytest.mark.parametrize("key", ["run_dir", "checkpoint_dir"])
@pytest.mark.parametrize("perm", [0o777, 0o770, 0o702])
def test_preflight_group_writable_dir(tmp_path: Path, key: str, perm: int) -> None:
    """A directory writable by group or others is refused, left as it was, and gets no marker."""
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(perm)
    issues = check(write_job(tmp_path, f'{key} = "shared"'))
    assert issues == [(f"job.{key}", f"{target} is writable by other users; chmod go-w it")]
    assert mode(target) == perm
    assert os.listdir(target) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_preflight_dir_owned_by_someone_else(tmp_path: Path) -> None:
    """A checkpoint directory owned by another user is refused."""
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    os.chown(target, 54321, -1)
    [(key, message)] = check(write_job(tmp_path, 'checkpoint_dir = "theirs"'))
    assert key == "job.checkpoint_dir"
    assert "owned by uid 54321" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_preflight_read_only_dir(tmp_path: Path) -> None:
    """A run directory we cannot write to is refused."""
    target = tmp_path / "ro"
    target.mkdir(mode=0o500)
    try:
        [(key, message)] = check(write_job(tmp_path, 'run_dir = "ro"'))
    finally:
        target.chmod(0o700)
    assert key == "job.run_dir"
    assert "not writable" in message


@pytest.mark.parametrize(
    ("foreign", "shown"),
    [
        (["notes.txt", "model.bin"], "(model.bin, notes.txt)"),
        (["a", "b", "c", "d", "step-12", ".rvsup-x"], "(.rvsup-x, a, b and 3 more)"),
    ],
)
def test_preflight_foreign_checkpoint_files(tmp_path: Path, foreign: list[str], shown: str) -> None:
    """Entries rvsup did not write are named (at most 3) and nothing is deleted or added."""
    ckpt = tmp_path / "ck"
    ckpt.mkdir(mode=0o700)
    (ckpt / "step-0000000100").mkdir()
    for name in foreign:
        (ckpt / name).write_text(name)
    before = sorted(os.listdir(ckpt))
    issues = check(write_job(tmp_path, 'checkpoint_dir = "ck"'))
    assert issues == [
        (
            "job.checkpoint_dir",
            f"{ckpt} holds files rvsup did not write {shown}; "
            "use an empty directory or one rvsup created",
        )
    ]
    assert sorted(os.listdir(ckpt)) == before
    assert all((ckpt / name).read_text() == name for name in foreign)
