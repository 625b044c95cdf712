#!/usr/bin/env bash
# Set up (once) and run every check: lint, format, types, then the whole test suite.
#   VENV=dir  where the virtualenv lives (default .venv; CI passes a fresh one)
# As root it installs the system packages the suite needs (systemd-analyze, Slurm, munge).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$(id -u)" = 0 ]; then
  need=()
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v slurmctld >/dev/null || need+=(slurm-wlm)
  command -v munged >/dev/null || need+=(munge)
  command -v ip >/dev/null || need+=(iproute2)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  # torch first and pinned: the CPU build this machine has (anything else pulls CUDA wheels)
  "$VENV/bin/pip" install -q torch==2.13.0
fi
"$VENV/bin/pip" install -q -e '.[test]'
PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH
ruff check .
ruff format --check .
mypy
python -m pytest -q -p no:cacheprovider "$@"
