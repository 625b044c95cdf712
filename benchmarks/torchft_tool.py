"""The torchft column: two replica groups of one rank, each under its own restarting torchrun.

What one launch runs (a bash script, the launch's root process):

- torchft's lighthouse, ``torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100
  --join_timeout_ms 10000`` (the README's command; heartbeat timeout as shipped, 5 s), on a free
  port of localhost;
- per replica group g (0 and 1), ``torchrun --standalone --nproc-per-node=1 --max-restarts=K
  benchmarks/torchft_worker.py`` with ``REPLICA_GROUP_ID=g``: torchft's examples restart a replica
  group this way; with ``TORCHFT_LIGHTHOUSE`` pointing at the lighthouse. torchrun as shipped:
  the Manager connects to the store torchrun's agent hosts at ``MASTER_PORT``, which
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the other columns' "workaround") would leave to
  the rank's ``init_process_group``, which torchft does not call;
- the script waits for both torchruns, stops the lighthouse, and exits 0 only if both did.

Everything the three write goes to the launch's ``launcher.log``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from . import records
from .tools import WORLD, Spec, Tool, _lines

WORKER = Path(__file__).resolve().parent / "torchft_worker.py"
LIGHTHOUSE_ARGS = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000")


def free_port() -> int:
    """A TCP port of localhost that nothing listens on now (the lighthouse binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SCRIPT = """\
"$BENCH_LIGHTHOUSE" {lighthouse_args} --bind "127.0.0.1:$BENCH_LIGHTHOUSE_PORT" &
lighthouse=$!
pids=()
for g in $(seq 0 {last}); do
  REPLICA_GROUP_ID=$g "$BENCH_TORCHRUN" --standalone --nproc-per-node=1 \\
    --max-restarts={restarts} "$BENCH_WORKER" &
  pids+=($!)
done
rc=0
for p in "${{pids[@]}}"; do wait "$p" || rc=1; done
kill "$lighthouse" 2>/dev/null
wait "$lighthouse" 2>/dev/null
exit $rc
"""


@dataclass
class TorchFT(Tool):
    """torchft 0.2: a lighthouse and one restarting torchrun per replica group (module doc)."""

    name: str = "torchft"
    venv: str | None = None

    def _bin(self, name: str) -> Path | None:
        return None if self.venv is None else Path(self.venv) / "bin" / name

    def unavailable(self) -> str | None:
        lighthouse = self._bin("torchft_lighthouse")
        if lighthouse is None:
            return "n/a (torchft not installed; see README)"
        if not lighthouse.exists():
            return f"n/a (no torchft_lighthouse in {self.venv})"
        return None

    def command(self, spec: Spec, workdir: Path) -> tuple[list[str], dict[str, str]]:
        lighthouse, torchrun = self._bin("torchft_lighthouse"), self._bin("torchrun")
        assert lighthouse is not None
        assert torchrun is not None
        script = SCRIPT.format(
            lighthouse_args=" ".join(LIGHTHOUSE_ARGS), last=WORLD - 1, restarts=spec.max_restarts
        )
        port = free_port()
        env = {
            "BENCH_MODE": "torchft",
            "BENCH_LIGHTHOUSE": str(lighthouse),
            "BENCH_LIGHTHOUSE_PORT": str(port),
            "BENCH_TORCHRUN": str(torchrun),
            "BENCH_WORKER": str(WORKER),
            "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}",
        }
        return ["bash", "-c", script], env

    def noticed(self, workdir: Path) -> list[float]:
        """The restarting torchrun's notice of its dead worker (the surviving group's Manager
        notices only through a failed all-reduce and the lighthouse's heartbeat timeout)."""
        log = workdir / "launcher.log"
        year = time.localtime(log.stat().st_mtime).tm_year if log.exists() else 1970
        return records.torch_log_noticed(_lines(log), year)

    def describe(self) -> str:
        return (
            f"{self.name}: lighthouse {' '.join(LIGHTHOUSE_ARGS)}, "
            f"{WORLD} replica groups of 1 rank, torchrun --max-restarts=K each"
        )
