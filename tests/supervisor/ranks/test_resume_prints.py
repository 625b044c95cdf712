"""The resume check's book (supervisor.ranks.resume_prints): the fingerprints of one rvsup start's
attempts, and one verdict per resume (verified, diverged, unverified with its reason)."""

from __future__ import annotations

import pytest

from supervisor.ranks.resume_prints import ResumeBook, stopping
from supervisor.record.schema import ResumeDiverged, ResumeUnverified, ResumeVerified
from worker_sdk.contract import messages as m

LOSSES = (0.5, 0.25, 0.125, 0.0625)


def _failed_attempt(book: ResumeBook, *, ranks: int = 2) -> None:
    """Attempt 1: fresh start, a save of step 19, then steps 20-23 run before it failed."""
    book.begin_attempt(rollback=False)
    book.loaded(m.Loaded(0, None, None, None))
    for rank in range(ranks):
        assert book.heard(rank, m.StepPrints(20, LOSSES)) is None
    assert book.ended() is None  # a fresh start has no verdict


def _resumed(book: ResumeBook, *, step: int = 20, resharded: int | None = None) -> None:
    book.begin_attempt(rollback=False)
    book.loaded(m.Loaded(step, "/ckpt/step-19", 2, resharded, "storage"))


def test_an_exact_resume_is_verified_once_every_rank_redid_the_steps() -> None:
    """Resumed at 20: the verdict waits until both ranks reached step 23, then one
    resume_verified with the steps, values and ranks compared; nothing more at the end."""
    book = ResumeBook("warn")
    _failed_attempt(book)
    _resumed(book)
    assert book.heard(0, m.StepPrints(20, LOSSES)) is None  # rank 1 still to come
    assert book.heard(1, m.StepPrints(20, LOSSES[:2])) is None
    verdict = book.heard(1, m.StepPrints(22, LOSSES[2:]))
    assert verdict == ResumeVerified(
        resume_step=20, first_step=20, last_step=23, values=8, ranks=2, exact=True, complete=True
    )
    assert book.heard(0, m.StepPrints(24, (9.0,))) is None
    assert book.ended() is None


def test_a_difference_is_a_divergence_at_once_naming_the_earliest_step() -> None:
    """Rank 1's loss of step 21 differs: resume_diverged at once with both values, what is
    likely at fault and the fix; the policy is said, and only "fail" stops the job."""
    book = ResumeBook("warn")
    _failed_attempt(book)
    _resumed(book)
    verdict = book.heard(1, m.StepPrints(20, (0.5, 0.3)))
    assert isinstance(verdict, ResumeDiverged)
    assert (verdict.step, verdict.rank, verdict.what, verdict.before, verdict.after) == (
        21,
        1,
        "loss",
        0.25,
        0.3,
    )
    assert verdict.likely.startswith("state that changes between steps")
    assert verdict.policy == "warn"
    assert stopping(verdict) is None
    assert book.heard(0, m.StepPrints(20, (0.7,))) is None  # one verdict per resume
    assert book.ended() is None


def test_under_fail_a_divergence_is_the_evidence_of_a_failure() -> None:
    """With resume_check = "fail" the divergence becomes the attempt's failure evidence, its
    detail naming the rank, the step, both values and the resume step."""
    book = ResumeBook("fail")
    _failed_attempt(book)
    _resumed(book)
    verdict = book.heard(0, m.StepPrints(20, (0.75,)))
    divergence = stopping(verdict)
    assert divergence is not None
    assert (divergence.step, divergence.rank) == (20, 0)
    assert "rank 0's loss at step 20 was 0.5 before the restart and is 0.75" in divergence.detail
    assert "resumed at step 20, compared bit for bit" in divergence.detail


def test_an_attempt_that_ends_partway_is_verified_as_far_as_it_got() -> None:
    """The resumed attempt failed again at step 21: at its end, resume_verified over what was
    compared, marked incomplete."""
    book = ResumeBook("warn")
    _failed_attempt(book)
    _resumed(book)
    for rank in (0, 1):
        assert book.heard(rank, m.StepPrints(20, LOSSES[:2])) is None
    verdict = book.ended()
    assert isinstance(verdict, ResumeVerified)
    assert (verdict.values, verdict.last_step, verdict.complete) == (4, 21, False)


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("resharded", "resharded from 4 ranks"),
        ("rollback", "a rollback skips the steps after the anomaly"),
        ("no-earlier", "no fingerprints of earlier attempts under this rvsup start"),
        ("nothing-redone", "nothing redone to compare"),  # or not sent before the failure
        ("silent", "no fingerprint was sent"),
        ("silent-before", "no fingerprint was sent"),
        ("ended-early", "the attempt ended before it sent a fingerprint"),
    ],
)
def test_a_resume_that_cannot_be_compared_says_why(setup: str, reason: str) -> None:
    """One resume_unverified at the attempt's end, with the reason: another world size, a
    rollback, no earlier attempt under this start (a requeue), nothing redone (resumed past
    everything run), no fingerprint sent (by this attempt, or by any before it), or none of
    the steps to compare."""
    book = ResumeBook("warn")
    if setup == "silent-before":  # a framework's own checkpoints, no loss: nothing ever sent
        book.begin_attempt(rollback=False)
        book.loaded(m.Loaded(0, None, None, None))
    elif setup != "no-earlier":
        _failed_attempt(book)
    if setup == "rollback":
        book.begin_attempt(rollback=True)
        book.loaded(m.Loaded(30, "/ckpt/step-19", 2, None, "storage"))
    else:
        step = 24 if setup == "nothing-redone" else 20
        _resumed(book, step=step, resharded=4 if setup == "resharded" else None)
    if setup == "ended-early":
        book.heard(0, m.StepPrints(30, (1.0,)))
    verdict = book.ended()
    assert isinstance(verdict, ResumeUnverified)
    assert reason in verdict.reason


def test_off_records_and_says_nothing() -> None:
    """resume_check = "off": no verdict, whatever the values."""
    book = ResumeBook("off")
    _failed_attempt(book)
    _resumed(book)
    assert book.heard(0, m.StepPrints(20, (9.0,))) is None
    assert book.ended() is None


def test_after_a_rollback_the_earlier_trajectory_is_forgotten() -> None:
    """The attempt after a rollback trains on other data: its values replace the earlier
    ones, and the next resume compares against them only."""
    book = ResumeBook("warn")
    _failed_attempt(book)
    book.begin_attempt(rollback=True)
    book.loaded(m.Loaded(20, "/ckpt/step-19", 2, None, "storage"))
    for rank in (0, 1):
        book.heard(rank, m.StepPrints(20, (1.0, 2.0)))
    assert isinstance(book.ended(), ResumeUnverified)
    _resumed(book)
    for rank in (0, 1):
        verdict = book.heard(rank, m.StepPrints(20, (1.0, 2.0)))
    assert isinstance(verdict, ResumeVerified)
