"""The hang rule's judge of a silent group: stuck (a hang) or busy (a rank works), from tables."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.rules.culprits import Frame
from supervisor.rules.stuck import (
    Activity,
    Busy,
    RankEvidence,
    Stuck,
    ThreadState,
    activity,
    judge_silence,
)
from worker_sdk.contract import threads

ALL_REDUCE = (
    Frame("/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
    Frame("/job/train.py", 60, "main"),
)
BACKWARD = (
    Frame("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 829, "_engine_run"),
    Frame("/job/train.py", 58, "main"),
)
EVAL = (
    Frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"),
    Frame("/job/train.py", 90, "evaluate"),
    Frame("/job/train.py", 120, "main"),
)
HOOK = (Frame("/job/train.py", 40, "log_hook"), Frame("/job/train.py", 121, "main"))
LOADER = (
    Frame("/usr/lib/python3.11/threading.py", 331, "wait"),
    Frame("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1131, "_get"),
    Frame("/job/train.py", 50, "main"),
)

FUTURE = (  # waiting on a thread's future: ThreadPoolExecutor(...).submit(...).result()
    Frame("/usr/lib/python3.11/threading.py", 327, "wait"),
    Frame("/usr/lib/python3.11/concurrent/futures/_base.py", 451, "result"),
    Frame("/job/train.py", 92, "main"),
)
QUEUE = (  # waiting on a queue.Queue a thread feeds
    Frame("/usr/lib/python3.11/threading.py", 327, "wait"),
    Frame("/usr/lib/python3.11/queue.py", 171, "get"),
    Frame("/job/train.py", 93, "main"),
)
JOIN = (Frame("/usr/lib/python3.11/threading.py", 1132, "_wait_for_tstate_lock"), *HOOK)
# the threads every rank has: libraries' (gloo, torch, ZeroMQ) and rvsup's, named by them
INFRA = (
    ThreadState("gloo_tcp_loop", "S", "do_epoll_wait"),
    ThreadState("pt_gloo_runloop", "S", "futex_do_wait"),
    ThreadState("ZMQbg/IO/0", "S", "do_epoll_wait"),
    ThreadState(threads.PREFIX + "flight", "S", "wait_for_partner"),
    ThreadState("cuda-EvtHandlr", "S", "do_sys_poll"),
)
SLEEPING = ThreadState("python", "S", "hrtimer_nanosleep")  # the user's thread: time.sleep
READING = ThreadState("python", "S", "sk_wait_data")  # an upload's socket
WRITING = ThreadState("python", "D", "nfs_wait_bit_killable")  # a checkpoint's write
RUNNING = ThreadState("python", "R", "")
BLOCKED = ThreadState("python", "S", "futex_do_wait")  # itself waiting on a lock


def ev(
    rank: int,
    state: str = "S",
    cpu: float = 0.0,
    wchan: str = "",
    frames: tuple[Frame, ...] = (),
    others: tuple[ThreadState, ...] = INFRA,
) -> RankEvidence:
    return RankEvidence(
        rank,
        state=state,
        cpu_s=cpu,
        window_s=1.0,
        wchan=wchan,
        frames=tuple(frames),
        stack_read=True,
        threads=others,
    )


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (ev(0, "R", 0.9, "", EVAL), Activity.WORKING),
        (ev(0, "S", 0.06, "futex_do_wait", EVAL), Activity.WORKING),  # 6 % of a core
        (ev(0, "D", 0.4, "", EVAL), Activity.WORKING),  # writing: D between bursts of CPU
        (ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), Activity.COLLECTIVE),
        (ev(0, "R", 1.0, "", ALL_REDUCE), Activity.COLLECTIVE),  # NCCL spins while it waits
        (ev(0, "S", 0.0, "futex_do_wait", BACKWARD), Activity.COLLECTIVE),
        (ev(0, "T", 0.0, "do_signal_stop", HOOK), Activity.STOPPED),
        (ev(0, "T", 0.0, "", ()), Activity.STOPPED),
        (ev(0, "t", 0.0, "hrtimer_nanosleep", HOOK), Activity.OWN_WAIT),  # py-spy reading it
        (ev(0, "D", 0.0, "nfs_wait_bit_killable", HOOK), Activity.STORAGE),  # a slow write
        (ev(0, "S", 0.0, "futex_do_wait", HOOK), Activity.LOCKED),  # a deadlock
        (ev(0, "S", 0.01, "futex_wait_queue", HOOK), Activity.LOCKED),  # under 5 %: no work
        (ev(0, "S", 0.0, "hrtimer_nanosleep", HOOK), Activity.OWN_WAIT),  # time.sleep
        (ev(0, "S", 0.0, "do_select", HOOK), Activity.OWN_WAIT),  # time.sleep on 3.10
        (ev(0, "S", 0.0, "futex_do_wait", LOADER), Activity.OWN_WAIT),  # waits for its data
        (ev(0, "S", 0.0, "futex_do_wait", ()), Activity.LOCKED),
        # the main thread waits on a thread of its own: busy while that thread is alive
        (ev(0, "S", 0.0, "futex_do_wait", FUTURE, (*INFRA, SLEEPING)), Activity.THREAD_WAIT),
        (ev(0, "S", 0.0, "futex_do_wait", QUEUE, (READING,)), Activity.THREAD_WAIT),
        (ev(0, "S", 0.0, "futex_do_wait", FUTURE, (WRITING,)), Activity.THREAD_WAIT),
        (ev(0, "S", 0.0, "futex_do_wait", JOIN, (BLOCKED, RUNNING)), Activity.THREAD_WAIT),
        # ... and locked when every thread of its own is blocked on a lock too (a deadlock)
        (ev(0, "S", 0.0, "futex_do_wait", FUTURE, (*INFRA, BLOCKED)), Activity.LOCKED),
        # ... or only the libraries' and rvsup's threads are alive
        (ev(0, "S", 0.0, "futex_do_wait", QUEUE, INFRA), Activity.LOCKED),
        # a bare Lock.acquire() shows no wait on another thread: locked, whatever else runs
        (ev(0, "S", 0.0, "futex_do_wait", HOOK, (SLEEPING,)), Activity.LOCKED),
        (ev(0, "S", 0.0, "futex_do_wait", (), (SLEEPING,)), Activity.LOCKED),
        (ev(0, "S", 0.0, "ep_poll", ()), Activity.SILENT),  # no stack: stuck outside Python
        (ev(0, "R", 0.8, "", ()), Activity.WORKING),  # no stack, but native code runs
        (RankEvidence(0), Activity.UNKNOWN),  # another node
        (RankEvidence(0, state="S", cpu_s=0.0, window_s=1.0), Activity.OWN_WAIT),  # not asked
    ],
)
def test_activity_of_one_rank(evidence: RankEvidence, expected: Activity) -> None:
    """Each row: one rank's state, CPU over a 1 s window, wait channel and stack -> activity."""
    assert activity(evidence) is expected


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        # rank 0 evaluates alone; rank 1 waits for it in the next all-reduce: busy
        ([ev(0, "R", 0.95, "", EVAL), ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE)], Busy),
        # a blocking sleep in a logging hook on rank 1: busy (its own wait)
        ([ev(0, "S", 0.0, "futex_do_wait", BACKWARD), ev(1, "S", 0.0, "do_nanosleep", HOOK)], Busy),
        # every rank evaluates: busy
        ([ev(0, "R", 0.9, "", EVAL), ev(1, "R", 0.9, "", EVAL)], Busy),
        # a gloo/NCCL hang: every rank in a collective, nothing else runs
        (
            [
                ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE),
                ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE),
            ],
            Stuck,
        ),
        # NCCL ranks spinning inside the collective are still stuck
        ([ev(0, "R", 1.0, "", ALL_REDUCE), ev(1, "R", 1.0, "", ALL_REDUCE)], Stuck),
        # SIGSTOP of rank 1 while rank 0 waits
        ([ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(1, "T", 0.0, "", ())], Stuck),
        # a deadlock on a lock
        (
            [ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(1, "S", 0.0, "futex_do_wait", HOOK)],
            Stuck,
        ),
        # rank 1 writes to slow storage (state D, no CPU): busy, bounded by hang_timeout_idle
        ([ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(1, "D", 0.0, "nfs_wait", HOOK)], Busy),
        # rank 0 waits 12 s on an upload thread's future, rank 1 in the all-reduce: busy
        (
            [
                ev(0, "S", 0.0, "futex_do_wait", FUTURE, (*INFRA, SLEEPING)),
                ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE),
            ],
            Busy,
        ),
        # the same wait, but the thread is itself blocked on a lock: a deadlock
        (
            [
                ev(0, "S", 0.0, "futex_do_wait", FUTURE, (*INFRA, BLOCKED)),
                ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE),
            ],
            Stuck,
        ),
        # one rank works but another is stopped: the stopped one decides
        ([ev(0, "R", 0.9, "", EVAL), ev(1, "T", 0.0, "", ())], Stuck),
        # nothing observed (every rank on another node): as before, a hang
        ([RankEvidence(0), RankEvidence(1)], Stuck),
        ([], Stuck),
        # a local rank works, the other node's rank is unknown: busy
        ([ev(0, "R", 0.9, "", EVAL), RankEvidence(1)], Busy),
    ],
)
def test_judge_silence(evidence: list[RankEvidence], expected: type) -> None:
    """Each row: the silent group's evidence -> Busy (not a hang yet) or Stuck (a hang)."""
    assert type(judge_silence(evidence)) is expected


SPINNING = (Frame("train.py", 77, "train"),)  # the host spins on the user's line (.item())
RECORDED = "nccl:all_reduce (collective 21 of group 0)"


def test_a_rank_whose_flight_recorder_shows_a_collective_under_way_waits_in_it() -> None:
    """A rank using a full core at the user's line (CUDA's wait spins) while its flight recorder
    shows a collective under way waits in it: not working."""
    spinning = dataclasses.replace(ev(0, "R", 1.0, "", SPINNING), collective=RECORDED)
    assert activity(spinning) is Activity.COLLECTIVE
    assert activity(ev(0, "R", 1.0, "", SPINNING)) is Activity.WORKING


def test_ranks_spinning_in_collectives_under_way_are_stuck() -> None:
    """Every rank spins behind a collective under way: nothing else runs, a hang, said with the
    recorder's collective; one rank working outside any collective keeps the group busy."""
    spin = [dataclasses.replace(ev(r, "R", 1.0, "", SPINNING), collective=RECORDED) for r in (0, 1)]
    verdict = judge_silence(spin)
    assert isinstance(verdict, Stuck)
    assert verdict.detail == (
        "ranks 0, 1 wait in collectives and nothing else runs; flight recorder: rank 0 at "
        f"train.py:77 in train: {RECORDED} under way, rank 1 at train.py:77 in train: "
        f"{RECORDED} under way"
    )
    assert isinstance(judge_silence([spin[0], ev(1, "R", 0.9, "", EVAL)]), Busy)


def test_busy_names_the_working_rank_and_where_it_is() -> None:
    """The verdict names the rank outside collectives, where it is in the user's code, and who
    waits for it."""
    verdict = judge_silence(
        [ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(0, "R", 0.9, "", EVAL)]
    )
    assert isinstance(verdict, Busy)
    assert verdict.ranks == (0,)
    assert verdict.where == "train.py:90 in evaluate"
    assert verdict.detail == "rank 0 is working (train.py:90 in evaluate); rank 1 waits for it"


def test_stuck_names_the_stuck_rank() -> None:
    """A deadlocked rank is named with where its main thread is."""
    verdict = judge_silence(
        [ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(1, "S", 0.0, "futex_do_wait", HOOK)]
    )
    assert verdict == Stuck((1,), "rank 1 is blocked on a lock (train.py:40 in log_hook)")


@pytest.mark.parametrize(
    ("evidence", "working"),
    [
        # a sleep in a hook, a read from the data loader: waits of their own, no CPU
        (
            [ev(0, "S", 0.0, "futex_do_wait", ALL_REDUCE), ev(1, "S", 0.0, "do_nanosleep", HOOK)],
            False,
        ),
        ([ev(0, "S", 0.0, "futex_do_wait", LOADER)], False),
        # a wait on its own thread, a write to slow storage: no CPU either
        ([ev(0, "S", 0.0, "futex_do_wait", FUTURE, (SLEEPING,))], False),
        ([ev(0, "D", 0.0, "nfs_wait_bit_killable", HOOK)], False),
        # one rank waits on its own while another works: the group works
        ([ev(0, "R", 0.9, "", EVAL), ev(1, "S", 0.0, "do_nanosleep", HOOK)], True),
        ([ev(0, "R", 0.9, "", EVAL), ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE)], True),
    ],
    ids=["hook-sleep", "data-loader", "thread", "storage", "one-works", "evaluation"],
)
def test_busy_says_whether_a_rank_works(evidence: list[RankEvidence], working: bool) -> None:
    """A busy verdict says whether some rank used CPU, or every busy rank only waits on its own
    (the idle bound, hang_timeout_idle, applies then)."""
    verdict = judge_silence(evidence)
    assert isinstance(verdict, Busy) and verdict.working is working


def test_a_wait_on_its_own_thread_is_named_with_where_it_waits() -> None:
    """The verdict for a rank waiting on a thread of its own says so, at the user's line."""
    verdict = judge_silence(
        [
            ev(0, "S", 0.0, "futex_do_wait", FUTURE, (*INFRA, SLEEPING)),
            ev(1, "S", 0.0, "futex_do_wait", ALL_REDUCE),
        ]
    )
    assert verdict == Busy(
        (0,),
        "train.py:92 in main",
        "rank 0 is waiting on a thread of its own (train.py:92 in main); rank 1 waits for it",
        working=False,
    )


@pytest.mark.parametrize(
    ("name", "libraries"),
    [
        (threads.PREFIX + "replica", True),
        ("gloo_tcp_loop", True),
        ("pt_nccl_watchdg", True),
        ("ZMQbg/Reaper", True),
        ("python", False),  # an unnamed thread: the process's name
        ("uploader", False),  # a thread the user named
    ],
)
def test_which_threads_libraries_started(name: str, libraries: bool) -> None:
    """Each row: a thread's kernel name -> whether a library (or rvsup) started it."""
    assert ThreadState(name, "S", "").libraries is libraries
