"""job.toml validation: every problem is reported with its dotted key and a helpful message."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.load import parse_config
from supervisor.config.model import ConfigError, JobConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Parsing never touches the file system, so these tests use a made-up location.
JOB_TOML = Path("/jobs/demo/job.toml")
MINIMAL = '[job]\nname = "toy"\ncommand = ["python", "train.py"]\n'


def parse(text: str, path: Path = JOB_TOML) -> JobConfig:
    return parse_config(tomllib.loads(text), path)


def with_section(section: str, body: str) -> str:
    """The minimal job plus one more section (or more [job] keys)."""
    if section == "job":
        return MINIMAL + body + "\n"
    return f"{MINIMAL}\n[{section}]\n{body}\n"


VALID_LAUNCH_KEYS = (
    "valid keys: min_nnodes, nnodes, nproc_per_node, preload, stop_timeout, term_timeout, torchrun, "
    "torchrun_args, warm_standby, zygote"
)
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
                (
                    "unknown section; valid sections: anomaly, checkpoint, health, heartbeat, "
                    "job, launch, metrics, restart, slurm"
                ),
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
    # the health section
    pytest.param(
        with_section(
            "health",
            'timeout = 0\nmemory_free = "lots"\nshm_free = -1\ncheckpoint_free = "5X"\n'
            'gpus = -1\nexclude_after = true\nenabled = "yes"\ncommand = ["", "-x"]',
        ),
        [
            ("health.timeout", "must be greater than 0"),
            ("health.memory_free", 'expected a size: bytes, or a string like "512M"'),
            ("health.shm_free", "must be at least 0, got -1"),
            ("health.checkpoint_free", 'expected "auto" or a size'),
            ("health.gpus", "must be at least 0, got -1"),
            ("health.exclude_after", "expected an integer, got boolean true"),
            ("health.enabled", "expected true or false"),
            ("health.command[0]", "must not be empty"),
        ],
        id="health-values",
    ),
    pytest.param(
        with_section("health", "command = 3\nexclude = 2"),
        [
            ("health.command", "expected an array of strings, got integer 3"),
            ("health.exclude", "did you mean 'exclude_after'?"),
        ],
        id="health-command-and-key",
    ),
    # the anomaly section
    pytest.param(
        with_section(
            "anomaly",
            "spike_factor = 0\nwindow = 2\npatience = 0\nskip_steps = 0\nmax_rollbacks = -1\n"
            "verify_every_steps = -5",
        ),
        [
            ("anomaly.spike_factor", "must be a finite number above 0, got 0"),
            ("anomaly.window", "must be at least 4, got 2"),
            ("anomaly.patience", "must be at least 1, got 0"),
            ("anomaly.skip_steps", "must be at least 1, got 0"),
            ("anomaly.max_rollbacks", "must be at least 0, got -1"),
            ("anomaly.verify_every_steps", "must be at least 0, got -5"),
        ],
        id="anomaly-ranges",
    ),
    pytest.param(
        with_section("anomaly", 'spike_factor = "high"\nspike = 3'),
        [
            ("anomaly.spike_factor", "expected a number, got string 'high'"),
            ("anomaly.spike", "unknown key; valid keys: max_rollbacks, patience, skip_steps"),
        ],
        id="anomaly-types",
    ),
    pytest.param(
        with_section("health", 'exclude_stragglers = "yes"\nexclude_straggler = true'),
        [
            ("health.exclude_stragglers", "expected true or false, got string 'yes'"),
            ("health.exclude_straggler", "did you mean 'exclude_stragglers'?"),
        ],
        id="health-stragglers-types",
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
                (
                    'expected "auto" or a duration like 90s, 5m, 2h or '
                    "a number of seconds, got 'never'"
                ),
            )
        ],
        id="hang-word",
    ),
    pytest.param(
        with_section("restart", 'on_oom = "retry"\non_node_failure = 1'),
        [
            (
                "restart.on_oom",
                (
                    'expected one of "restart", "fail", got string \'retry\'; '
                    "did you mean 'restart'?"
                ),
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
        with_section("launch", 'warm_standby = "yes"'),
        [("launch.warm_standby", "expected true or false, got string 'yes'")],
        id="boolean",
    ),
    pytest.param(
        with_section("launch", 'zygote = 1\npreload = ["model", "my-tokenizer", "a..b"]'),
        [
            ("launch.zygote", "expected true or false"),
            ("launch.preload[1]", "'my-tokenizer' is not a module name"),
            ("launch.preload[2]", "'a..b' is not a module name"),
        ],
        id="zygote-preload",
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
        with_section("restart", "max_no_progress = 0"),
        [("restart.max_no_progress", "must be at least 1, got 0")],
        id="max-no-progress-zero-is-not-off",
    ),
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
        with_section("heartbeat", 'hang_timeout_max = "never"'),
        [("heartbeat.hang_timeout_max", f"{NOT_A_DURATION}, got 'never'")],
        id="hang-max-not-a-duration",
    ),
    pytest.param(
        with_section("heartbeat", 'hang_timeout_max = "0s"'),
        [("heartbeat.hang_timeout_max", "must be greater than 0")],
        id="hang-max-zero",
    ),
    pytest.param(
        with_section("heartbeat", 'interval = "2s"\nhang_timeout_max = "2s"'),
        [("heartbeat.hang_timeout_max", "longer than heartbeat.interval (2s)")],
        id="hang-max-short",
    ),
    pytest.param(
        with_section("heartbeat", 'interval = "2s"\nhang_timeout_idle = "1s"'),
        [("heartbeat.hang_timeout_idle", "longer than heartbeat.interval (2s)")],
        id="hang-idle-short",
    ),
    pytest.param(
        with_section("heartbeat", 'hang_timeout_max = "5m"\nhang_timeout_idle = "10m"'),
        [
            (
                "heartbeat.hang_timeout_idle",
                "must be at most heartbeat.hang_timeout_max (5m), got 10m",
            )
        ],
        id="hang-idle-above-max",
    ),
    pytest.param(
        with_section("heartbeat", 'hang_timeout = "10m"\nhang_timeout_max = "5m"'),
        [("heartbeat.hang_timeout_max", "must be at least heartbeat.hang_timeout (10m), got 5m")],
        id="hang-max-below-hang-timeout",
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
    # launch.torchrun
    pytest.param(
        with_section("launch", "torchrun = 5"),
        [
            (
                "launch.torchrun",
                (
                    'expected "auto", a path to torchrun or an array of strings (its command line), '
                    "got integer 5"
                ),
            )
        ],
        id="torchrun-int",
    ),
    pytest.param(
        with_section("launch", "torchrun = false"),
        [("launch.torchrun", "got boolean false")],
        id="torchrun-bool",
    ),
    pytest.param(
        with_section("launch", "torchrun = { path = '/x' }"),
        [("launch.torchrun", "got a table")],
        id="torchrun-table",
    ),
    pytest.param(
        with_section("launch", 'torchrun = ""'),
        [("launch.torchrun", "must be a non-empty path")],
        id="torchrun-empty-string",
    ),
    pytest.param(
        with_section("launch", "torchrun = []"),
        [("launch.torchrun", "must not be empty")],
        id="torchrun-empty-array",
    ),
    pytest.param(
        with_section("launch", 'torchrun = ["/venv/bin/python", 3]'),
        [("launch.torchrun[1]", "expected a string, got integer 3")],
        id="torchrun-array-item",
    ),
    pytest.param(
        with_section("launch", 'torchrun = ["", "-m", "torch.distributed.run"]'),
        [("launch.torchrun[0]", "must not be empty")],
        id="torchrun-empty-program",
    ),
    pytest.param(
        with_section("launch", 'torch_run = "/venv/bin/torchrun"'),
        [("launch.torch_run", "did you mean 'torchrun'?")],
        id="torchrun-suggestion",
    ),
    pytest.param(
        with_section("launch", 'torchrun_arg = ["--redirects=3"]'),
        [("launch.torchrun_arg", "did you mean 'torchrun_args'?")],
        id="torchrun-args-suggestion",
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
    "--master-port=29500",
    "--master_addr",
    "--master",
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
