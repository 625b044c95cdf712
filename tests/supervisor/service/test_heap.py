"""The daemon's garbage collection (supervisor/service/heap.py), set in a fresh interpreter: the
setting is process-wide, so the suite's own process is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

from supervisor.service.heap import YOUNG_OBJECTS

_PROBE = """
import gc, json
from supervisor.service import heap
before = gc.get_threshold()
garbage = []
garbage.append(garbage)  # a cycle left by start-up
del garbage
heap.settle()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def test_settle_freezes_what_start_up_made_and_collects_the_young_less_often() -> None:
    """After :func:`settle`, what exists (modules, configuration) is out of the collector's
    sight, the young generation is collected every YOUNG_OBJECTS allocations, the older ones at
    the interpreter's ratios; the garbage of start-up is collected first, not frozen."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert seen["after"] == [YOUNG_OBJECTS, *seen["before"][1:]]
    assert seen["frozen"] > 1000  # the imported modules' objects
    assert seen["tracked"] < seen["frozen"] / 10  # nearly nothing left to walk
