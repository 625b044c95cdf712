"""A torchrun that has already paid for its imports, waiting for its command line.

Importing ``torch.distributed.run`` takes seconds; a restart that starts a fresh torchrun pays
for it again before the first rank even starts. So while an attempt runs, the supervisor keeps
one of these ready (started as ``python -m worker_sdk.spawn.bootstrap python -c ... standby.py``,
so the parent-death signal is armed first; or forked from the node's zygote, which imported
torchrun already: ``python -m worker_sdk.spawn.bootstrap --zygote NAME python .../spawn/standby.py``).
At the next single-node attempt it writes one JSON line to its standard input::

    {"args": [torchrun's arguments], "env": {the attempt's environment}, "cwd": "..."}

and this process becomes that attempt's torchrun: the same environment, working directory and
arguments as a fresh one, the same exit status. Standard input closed without a line: the job
ended without needing it; exit 0.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    """Import torchrun, wait for the order, run it."""
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and sys.path[0] and os.path.abspath(sys.path[0]) == here:
        del sys.path[0]  # run as a script (forked from the zygote): as torchrun's own sys.path
    import torch.distributed.run as torchrun  # the point of this process: import before needed

    line = sys.stdin.readline()
    if not line:
        return 0
    order = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)  # as a fresh launcher's: the ranks inherit it
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    sys.argv = ["torchrun", *order["args"]]
    torchrun.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
