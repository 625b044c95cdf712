"""Which files hold a rank's output: the index the hellos write, and the folder fallback."""

from __future__ import annotations

from pathlib import Path

from supervisor.record import rank_logs
from supervisor.record.rundir import logs_dir


def torchrun_folder(run_dir: Path, attempt: int, node: str, local: int) -> Path:
    folder = logs_dir(run_dir, attempt) / f"job-{attempt}_{node}" / "attempt_0" / str(local)
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text(f"{node} local {local}\n")
    return folder


def test_the_index_names_ranks_on_every_node(tmp_path: Path) -> None:
    """Two nodes' torchrun folders, each with local rank 0: the hellos' index says which is
    rank 2; without it neither is guessed."""
    a = torchrun_folder(tmp_path, 1, "aaaa", 0)
    b = torchrun_folder(tmp_path, 1, "bbbb", 0)
    assert rank_logs.find(tmp_path, 1) == []
    rank_logs.note(tmp_path, 1, 2, str(b / "stdout.log"), str(b / "stderr.log"))
    rank_logs.note(tmp_path, 1, 0, str(a / "stdout.log"), str(a / "stderr.log"))
    found = rank_logs.find(tmp_path, 1)
    assert [(r.rank, r.stdout.parent) for r in found] == [(0, a), (2, b)]
    assert rank_logs.attempts(tmp_path) == [1]


def test_one_node_falls_back_to_the_local_rank_folders(tmp_path: Path) -> None:
    """On one node a rank that never said hello is found by its folder, beside the indexed."""
    r0 = torchrun_folder(tmp_path, 3, "only", 0)
    r1 = torchrun_folder(tmp_path, 3, "only", 1)
    rank_logs.note(tmp_path, 3, 0, str(r0 / "stdout.log"), str(r0 / "stderr.log"))
    found = rank_logs.find(tmp_path, 3)
    assert [(r.rank, r.stdout) for r in found] == [(0, r0 / "stdout.log"), (1, r1 / "stdout.log")]
    torchrun_folder(tmp_path, 10, "only", 0)
    assert rank_logs.attempts(tmp_path) == [3, 10]
