#!/usr/bin/env bash
# Set up (once) and run the toy DDP job under rvsup, then print its history: rank 1 is killed
# mid-run, rvsup restarts from the newest checkpoint, and the job ends as if nothing happened.
#   VENV=dir  where the virtualenv lives (default .venv at the repository root)
exec bash "$(dirname "$0")/../run.sh" ddp_toy
