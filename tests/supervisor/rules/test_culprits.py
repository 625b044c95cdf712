"""A hang's culprits from the ranks' faulthandler dumps (the ranks not waiting in a collective)
and from their flight recorders (the ranks behind the others)."""

from __future__ import annotations

import json

import pytest

from supervisor.rules.culprits import (
    FlightStatus,
    Frame,
    Verdict,
    collective_of,
    flight_status,
    flight_verdict,
    judge,
    main_thread,
    under_way,
    where,
)

SITE = "/venv/lib/python3.11/site-packages"

WAITING_IN_ALL_REDUCE = f"""Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/work/train.py", line 57 in main
  File "/work/train.py", line 80 in <module>
"""

WAITING_IN_BACKWARD = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 841 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 353 in backward
  File "{SITE}/torch/_tensor.py", line 625 in backward
  File "/work/train.py", line 55 in main
"""

SLEEPING = """Current thread 0x00007f0000000003 (most recent call first):
  File "/work/train.py", line 42 in inject
  File "/work/train.py", line 53 in main
  File "/work/train.py", line 80 in <module>
"""

TWO_DUMPS = SLEEPING + "\n" + WAITING_IN_ALL_REDUCE


def test_main_thread_is_the_current_thread_of_the_last_dump() -> None:
    """Other threads are ignored; of two dumps in one file, the last one counts."""
    frames = main_thread(TWO_DUMPS)
    assert frames[1] == Frame(f"{SITE}/torch/distributed/distributed_c10d.py", 2501, "all_reduce")
    assert main_thread("") == []
    assert main_thread('Thread 0x1 (most recent call first):\n  File "a.py", line 1 in f\n') == []


@pytest.mark.parametrize(
    ("dump", "expected"),
    [
        (WAITING_IN_ALL_REDUCE, "wrapper"),
        (WAITING_IN_BACKWARD, "_engine_run_backward"),
        (SLEEPING, None),
    ],
)
def test_collective_of(dump: str, expected: str | None) -> None:
    """c10d, DDP/FSDP and autograd frames (DDP's reduction ends backward()) count as waiting."""
    assert collective_of(main_thread(dump)) == expected


def test_where_prefers_the_users_code() -> None:
    """The innermost frame outside installed packages and the standard library."""
    assert where(main_thread(WAITING_IN_ALL_REDUCE)) == "train.py:57 in main"
    assert where(main_thread(SLEEPING)) == "train.py:42 in inject"
    assert where([]) == "no stack"


@pytest.mark.parametrize(
    ("dumps", "culprits", "detail"),
    [
        (
            {0: WAITING_IN_ALL_REDUCE, 1: SLEEPING},
            (1,),
            "rank 1 is not in a collective (train.py:42 in inject); rank 0 waits in wrapper",
        ),
        (
            {0: SLEEPING, 1: WAITING_IN_BACKWARD, 2: WAITING_IN_ALL_REDUCE},
            (0,),
            (
                "rank 0 is not in a collective (train.py:42 in inject); "
                "ranks 1, 2 wait in _engine_run_backward, wrapper"
            ),
        ),
        (
            {0: WAITING_IN_ALL_REDUCE, 1: "Current thread 0x1 (most recent call first):\n"},
            (1,),
            "rank 1 wrote no stack (stopped or stuck outside Python); rank 0 waits in wrapper",
        ),
        ({0: WAITING_IN_ALL_REDUCE, 1: ""}, (1,), None),
        # a dump cut short before the main thread (it comes last) says nothing
        (
            {0: WAITING_IN_ALL_REDUCE, 1: "Thread 0x2 (most recent call first):\n"},
            None,
            None,
        ),
        ({0: WAITING_IN_ALL_REDUCE, 1: WAITING_IN_BACKWARD}, None, None),
        ({0: SLEEPING, 1: SLEEPING}, None, None),
        ({0: WAITING_IN_ALL_REDUCE}, None, None),
        ({}, None, None),
    ],
)
def test_judge(dumps: dict[int, str], culprits: tuple[int, ...] | None, detail: str | None) -> None:
    """Culprits only when some ranks wait in a collective and others do not; a rank that wrote
    no stack next to waiting ones is a culprit too, one whose dump was cut short is left out;
    otherwise no verdict."""
    _check(judge(dumps), culprits, detail)


@pytest.mark.parametrize(
    ("dumps", "stopped", "culprits"),
    [
        # its dump cut short or not yet written: being stopped is enough
        ({0: WAITING_IN_ALL_REDUCE, 1: "Thread 0x2 (most recent call first):\n"}, {1}, (1,)),
        ({0: WAITING_IN_ALL_REDUCE}, {1}, (1,)),
        # continued to dump, it may already wait in the collective itself: still the culprit
        ({0: WAITING_IN_ALL_REDUCE, 1: WAITING_IN_BACKWARD}, {1}, (1,)),
        # stopped ranks first, then the others not in a collective
        ({0: SLEEPING, 1: WAITING_IN_ALL_REDUCE, 2: ""}, {2}, (2, 0)),
        # nobody waits for them: no verdict
        ({0: SLEEPING}, {1}, None),
    ],
)
def test_a_stopped_rank_is_a_culprit_whatever_its_dump(
    dumps: dict[int, str], stopped: set[int], culprits: tuple[int, ...] | None
) -> None:
    """A rank the supervisor found stopped by a signal is named first, whether its dump is
    missing, cut short or (continued to dump) already shows it waiting in a collective."""
    verdict = judge(dumps, stopped)
    if culprits is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert verdict.culprits == culprits
        assert "stopped by a signal" in verdict.detail


def flight(enqueued: int, completed: int, *ops: str, group: str = "0") -> str:
    """A flight-recorder dump in torch 2.13's JSON: collectives ``ops`` recorded in ``group``,
    the last of them number ``enqueued`` (gloo records no point-to-point receives)."""
    first = enqueued - len(ops) + 1
    entries = [
        {
            "record_id": i,
            "collective_seq_id": first + i,
            "process_group": [group, "default_pg"],
            "profiling_name": op,
            "state": "scheduled",
        }
        for i, op in enumerate(ops)
    ]
    status = {
        group: {
            "last_enqueued_collective": str(enqueued),
            "last_completed_collective": str(completed),
            "last_started_collective": "-1",
        }
    }
    return json.dumps({"version": "2.10", "entries": entries, "pg_status": status})


@pytest.mark.parametrize(
    ("flights", "culprits", "detail"),
    [
        # rank 1 waits in collective 41, which rank 0 (blocked in a receive) never enqueued
        (
            {0: flight(40, 40, "gloo:all_reduce"), 1: flight(41, 40, "gloo:all_reduce")},
            (0,),
            (
                "flight recorder: rank 0 enqueued collective 40 last (gloo:all_reduce, "
                "completed); rank 1 waits in collective 41 (gloo:all_reduce) of group 0"
            ),
        ),
        (
            {0: flight(7, 6, "a"), 1: flight(5, 4, "b"), 2: flight(7, 6, "a"), 3: flight(4, 4)},
            (1, 3),
            (
                "flight recorder: rank 1 enqueued collective 5 last (b, not completed); "
                "rank 3 enqueued collective 4 last (completed); "
                "ranks 0, 2 wait in collective 7 (a) of group 0"
            ),
        ),
        # everybody in the same collective, or all done: nobody singled out
        ({0: flight(9, 8, "a"), 1: flight(9, 8, "a")}, None, None),
        ({0: flight(9, 9, "a"), 1: flight(8, 8, "a")}, None, None),
        # one dump, or dumps that are not torch's JSON
        ({0: flight(9, 8, "a")}, None, None),
        ({0: "not json", 1: "{}", 2: "[]"}, None, None),
        # a subgroup only one rank dumped is skipped; the default group decides
        (
            {0: flight(3, 2, "x", group="1"), 1: flight(3, 3, "y", group="1")},
            None,
            None,
        ),
    ],
)
def test_flight_verdict(
    flights: dict[int, str], culprits: tuple[int, ...] | None, detail: str | None
) -> None:
    """By the flight recorders, the culprits are the ranks that enqueued fewer collectives of a
    group than those waiting in the next one."""
    _check(flight_verdict(flights), culprits, detail)


def test_the_flight_recorder_names_what_the_stacks_cannot() -> None:
    """Both ranks inside torch (a receive nobody sends, an all-reduce): the stacks single nobody
    out, the flight recorders name rank 0."""
    dumps = {0: WAITING_IN_ALL_REDUCE, 1: WAITING_IN_BACKWARD}
    flights = {0: flight(40, 40, "gloo:all_reduce"), 1: flight(41, 40, "gloo:all_reduce")}
    assert judge(dumps) is None
    verdict = judge(dumps, (), flights)
    assert verdict is not None
    assert verdict.culprits == (0,)
    assert verdict.detail.startswith("flight recorder: rank 0")


def test_stacks_first_then_the_flight_recorders() -> None:
    """When both name culprits, the stacks' come first and the flight recorders' are added; the
    detail says both."""
    dumps = {0: WAITING_IN_ALL_REDUCE, 1: SLEEPING, 2: WAITING_IN_ALL_REDUCE}
    flights = {0: flight(5, 4, "a"), 1: flight(4, 4, "a"), 2: flight(4, 4, "b")}
    verdict = judge(dumps, (), flights)
    assert verdict is not None
    assert verdict.culprits == (1, 2)
    assert verdict.detail.startswith("rank 1 is not in a collective")
    assert "; flight recorder: rank 1 enqueued collective 4 last" in verdict.detail


def test_flight_status_reads_every_group() -> None:
    """Per group: last enqueued, last completed, the last enqueued collective's name."""
    text = flight(12, 11, "gloo:broadcast", "gloo:all_reduce")
    assert flight_status(text) == {"0": FlightStatus(12, 11, "gloo:all_reduce")}
    assert flight_status(flight(12, 12)) == {"0": FlightStatus(12, 12, "")}
    assert flight_status('{"pg_status": {"0": {"last_enqueued_collective": "x"}}}') == {}


def _check(verdict: Verdict | None, culprits: tuple[int, ...] | None, detail: str | None) -> None:
    """No verdict where ``culprits`` is None; else these culprits (and ``detail`` unless None)."""
    if culprits is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert verdict.culprits == culprits
        assert detail is None or verdict.detail == detail


def _entry(seq: int, name: str, state: str, *, retired: bool = False) -> dict[str, object]:
    """One collective in a flight-recorder dump (c10d's JSON, the fields read)."""
    return {
        "collective_seq_id": seq,
        "process_group": ["0", "default_pg"],
        "profiling_name": name,
        "state": state,
        "retired": retired,
    }


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # gloo records "scheduled" only; a retired one completed; a pending one runs on gloo
        (
            [
                _entry(20, "gloo:all_reduce", "scheduled", retired=True),
                _entry(21, "gloo:all_reduce", "scheduled"),
            ],
            "gloo:all_reduce (collective 21 of group 0)",
        ),
        ([_entry(20, "gloo:all_reduce", "scheduled", retired=True)], ""),
        # NCCL: a kernel the recorder saw begin is under way; one queued behind a long kernel
        # (scheduled) is not, nor a completed one
        ([_entry(9, "nccl:all_reduce", "started")], "nccl:all_reduce (collective 9 of group 0)"),
        ([_entry(9, "nccl:all_reduce", "scheduled")], ""),
        ([_entry(9, "nccl:all_reduce", "completed")], ""),
        # the oldest under way is said
        (
            [_entry(9, "nccl:all_reduce", "started"), _entry(10, "nccl:broadcast", "started")],
            "nccl:all_reduce (collective 9 of group 0)",
        ),
    ],
)
def test_under_way(entries: list[dict[str, object]], expected: str) -> None:
    """The collective a flight-recorder dump shows running and not completed."""
    assert under_way(json.dumps({"entries": entries, "pg_status": {}})) == expected


def test_a_collective_its_group_completed_is_not_under_way() -> None:
    """An entry not (yet) retired, at or below its group's last completed collective, is done."""
    entries = [_entry(20, "gloo:all_reduce", "scheduled"), _entry(21, "gloo:barrier", "scheduled")]
    status = {"0": {"last_enqueued_collective": 21, "last_completed_collective": 20}}
    text = json.dumps({"entries": entries, "pg_status": status})
    assert under_way(text) == "gloo:barrier (collective 21 of group 0)"


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"entries": 3}', '{"entries": [1, {}]}'])
def test_under_way_of_what_is_not_a_dump_is_nothing(text: str) -> None:
    """Text that is not torch's JSON (or has no usable entry) shows nothing under way."""
    assert under_way(text) == ""
