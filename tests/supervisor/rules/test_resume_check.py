"""The resume check's rule (supervisor.rules.resume_check), from tables: one rank's values before
and after a resume compared in the window after the resume step, bit for bit or within the
tolerance, what is likely at fault, and the values kept across attempts."""

from __future__ import annotations

import pytest

from supervisor.rules.resume_check import (
    KEPT_STEPS,
    Difference,
    RankPrints,
    compare_rank,
    suspects,
)
from worker_sdk.contract.protocol import PRINT_WINDOW


def _prints(
    first: int,
    losses: tuple[float | None, ...],
    params: tuple[int, float] | None = None,
    *,
    exact: bool = True,
) -> RankPrints:
    prints = RankPrints()
    prints.add(first, losses, params, exact)
    return prints


BEFORE = _prints(20, (0.5, 0.25, 0.125, 0.0625), (23, 3.5))  # the failed attempt: steps 20-23


@pytest.mark.parametrize(
    ("after", "values", "difference", "complete"),
    [
        (_prints(20, (0.5, 0.25, 0.125, 0.0625)), 4, None, True),
        (_prints(20, (0.5, 0.25)), 2, None, False),  # steps 22 and 23 still to come
        (_prints(20, (0.5, None, 0.125, 0.0625)), 3, None, True),  # no loss given at 21
        (_prints(20, (0.5, 0.25, 0.125, 0.0625, 9.0)), 4, None, True),  # 24: not in the before
        (
            _prints(20, (0.75, 0.25, 0.125, 0.0625)),
            1,
            Difference(20, 3, "loss", 0.5, 0.75),
            True,
        ),
        (
            _prints(20, (0.5, 0.25, 0.125 + 2**-40, 0.0625)),
            3,
            Difference(22, 3, "loss", 0.125, 0.125 + 2**-40),
            True,
        ),
        (
            _prints(20, (0.5, 0.25, 0.125, 0.0625), (23, 3.5 + 2**-40)),
            5,
            Difference(23, 3, "parameters", 3.5, 3.5 + 2**-40),
            True,
        ),
        (_prints(20, (0.5, 0.25, 0.125, 0.0625), (23, 3.5)), 5, None, True),
    ],
    ids=[
        "equal",
        "partway",
        "a-step-without-loss",
        "past-the-earlier-attempt",
        "differs-at-the-resume",
        "differs-by-one-ulp-later",
        "parameters-differ",
        "parameters-equal",
    ],
)
def test_one_ranks_values_are_compared_bit_for_bit(
    after: RankPrints, values: int, difference: Difference | None, complete: bool
) -> None:
    """Resumed at step 20: the steps both attempts have values for are compared bit for bit
    (one ulp is a difference), the first difference is the earliest step's, and the comparison
    is complete once the resumed attempt reached the last step the earlier one ran."""
    result = compare_rank(3, BEFORE, after, 20)
    assert (result.values, result.difference, result.complete) == (values, difference, complete)
    assert result.exact


def test_a_loss_difference_before_a_parameter_difference_is_the_first() -> None:
    """When both differ, the earlier step is named, whatever its kind."""
    after = _prints(20, (0.5, 0.3), (23, 4.0))
    assert compare_rank(0, BEFORE, after, 20).difference == Difference(21, 0, "loss", 0.25, 0.3)


def test_only_the_window_after_the_resume_step_counts() -> None:
    """Values before the resume step, or PRINT_WINDOW steps or more after it, are not compared:
    every attempt fingerprints the window right after the checkpoint it resumes from."""
    before = _prints(18, (1.0, 1.0, 0.5))
    before.add(20 + PRINT_WINDOW, (7.0,), None, True)
    after = _prints(18, (2.0, 2.0, 0.5))
    after.add(20 + PRINT_WINDOW, (8.0,), None, True)
    result = compare_rank(0, before, after, 20)
    assert (result.values, result.difference, result.first_step, result.last_step) == (
        1,
        None,
        20,
        20,
    )


@pytest.mark.parametrize(
    ("after_loss", "differs"),
    [(0.5 * (1 + 5e-4), False), (0.5 * (1 + 5e-3), True)],
    ids=["within-1e-3", "beyond-1e-3"],
)
def test_values_that_do_not_repeat_by_nature_are_compared_within_the_tolerance(
    after_loss: float, differs: bool
) -> None:
    """Where either attempt's values are not exact (CUDA without deterministic algorithms),
    a relative difference up to 1e-3 is equal, and the comparison says it was not exact."""
    after = _prints(20, (after_loss,), exact=False)
    result = compare_rank(0, BEFORE, after, 20)
    assert (result.difference is not None) == differs
    assert not result.exact


def test_a_rank_the_earlier_attempts_never_ran_past_the_resume_is_complete_at_once() -> None:
    """Nothing redone on that rank: nothing to wait for, nothing compared."""
    result = compare_rank(0, _prints(10, (1.0,)), _prints(20, (0.5,)), 20)
    assert (result.values, result.complete, result.difference) == (0, True, None)


@pytest.mark.parametrize(
    ("step", "what"),
    [(20, "the state loaded or the first batch"), (23, "state that changes between steps")],
    ids=["at-the-resume-step", "later"],
)
def test_what_is_likely_at_fault_follows_where_the_difference_first_shows(
    step: int, what: str
) -> None:
    """At the resume step itself, what was loaded or the first batch is suspect (and the fix is
    to register or seed it); later, state that changes outside the checkpoint."""
    likely, hint = suspects(Difference(step, 0, "loss", 1.0, 2.0), 20)
    assert likely.startswith(what)
    assert "docs/resume-check.md" in hint


def test_values_kept_across_attempts_are_the_newest_and_bounded() -> None:
    """A later attempt's values replace the same steps' and the newest KEPT_STEPS steps of each
    kind are kept; exactness is lost for good once any attempt was not exact."""
    kept = _prints(0, (1.0,) * KEPT_STEPS, (15, 1.0))
    kept.merge(_prints(KEPT_STEPS - 1, (2.0, 3.0), (KEPT_STEPS + 14, 2.0), exact=False))
    assert len(kept.losses) == KEPT_STEPS
    assert min(kept.losses) == 1
    assert (kept.losses[KEPT_STEPS - 1], kept.losses[KEPT_STEPS]) == (2.0, 3.0)
    assert kept.params == {15: 1.0, KEPT_STEPS + 14: 2.0}
    assert kept.reached == KEPT_STEPS + 14
    assert not kept.exact
