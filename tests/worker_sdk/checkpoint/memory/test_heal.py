"""The restore's heal on several nodes (worker_sdk.checkpoint.memory.nodes.heal), two real
processes standing for two nodes (gloo, their own folders and receivers): a node without the
chosen snapshot gets it from the other before anyone loads; a copy refused leaves both nodes to
storage; with none anywhere, nothing happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.contract import layout

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[4]
WORKER = REPO / "tests" / "helpers" / "heal_worker.py"
KEY = "k" * 32


def _snapshots(folder: Path, *steps: int) -> None:
    model = torch.nn.Linear(4, 3)
    ck = Checkpointer(folder, rank=0, world_size=1, attempt_tag="a1", keep_last=5)
    for step in steps:
        ck.save(step, [model], None)


def _heal(tmp_path: Path, highest: int, keys: tuple[str, str] = (KEY, KEY)) -> list[dict[str, Any]]:
    """Both nodes' answers, node0's first."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(store),
                str(rank),
                "2",
                str(tmp_path),
                keys[rank],
                "0",
                str(highest),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    answers = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            answers.append(json.loads(out.splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return answers


def test_a_node_without_the_snapshot_gets_it_before_anyone_loads(tmp_path: Path) -> None:
    """node1 (a spare) holds nothing: node0 sends it the newest snapshot within the bounds, the
    same bytes, committed; both load that step, which is said to come from a replica."""
    _snapshots(tmp_path / "node0", 5, 7, 9)
    node0, node1 = _heal(tmp_path, highest=7)
    assert node0 == {"step": 7, "healed": True, "steps": [9, 7, 5]}
    assert node1 == {"step": 7, "healed": True, "steps": [7]}
    sent, got = (tmp_path / n / layout.committed_name(7) for n in ("node0", "node1"))
    for path in sorted(sent.rglob("*")):
        if path.is_file():
            assert (got / path.relative_to(sent)).read_bytes() == path.read_bytes()


def test_nodes_that_both_hold_it_send_nothing(tmp_path: Path) -> None:
    """Every node has the chosen snapshot: nobody is healed ("memory", not "replica")."""
    _snapshots(tmp_path / "node0", 5)
    _snapshots(tmp_path / "node1", 5)
    assert [a["healed"] for a in _heal(tmp_path, highest=5)] == [False, False]


def test_a_copy_the_receiver_refuses_leaves_every_node_to_storage(tmp_path: Path) -> None:
    """node1 checks copies with another key: the copy is refused, nothing is committed there,
    and both nodes give up the snapshot together (storage is loaded instead)."""
    _snapshots(tmp_path / "node0", 5)
    node0, node1 = _heal(tmp_path, highest=5, keys=(KEY, "x" * 32))
    assert (node0["step"], node1["step"]) == (-1, -1)
    assert node1["steps"] == []


def test_with_no_snapshot_anywhere_nothing_is_sent(tmp_path: Path) -> None:
    """Snapshots exist only outside the bounds (newer than the one named): none is used."""
    _snapshots(tmp_path / "node0", 9)
    assert [(a["step"], a["healed"]) for a in _heal(tmp_path, highest=7)] == [(-1, False)] * 2
