"""The first thing a newcomer runs: examples/ddp_toy, whose rank 1 kills itself mid-run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, events, named, rvsup

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

EXAMPLE = REPO / "examples" / "ddp_toy"
# torch's and Python's warnings: "W1125 09:17:55.374000 ... api.py:753] ...", "UserWarning: ..."
WARNING = re.compile(r"^[WE]\d{4} \d\d:\d\d:\d\d|Warning\b", re.MULTILINE)


def test_the_toy_example_meets_a_crash_recovers_and_prints_no_warning(tmp_path: Path) -> None:
    """The example job as README runs it (its job.toml, with its folders moved here): rank 1 is
    killed at step 120, rvsup restarts both ranks from the step-99 checkpoint, the job ends at
    step 299 with nothing lost beyond the steps since that checkpoint, the history says so (the
    failure at step 119 exactly, though heartbeats go out once a second and steps take
    milliseconds: the ranks' step slots, read on the node, say it), and
    nothing around the run is a warning of torch's or Python's (torchrun's shutdown notices at
    teardown included)."""
    text = (EXAMPLE / "job.toml").read_text()
    text = text.replace('"train.py"', f'"{EXAMPLE / "train.py"}"')
    job = tmp_path / "job.toml"
    job.write_text(text)
    started = rvsup("start", str(job), timeout=200)
    assert started.returncode == 0, started.stdout + started.stderr
    output = started.stdout + started.stderr
    assert not WARNING.search(output), WARNING.findall(output)
    assert "[default1]:rank 1: killing itself at step 120" in output, output
    evs = events(tmp_path / "runs" / "ddp-toy")
    (failure,) = named(evs, "failure_detected")
    assert (failure["kind"], failure["ranks"][0], failure["signals"][0]) == ("crash", 1, "SIGKILL")
    assert failure["last_step"] == 119, failure
    assert [a["resume_step"] for a in named(evs, "attempt_started")] == [0, 100]
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [299]
    history = rvsup("history", str(job))
    assert history.returncode == 0, history.stderr
    assert "rank 1 killed by SIGKILL at step 119" in history.stdout, history.stdout
    assert "2 attempts (1 crash); 20 steps redone" in history.stdout, history.stdout
