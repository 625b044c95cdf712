#!/usr/bin/env bash
# Set up (once) and run the epoch-loop DDP job under rvsup, then print its history: rank 1 is
# killed mid-epoch, rvsup restarts from the newest checkpoint, and the job ends as if nothing
# happened (the same final weights, bit for bit).
#   VENV=dir  where the virtualenv lives (default .venv at the repository root)
exec bash "$(dirname "$0")/../run.sh" epoch_ddp
