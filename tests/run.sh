#!/usr/bin/env bash
# Set up (once) and run every check: lint, format, types (for Python 3.11 and 3.10), the fast
# selection (no process, no Slurm) on Python 3.10 without torch (where the daemon may run: its own
# environment; test modules that need torch are skipped there), then the whole suite.
#   VENV=dir     where the virtualenv lives (default .venv; CI passes a fresh one)
#   VENV310=dir  where the torch-less Python 3.10 one lives (default $VENV/py310); built with the
#                first Python 3.10 found (python3.10 on PATH, else pyenv's); when there is none,
#                that step is skipped, and says so
# As root it installs the system packages the suite needs (systemd-analyze, Slurm, munge,
# Prometheus: the metrics test scrapes a live job with it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VENV310=${VENV310:-$VENV/py310}
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$(id -u)" = 0 ]; then
  need=()
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v slurmctld >/dev/null || need+=(slurm-wlm)
  command -v munged >/dev/null || need+=(munge)
  command -v ip >/dev/null || need+=(iproute2)
  command -v prometheus >/dev/null || need+=(prometheus)
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
"$VENV/bin/pip" install -q -e '.[test,data,metrics,plot]' # data: torchdata, which needs the torch above

# A Python 3.10 interpreter (the oldest rvsup supports), or nothing.
python310() {
  local root candidate
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in "$(command -v python3.10 || true)" "$root"/versions/3.10*/bin/python3.10; do
    if [ -x "$candidate" ] &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
py310=$(python310) || py310=""
if [ -n "$py310" ]; then
  if [ ! -x "$VENV310/bin/python" ]; then
    "$py310" -m venv "$VENV310"
  fi
  # no torch: the daemon never imports it; prometheus-client (pure Python) for the daemon's
  # metrics; no matplotlib (the plot's tests skip here)
  "$VENV310/bin/pip" install -q -e '.[test,metrics]'
  if "$VENV310/bin/python" -c 'import torch' 2>/dev/null; then
    echo "tests/run.sh: $VENV310 has torch; it must not (remove the directory)" >&2
    exit 1
  fi
fi

PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH
ruff check .
ruff format --check .
mypy
mypy --python-version 3.10
if [ -n "$py310" ]; then
  echo "tests/run.sh: the fast selection on $("$VENV310/bin/python" -V) without torch ($VENV310)"
  "$VENV310/bin/python" -m pytest -q -p no:cacheprovider -m "not process and not slurm"
  # the process tests run the daemon from this environment too (test_isolated_install.py)
  RVSUP_TORCHLESS_PYTHON="$(cd "$VENV310/bin" && pwd)/python"
  export RVSUP_TORCHLESS_PYTHON
else
  echo "tests/run.sh: SKIPPED the fast selection on Python 3.10 without torch:" \
    "no python3.10 on PATH or in pyenv" >&2
fi
python -m pytest -q -p no:cacheprovider --durations=25 "$@"
