"""A hang's culprits from the ranks' faulthandler dumps: the ranks not waiting in a collective."""

from __future__ import annotations

import pytest

from supervisor.rules.culprits import Frame, collective_of, judge, main_thread, where

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
    verdict = judge(dumps)
    if culprits is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert verdict.culprits == culprits
        assert detail is None or verdict.detail == detail


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
