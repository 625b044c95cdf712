"""Jobs that never touch torch.distributed: examples/single_process under rvsup, with the zygote
and cold, sync and async saves, a kill, a stop; and the wrong call order of a 2-rank script."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import pytest

from supervisor.process import native
from tests.helpers.fixtures import built_once
from tests.helpers.harness import REPO, events, named, running, rvsup, status, wait_for
from tests.helpers.states import assert_same_state, load_final
from worker_sdk.contract import protocol as p

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

EXAMPLE = REPO / "examples" / "single_process"
STEPS = 80


def single_job(tmp: Path, *, zygote: bool = True, async_save: bool = False, args: str = "") -> Path:
    """examples/single_process/job.toml, shortened to STEPS steps with a save every 20."""
    text = (EXAMPLE / "job.toml").read_text()
    command = (
        f'command = ["{sys.executable}", "{EXAMPLE / "train.py"}", "--steps", "{STEPS}", '
        f'"--save-final", "{tmp / "final.pt"}"{args}]'
    )
    text = text.replace(
        'command = ["python", "train.py", "--steps", "200", "--kill-at-step", "120"]', command
    )
    text = text.replace("every_steps = 50", f"every_steps = 20\nasync = {str(async_save).lower()}")
    text = text.replace('backoff = "1s"', 'backoff = "0.1s"')
    text = text.replace("nproc_per_node = 1", f"nproc_per_node = 1\nzygote = {str(zygote).lower()}")
    assert text.count(str(tmp)) == 1, "the example's job.toml changed: update this test"
    job = tmp / "job.toml"
    job.write_text(text)
    return job


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of an uninterrupted run under rvsup (zygote, sync saves), one for the
    whole run (see built_once)."""

    def build(tmp: Path) -> Path:
        res = rvsup("start", str(single_job(tmp)), timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        evs = events(tmp / "runs" / "single-process")
        assert not named(evs, "failure_detected") and not named(evs, "exit_aborted"), evs
        assert not named(evs, "messages_dropped"), "every message of the SDK is accepted"
        assert [e["last_step"] for e in named(evs, "job_succeeded")] == [STEPS - 1]
        return tmp / "final.pt"

    return built_once(tmp_path_factory, "reference-single-process", build)


@pytest.mark.parametrize(
    ("zygote", "async_save"), [(True, False), (False, False), (True, True)], ids=str
)
def test_a_killed_single_process_job_resumes_bit_identically(
    tmp_path: Path, reference: Path, zygote: bool, async_save: bool
) -> None:
    """kill -9 at step 50 of the first attempt: rvsup resumes from the step-39 checkpoint and the
    job exits 0 with the weights, optimizer state and sample count of the uninterrupted run; no
    rank aborted at interpreter exit."""
    job = single_job(
        tmp_path, zygote=zygote, async_save=async_save, args=', "--kill-at-step", "50"'
    )
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "runs" / "single-process")
    (failure,) = named(evs, "failure_detected")
    assert (failure["kind"], failure["signals"], failure["last_step"]) == ("crash", ["SIGKILL"], 49)
    assert failure["nodes"] == [p.node_name(None, socket.gethostname())], failure
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 40]
    assert not named(evs, "exit_aborted")
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def test_sigterm_stops_a_single_process_job_with_a_checkpoint_and_it_resumes(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM (what Slurm sends): the process saves where it is, rvsup exits 75; started again,
    it resumes right after that step and ends bit-identical to the uninterrupted run."""
    job = single_job(tmp_path, args=', "--step-sleep", "0.1"')  # 5.5 s left after step 25
    with running(job) as proc:

        def trained() -> bool:
            st = status(job)
            return bool(st and st["ranks"] and st["ranks"][0]["last_step"] >= 25)

        wait_for(trained, timeout=90, what="step 25", interval=0.2)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 75
    evs = events(tmp_path / "runs" / "single-process")
    (stopped,) = named(evs, "job_stopped")
    assert stopped["reason"] == "preempted" and stopped["step"] >= 25
    single_job(tmp_path)  # the same job, its steps at full speed
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "runs" / "single-process")
    assert named(evs, "attempt_started")[-1]["resume_step"] == stopped["step"] + 1
    assert not named(evs, "failure_detected")
    assert_same_state(load_final(reference), load_final(tmp_path / "final.pt"))


def script_job(tmp: Path, script: str, *, nproc: int, heartbeat: str = "") -> Path:
    """A job running ``script`` (saved as train.py) on ``nproc`` processes, a save every 10
    steps, up to 3 restarts."""
    (tmp / "train.py").write_text(script)
    job = tmp / "job.toml"
    job.write_text(
        f"""
[job]
name = "script"
command = ["{sys.executable}", "train.py"]
run_dir = "run"
checkpoint_dir = "ckpt"
env = {{ OMP_NUM_THREADS = "1" }}
[launch]
nproc_per_node = {nproc}
[checkpoint]
every_steps = 10
[heartbeat]
{heartbeat}
[restart]
max_restarts = 3
backoff = "0.1s"
"""
    )
    return job


WRONG_ORDER = """
import torch, torch.distributed as dist, worker_sdk
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
start, _ = worker_sdk.resume(model, opt)  # before init_process_group: refused
dist.init_process_group("gloo")
for step in range(start, 20):
    worker_sdk.step(step)
"""


def test_resume_before_init_process_group_gives_up_at_once_saying_why(tmp_path: Path) -> None:
    """A 2-rank script that calls resume() before init_process_group(): the ranks exit with
    EXIT_USAGE at once, and rvsup gives up after the first attempt (exit 3) with the SDK's
    message in the failure and the reason, never restarting it."""
    res = rvsup("start", str(script_job(tmp_path, WRONG_ORDER, nproc=2)), timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    evs = events(tmp_path / "run")
    assert len(named(evs, "attempt_started")) == 1 and not named(evs, "restart_scheduled")
    (failure,) = named(evs, "failure_detected")
    assert failure["kind"] == "crash" and 87 in failure["exit_codes"], failure
    assert "called before torch.distributed.init_process_group()" in failure["detail"], failure
    (gave_up,) = named(evs, "job_gave_up")
    assert gave_up["reason"].startswith("the training script must be changed"), gave_up
    assert "Call init_process_group() first" in gave_up["reason"], gave_up
    assert "Assertion failed" not in res.stdout + res.stderr


ABORTS_AT_EXIT = """
import atexit, os, sys, torch, worker_sdk
atexit.register(os.abort)  # runs after the SDK's own exit hook: an abort in teardown
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
start, _ = worker_sdk.resume(model, opt)
for step in range(start, 30):
    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
    worker_sdk.step(step)
print("about to leave", file=sys.stderr, flush=True)
"""


def test_an_abort_after_the_script_ended_is_recorded_and_the_job_succeeds(tmp_path: Path) -> None:
    """A process that finished its loop and then died of SIGABRT in interpreter teardown: one
    attempt, exit 0, no failure, and ``exit_aborted`` names the rank, the signal, its last step
    and the end of its stderr."""
    res = rvsup("start", str(script_job(tmp_path, ABORTS_AT_EXIT, nproc=1)), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "run")
    assert len(named(evs, "attempt_started")) == 1 and not named(evs, "failure_detected")
    (aborted,) = named(evs, "exit_aborted")
    assert (aborted["rank"], aborted["signal"], aborted["last_step"]) == (0, "SIGABRT", 29)
    assert "about to leave" in aborted["stderr_tail"], aborted
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [29]


STOPS_ITSELF = """
import os, signal, time, torch, worker_sdk
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
start, _ = worker_sdk.resume(model, opt)
for step in range(start, 40):
    if step == 25 and os.environ["RVSUP_ATTEMPT"] == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
    time.sleep(0.02)
    worker_sdk.step(step)
"""


@pytest.mark.serial  # caught within 6 s
def test_a_stopped_single_process_is_a_hang_caught_and_resumed(tmp_path: Path) -> None:
    """A single process that stops itself (SIGSTOP) at step 25: rvsup declares a hang of rank 0
    at step 24 within the 5 s automatic timeout + 1 s, reads its stacks without continuing it
    (py-spy), so it takes no step after the hang was caught, and the restart resumes from the
    newest checkpoint or snapshot of step 24 or before, whatever the machine's speed:
    attempt_started says the step the process then loads."""
    job = script_job(tmp_path, STOPS_ITSELF, nproc=1, heartbeat='interval = "0.2s"')
    res = rvsup("start", str(job), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    evs = events(tmp_path / "run")
    (failure,) = named(evs, "failure_detected")
    assert (failure["kind"], failure["ranks"], failure["last_step"]) == ("hang", [0], 24), failure
    assert failure["detect_s"] <= 6.0, failure
    diag = Path(str(failure["diagnostics"]))
    assert p.read_step_slot(diag / p.step_slot_file(0)) == 24  # not one step more
    if native.find_py_spy() is not None:  # the test extra installs it: the daemon finds it too
        stacks = (diag / p.stacks_file(0)).read_text()
        assert stacks.startswith(native.STOPPED_HEADER), stacks
    first, second = named(evs, "attempt_started")
    assert first["resume_step"] == 0
    # storage's step 19, or a snapshot of a later step taken before the stop
    assert 20 <= second["resume_step"] <= 25, second
    assert second["checkpoint"].endswith(f"step-{second['resume_step'] - 1:010d}"), second
    loaded = [e for e in named(evs, "checkpoint_loaded") if e["attempt"] == 2]
    assert [e["resume_step"] for e in loaded] == [second["resume_step"]], loaded
