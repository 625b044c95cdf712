#!/usr/bin/env bash
# Set up (once) and run the gradient-accumulation job under rvsup, then print its history: rank 1
# is killed between two optimizer steps, rvsup restarts from the newest checkpoint with the
# gradients summed so far, and the job ends as if nothing happened (bit for bit).
#   VENV=dir  where the virtualenv lives (default .venv at the repository root)
exec bash "$(dirname "$0")/../run.sh" grad_accumulation
