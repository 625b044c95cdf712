#!/usr/bin/env bash
# Set up (once) and run the toy DDP job under rvsup, then print its history: rank 1 is killed
# mid-run, rvsup restarts from the newest checkpoint, and the job ends as if nothing happened.
#   VENV=dir  where the virtualenv lives (default .venv at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0   # first and pinned: the CPU build
fi
"$VENV/bin/pip" install -q -e . numpy   # numpy: torch warns at import without it
export PATH="$(cd "$VENV/bin" && pwd):$PATH"   # `python` in job.toml is the venv's
rvsup validate examples/ddp_toy/job.toml >/dev/null
rc=0
rvsup start examples/ddp_toy/job.toml || rc=$?
rvsup history examples/ddp_toy/job.toml
exit $rc
