"""The resume-source rule (supervisor.rules.resume_source), from a table."""

from __future__ import annotations

import pytest

from supervisor.rules.resume_source import ResumeChoice, choose

CASES = [
    # storage, snapshots, resume_before, memory_on, joining -> source, step
    (None, [], None, True, False, None, None),
    (19, [], None, True, False, "storage", 19),
    (None, [23, 24], None, True, False, "memory", 24),
    (19, [23, 24], None, True, False, "memory", 24),
    (19, [24, 23], None, True, False, "memory", 24),
    (19, [19], None, True, False, "storage", 19),  # not strictly newer: storage wins
    (19, [17, 18], None, True, False, "storage", 19),  # older snapshots are never chosen
    (
        19,
        [23, 24],
        24,
        True,
        False,
        "storage",
        19,
    ),  # after a rollback: storage, as rolled_back says
    (19, [23, 24], 23, True, False, "storage", 19),
    (None, [23, 24], 5, True, False, None, None),
    (19, [23, 24], None, False, False, "storage", 19),  # the tier is off ("off")
    (None, [23], None, False, False, None, None),
    (19, [23, 24], None, True, True, "replica", 24),  # a spare joins: a copy sent to it
    (None, [23], None, True, True, "replica", 23),
    (19, [17], None, True, True, "storage", 19),  # joining changes nothing else
    (19, [23, 24], 23, True, True, "storage", 19),
    (19, [23, 24], None, False, True, "storage", 19),
]


@pytest.mark.parametrize(
    ("storage", "snapshots", "before", "on", "joining", "source", "step"), CASES, ids=str
)
def test_choose(
    storage: int | None,
    snapshots: list[int],
    before: int | None,
    on: bool,
    joining: bool,
    source: str | None,
    step: int | None,
) -> None:
    """The newest of storage and the complete snapshots, a snapshot only when strictly newer,
    none from a rollback's onset on, no snapshot when the tier is off; a replica when a node
    joins that holds no copy."""
    choice = choose(storage, snapshots, resume_before=before, memory_on=on, joining=joining)
    assert choice == ResumeChoice(source, step)  # type: ignore[arg-type]
    assert choice.resume_step == (0 if step is None else step + 1)
