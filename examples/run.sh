#!/usr/bin/env bash
# Set up (once) and run an example job under rvsup, then print its history.
#   bash examples/run.sh ddp_toy | epoch_ddp | grad_accumulation
#   VENV=dir  where the virtualenv lives (default .venv at the repository root)
set -euo pipefail
example=${1:?usage: examples/run.sh EXAMPLE (a folder of examples/)}
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0   # first and pinned: the CPU build
fi
"$VENV/bin/pip" install -q -e . numpy   # numpy: torch warns at import without it
export PATH="$(cd "$VENV/bin" && pwd):$PATH"   # `python` in job.toml is the venv's
rvsup validate "examples/$example/job.toml" >/dev/null
rc=0
rvsup start "examples/$example/job.toml" || rc=$?
rvsup history "examples/$example/job.toml"
exit $rc
