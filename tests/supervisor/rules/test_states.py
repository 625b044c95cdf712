"""The job lifecycle table: every pair of states is either allowed or refused, as documented."""

from __future__ import annotations

import itertools

import pytest

from supervisor.rules.states import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransitionError,
    JobState,
    check_transition,
    exit_code,
)

# Written out independently of the module, by name, from the design.
ALLOWED: dict[str, set[str]] = {
    "STARTING": {"RUNNING", "STOPPING", "TEARING_DOWN", "SUCCEEDED", "STOPPED", "GAVE_UP"},
    "RUNNING": {"SAVING", "STOPPING", "TEARING_DOWN", "SUCCEEDED"},
    "SAVING": {"RUNNING", "STOPPING", "TEARING_DOWN", "SUCCEEDED"},
    "STOPPING": {"TEARING_DOWN", "STOPPED", "SUCCEEDED"},
    "TEARING_DOWN": {"BACKOFF", "GAVE_UP", "STOPPED"},
    "BACKOFF": {"STARTING", "STOPPED", "GAVE_UP"},
    "SUCCEEDED": set(),
    "GAVE_UP": set(),
    "STOPPED": set(),
}

ALL_PAIRS = [
    pytest.param(old, new, new.name in ALLOWED[old.name], id=f"{old.name}->{new.name}")
    for old, new in itertools.product(JobState, JobState)
]


def test_table_names_every_state() -> None:
    """The expectation table and the enum cover exactly the same nine states."""
    assert set(ALLOWED) == {s.name for s in JobState}
    assert len(JobState) == 9


@pytest.mark.parametrize(("old", "new", "allowed"), ALL_PAIRS)
def test_every_pair(old: JobState, new: JobState, allowed: bool) -> None:
    """check_transition accepts exactly the documented pairs and raises for all others."""
    assert (new in TRANSITIONS[old]) is allowed
    if allowed:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransitionError) as info:
            check_transition(old, new)
        assert info.value.old is old
        assert info.value.new is new
        assert f"{old.name} -> {new.name}" in str(info.value)


def test_error_lists_allowed_targets() -> None:
    """The error message says which states the old one could have gone to."""
    with pytest.raises(IllegalTransitionError) as info:
        check_transition(JobState.BACKOFF, JobState.RUNNING)
    assert "allowed: GAVE_UP, STARTING, STOPPED" in str(info.value)
    with pytest.raises(IllegalTransitionError) as info:
        check_transition(JobState.SUCCEEDED, JobState.STARTING)
    assert "nothing (terminal)" in str(info.value)


def test_illegal_transition_is_a_runtime_error() -> None:
    """Callers that catch RuntimeError also catch an illegal transition."""
    assert issubclass(IllegalTransitionError, RuntimeError)


def test_transitions_table_is_read_only() -> None:
    """Nobody can patch the table at run time."""
    with pytest.raises(TypeError):
        TRANSITIONS[JobState.BACKOFF] = frozenset({JobState.RUNNING})  # type: ignore[index]


@pytest.mark.parametrize(
    ("state", "code"),
    [
        pytest.param(JobState.SUCCEEDED, 0, id="succeeded-0"),
        pytest.param(JobState.GAVE_UP, 3, id="gave-up-3"),
        pytest.param(JobState.STOPPED, 75, id="stopped-75"),
    ],
)
def test_exit_code_of_terminal_states(state: JobState, code: int) -> None:
    """Each terminal state maps to the documented exit status of `rvsup start`."""
    assert exit_code(state) == code


@pytest.mark.parametrize(
    "state", [s for s in JobState if s.name not in ("SUCCEEDED", "GAVE_UP", "STOPPED")]
)
def test_exit_code_of_live_state_is_an_error(state: JobState) -> None:
    """A state that does not end the job has no exit status."""
    with pytest.raises(ValueError, match="not a terminal state"):
        exit_code(state)


def test_terminal_states_are_exactly_those_without_exits() -> None:
    """TERMINAL is the three end states, and only they have no way out."""
    assert {s.name for s in TERMINAL} == {"SUCCEEDED", "GAVE_UP", "STOPPED"}
    assert {s for s in JobState if not TRANSITIONS[s]} == TERMINAL


def test_every_live_state_can_reach_a_terminal_state() -> None:
    """No state is a trap: from every state some path leads to an end."""
    for start in JobState:
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert seen & TERMINAL, start
