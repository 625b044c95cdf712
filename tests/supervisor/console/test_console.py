"""The command line as people use it: pipes closed early, --version, a rank's logs (followed
across a restart), the live status on a terminal and in a pipe, shell completion."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyte
import pytest

from tests.helpers.fixtures import built_once
from tests.helpers.harness import (
    REPO,
    events,
    named,
    running,
    rvsup,
    rvsup_env,
    status,
    wait_for,
    write_job,
)

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

SIGPIPE_EXIT = 128 + signal.SIGPIPE
SINGLE = REPO / "examples" / "single_process"


def rvsup_into_closed_pipe(*args: str, both: bool = False) -> subprocess.CompletedProcess[str]:
    """Run an rvsup command whose stdout (``both``: and stderr) is a pipe that nobody reads any
    more (``| head``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "supervisor", *args],
            env=rvsup_env(),
            stdout=write_end,
            stderr=write_end if both else subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank job whose rank 1 killed itself at step 12 of attempt 1; attempt 2 finished (one
    for the whole run, read only: see built_once)."""

    def build(tmp: Path) -> Path:
        job = write_job(tmp, total=30, env={"FAULT": "kill:1:12:1"})
        res = rvsup("start", str(job), timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        return job

    return built_once(tmp_path_factory, "finished-job", build)


@pytest.mark.parametrize(
    "command",
    [["history"], ["history", "--json"], ["validate"], ["logs"], ["status"]],
    ids=" ".join,
)
def test_a_closed_pipe_ends_quietly(finished_job: Path, command: list[str]) -> None:
    """Writing into a pipe whose reader left ends the command without a traceback, with the exit
    status of a command killed by SIGPIPE (128 + 13); status of a finished job says so first
    and exits 1 as it always does."""
    res = rvsup_into_closed_pipe(command[0], str(finished_job), *command[1:])
    assert "Traceback" not in res.stderr and "Error" not in res.stderr, res.stderr
    assert res.returncode == SIGPIPE_EXIT, (res.returncode, res.stderr)


def test_version_names_rvsup_python_and_torch() -> None:
    """``rvsup --version`` and ``rvsup version`` print rvsup's version, Python's and torch's
    (from package metadata), exit 0, and ``--version`` into a closed pipe ends quietly."""
    import torch

    for argv in (["--version"], ["version"]):
        res = rvsup(*argv)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert lines[0].startswith("rvsup 0."), lines
        assert lines[1].startswith(f"Python {sys.version.split()[0]} "), lines
        assert lines[2] == f"torch {torch.__version__} (beside rvsup)", lines
    piped = rvsup_into_closed_pipe("--version")
    assert piped.returncode == SIGPIPE_EXIT and not piped.stderr


def test_logs_of_a_finished_two_attempt_job(finished_job: Path) -> None:
    """``rvsup logs``: the latest attempt, every rank prefixed; ``--attempt 1`` has the killed
    rank's last lines; ``--rank`` shows one rank unprefixed; a rank or attempt that does not
    exist is a usage error that says what does."""
    latest = rvsup("logs", str(finished_job))
    assert latest.returncode == 0, latest.stderr
    assert "[rank 0] rank 0 attempt 2 resumes at 10 after crash" in latest.stdout, latest.stdout
    assert "[rank 1] rank 1 attempt 2 resumes at 10 after crash" in latest.stdout, latest.stdout
    first = rvsup("logs", str(finished_job), "--attempt", "1", "--rank", "1")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0] == "rank 1 attempt 1 resumes at 0 after - ooms 0"
    no_rank = rvsup("logs", str(finished_job), "--rank", "7")
    assert no_rank.returncode == 2
    assert no_rank.stderr.strip() == "rvsup: attempt 2 has no rank 7 (ranks 0-1)"
    no_attempt = rvsup("logs", str(finished_job), "--attempt", "5")
    assert no_attempt.returncode == 2
    assert "no logs of attempt 5" in no_attempt.stderr and "(attempts 1-2)" in no_attempt.stderr


def test_logs_follow_moves_on_to_the_next_attempt_and_ends_with_the_job(tmp_path: Path) -> None:
    """``rvsup logs -f`` started with the job prints attempt 1's lines as they come, then
    attempt 2's after the crash, and exits 0 once the daemon has ended and all is shown."""
    job = write_job(tmp_path, total=40, env={"FAULT": "kill:1:15:1", "STEP_SLEEP": "0.1"})
    with running(job) as proc:
        wait_for((tmp_path / "run" / "logs").is_dir, timeout=60, what="logs")
        follower = subprocess.run(
            [sys.executable, "-m", "supervisor", "logs", "-f", str(job)],
            env=rvsup_env(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert follower.returncode == 0, follower.stderr
    out = follower.stdout
    assert "[rank 1] rank 1 attempt 1 resumes at 0" in out, out
    assert "==> attempt 2 <==" in out, out
    after = out.split("==> attempt 2 <==", 1)[1]
    assert "[rank 0] rank 0 attempt 2 resumes at 10 after crash" in after, out
    assert len(named(events(tmp_path / "run"), "attempt_started")) == 2


def single_job(tmp: Path, steps: int) -> Path:
    text = (SINGLE / "job.toml").read_text()
    text = text.replace(
        'command = ["python", "train.py", "--steps", "200", "--kill-at-step", "120"]',
        f'command = ["{sys.executable}", "{SINGLE / "train.py"}", "--steps", "{steps}", '
        '"--step-sleep", "0.05"]',
    )
    job = tmp / "job.toml"
    job.write_text(text)
    return job


def screens_of_watch(job: Path, seconds: float) -> list[str]:
    """What ``rvsup status --watch 0.5`` shows on an 100x30 terminal, read every 0.5 s for
    ``seconds`` through a pseudo-terminal and a terminal emulator."""
    main_fd, sub_fd = os.openpty()
    env = {**rvsup_env(), "TERM": "xterm", "LINES": "30", "COLUMNS": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "status", "--watch", "0.5", str(job)],
        env=env,
        stdin=sub_fd,
        stdout=sub_fd,
        stderr=sub_fd,
        start_new_session=True,
    )
    os.close(sub_fd)
    screen = pyte.Screen(100, 30)
    stream = pyte.ByteStream(screen)
    shots: list[str] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main_fd], [], [], 0.1)
            if ready:
                try:
                    stream.feed(os.read(main_fd, 65536))
                except OSError:
                    break
                continue
            # 0.1 s without output, within a refresh period of 0.5 s: a whole frame is drawn
            shot = "\n".join(screen.display)
            if not shots or shots[-1] != shot:
                shots.append(shot)
        os.write(main_fd, b"q")
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    return shots


def test_status_watch_redraws_on_a_terminal_and_prints_blocks_into_a_pipe(tmp_path: Path) -> None:
    """``status --watch`` on a terminal redraws in place: the step it shows grows between two
    screens, with the steps per second and the time left (the example passes total_steps); ``q``
    ends it with 0. Into a pipe it prints one plain block per refresh and ends with the job."""
    job = single_job(tmp_path, steps=200)
    with running(job) as proc:

        def training() -> bool:
            st = status(job)
            return bool(st and st["ranks"] and st["ranks"][0]["last_step"] >= 5)

        wait_for(training, timeout=60, what="step 5", interval=0.3)
        shots = screens_of_watch(job, seconds=4.0)
        piped = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "status", "--watch", "0.5", str(job)],
            env=rvsup_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc.communicate(timeout=120)
        out, err = piped.communicate(timeout=30)
    steps = [_shown_step(s) for s in shots if "single-process: running" in s]
    assert len(steps) >= 2 and steps[-1] > steps[0], shots[-1]
    assert "steps/s, time left ~0:" in shots[-1], shots[-1]
    assert "q quits" in shots[-1] and "\x1b" not in out
    assert piped.returncode == 0, err
    blocks = out.split("--- ")[1:]
    assert len(blocks) >= 2, out
    assert all("single-process: running" in b for b in blocks), out
    assert out.rstrip().splitlines()[-1] == "single-process: not running; last attempt: succeeded"


def _shown_step(screen: str) -> int:
    line = next((ln for ln in screen.splitlines() if ln.startswith("step ")), None)
    assert line is not None, screen
    return int(line.split()[1].rstrip(","))


def test_completion_scripts_name_the_commands(tmp_path: Path) -> None:
    """``rvsup completion bash|zsh`` print scripts that know every command and option; bash
    loads the script without an error."""
    bash = rvsup("completion", "bash")
    assert bash.returncode == 0, bash.stderr
    for word in ("start", "validate", "status", "stop", "history", "logs", "--watch", "--follow"):
        assert word in bash.stdout, word
    script = tmp_path / "rvsup.bash"
    script.write_text(bash.stdout)
    loaded = subprocess.run(
        ["bash", "-c", f"source {script} && complete -p rvsup"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode == 0 and "rvsup" in loaded.stdout, loaded.stderr
    zsh = rvsup("completion", "zsh")
    assert zsh.returncode == 0 and "#compdef rvsup" in zsh.stdout


def test_start_into_a_closed_pipe_runs_the_job_to_its_end(tmp_path: Path) -> None:
    """``rvsup start job.toml 2>&1 | head -1``: the daemon's console (and torchrun's copy of the
    ranks' lines) goes into a pipe nobody reads; the job still runs to its end, exits 0, and
    the history is complete."""
    job = single_job(tmp_path, steps=60)
    piped = rvsup_into_closed_pipe("start", str(job), both=True)
    assert piped.returncode == 0
    evs = events(tmp_path / "runs" / "single-process")
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [59]
