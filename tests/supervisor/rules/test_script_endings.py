"""The rules for ranks whose script ended: aborts in interpreter teardown, a finished attempt,
and the usage errors the SDK refuses (what the crash names, what the policy does)."""

from __future__ import annotations

import signal

import pytest

from supervisor.rules.failures import aborted_after_end, classify, scripts_finished
from supervisor.rules.observation import FailureKind, Observation, RankExit, RankReport
from worker_sdk.contract.protocol import EXIT_USAGE

ABRT = int(signal.SIGABRT)


def killed(rank: int, signum: int = ABRT) -> RankExit:
    return RankExit(rank, 100 + rank, None, signum)


def exited(rank: int, status: int) -> RankExit:
    return RankExit(rank, 100 + rank, status, None)


RAISED = RankReport(1, "exception", "ValueError", "bad batch", 7)

FINISHED = {
    "all-ended-one-aborted": (2, {0, 1}, (killed(0), exited(1, 0)), (), True),
    "all-ended-all-aborted": (2, {0, 1}, (killed(0), killed(1, 11)), (), True),
    "shell-style-abort-status": (2, {0, 1}, (exited(0, 128 + ABRT), exited(1, 0)), (), True),
    "all-ended-clean": (2, {0, 1}, (exited(0, 0), exited(1, 0)), (), True),
    "one-not-ended": (2, {0}, (killed(0),), (), False),
    "aborted-before-ending": (2, {1}, (killed(0), exited(1, 0)), (), False),
    "exit-code-after-end-is-the-script-s-verdict": (
        2,
        {0, 1},
        (exited(0, 1), exited(1, 0)),
        (),
        False,
    ),
    "a-reported-failure": (2, {0, 1}, (killed(0),), (RAISED,), False),
    "single-process": (1, {0}, (killed(0),), (), True),
}


@pytest.mark.parametrize(
    ("world", "ended", "exits", "reports", "finished"),
    list(FINISHED.values()),
    ids=list(FINISHED),
)
def test_scripts_finished(
    world: int,
    ended: set[int],
    exits: tuple[RankExit, ...],
    reports: tuple[RankReport, ...],
    finished: bool,
) -> None:
    """An attempt counts as finished when every rank's script ended, none reported a failure,
    and only aborts after the end (a signal, shell-style 128+N included) failed."""
    assert scripts_finished(world, ended, exits, reports) is finished


def test_aborted_after_end_names_only_signals_after_the_end() -> None:
    """A signal after the end is an abort in teardown; a signal before the end, or an exit code
    after it, is not."""
    exits = (killed(0), killed(1), exited(2, 3), exited(3, 0))
    assert aborted_after_end(exits, {0, 2, 3}) == (killed(0),)


def test_a_usage_exit_names_what_the_sdk_said() -> None:
    """A rank that exited with EXIT_USAGE is a crash whose detail carries the SDK's message
    from the rank's stderr, whole."""
    message = "worker_sdk.resume() was called before init_process_group() " + "x" * 200
    obs = Observation(
        exits=(exited(1, EXIT_USAGE), killed(0, int(signal.SIGTERM))),
        stderr_tail=f"Traceback (most recent call last):\n  ...\nworker_sdk.UsageError: {message}\n",
    )
    failure = classify(obs)
    assert failure.kind is FailureKind.CRASH
    assert failure.ranks == (1, 0)
    assert failure.exit_codes == (EXIT_USAGE,)
    assert failure.detail == (
        f"rank 1 exited with code {EXIT_USAGE} (the script called worker_sdk wrongly): {message}"
    )
