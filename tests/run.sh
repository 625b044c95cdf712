#!/usr/bin/env bash
# Set up (once) and run every check: lint, format, dead code, types (for Python 3.11 and 3.10), the fast
# selection (no process, no Slurm) on Python 3.10 without torch (where the daemon may run: its own
# environment; test modules that need torch are skipped there), then the whole suite. Each pytest
# run has two phases (docs/development.md): the tests that can share the machine (on $RVTEST_WORKERS
# processes, pytest-xdist, where it is set above 0), and the serial ones, one at a time: beside
# the first at a higher CPU weight where cgroups can give it one (as root), else after it.
#   RVTEST_WORKERS=n  processes of the first phase (default 3, the fastest on 2 vCPUs: the phase is
#                CPU-bound and a third worker keeps both cores busy; 0: in one process)
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
# Where the environment sets PYTHONDONTWRITEBYTECODE, no process caches what it compiles: the
# project's own modules (installed editable, so never compiled by pip) and pytest's rewritten
# test modules would be compiled again by each of the thousands of processes the suite starts
# (~0.08 s of CPU for the daemon's imports alone). Let the first one write the cache. So pip
# need not compile every module it installs either (--no-compile: ~30 s of one core, most of
# it for modules no test imports); torch's and the integrations' are cached once, below.
unset PYTHONDONTWRITEBYTECODE
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
  "$VENV/bin/pip" install -q --no-compile torch==2.13.0
fi
# data: torchdata, which needs the torch above; integrations: transformers, accelerate, lightning
# (pinned to keep that torch)
"$VENV/bin/pip" install -q --no-compile -e '.[test,data,metrics,plot,integrations]'

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
# The torch-less Python 3.10 environment (made beside the static checks, below).
setup_py310() {
  if [ ! -x "$VENV310/bin/python" ]; then
    "$py310" -m venv "$VENV310"
  fi
  # no torch: the daemon never imports it; no matplotlib (the plot's tests skip here)
  "$VENV310/bin/pip" install -q --no-compile -e '.[test,metrics]'
  if "$VENV310/bin/python" -c 'import torch' 2>/dev/null; then
    echo "tests/run.sh: $VENV310 has torch; it must not (remove the directory)" >&2
    return 1
  fi
}

PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PATH

# cgroup v1 "cpu" groups for the two phases (as root, where the v1 cpu controller is mounted):
# cpu_group NAME SHARES makes one and prints its path, or nothing. The serial phase runs beside
# the first at a weight 8 times the first's, so its processes get a core whenever they want one
# and the first takes what they leave (most of the serial phase's time is waiting on a
# timeout); the first phase's own weight, 4 times a plain process's, keeps its share of the
# machine against other work about what its many processes had outside a group.
cpu_group() {
  local root=/sys/fs/cgroup/cpu group
  [ -f "$root/cpu.shares" ] && [ -w "$root" ] || return 1
  group="$root/rvtest-$1-$$"
  mkdir "$group" 2>/dev/null || return 1
  if ! echo "$2" >"$group/cpu.shares" 2>/dev/null; then
    rmdir "$group"
    return 1
  fi
  echo "$group"
}

# pytest in two phases: PYTHON, then pytest's arguments (both phases get them). A phase that
# selects nothing (exit 5: e.g. a folder with no serial test) is no failure when the other ran
# tests. Both phases run; the first failure's status is returned. RVTEST_SHARED_DIR: where the
# reference runs both phases read are built once (tests/helpers/fixtures.py, built_once).
# Where cpu_group makes the groups, the serial phase runs beside the first (its output is
# printed once both have ended); else after it.
two_phases() {
  local python=$1 shared=0 serial=0 status group="" serial_group="" shared_pid serial_log
  shift
  RVTEST_SHARED_DIR=$(mktemp -d)
  export RVTEST_SHARED_DIR
  local first=("$python" -m pytest -p no:cacheprovider -n "${RVTEST_WORKERS:-3}" --dist loadgroup
    --phase shared "$@")
  local second=("$python" -m pytest -p no:cacheprovider --phase serial "$@")
  if group=$(cpu_group first 4096) && serial_group=$(cpu_group serial 32768); then
    serial_log=$(mktemp)
    (echo "$BASHPID" >"$group/cgroup.procs" && exec "${first[@]}") &
    shared_pid=$!
    trap 'kill -TERM "$shared_pid" 2>/dev/null; exit 130' INT TERM
    (echo "$BASHPID" >"$serial_group/cgroup.procs" && exec "${second[@]}") >"$serial_log" 2>&1 ||
      serial=$?
    wait "$shared_pid" || shared=$?
    trap - INT TERM
    echo "tests/run.sh: the serial phase, run beside the first at 8 times its CPU weight:"
    cat "$serial_log"
    rm -f "$serial_log"
    rmdir "$group" "$serial_group" 2>/dev/null || true
  else
    if [ -n "$group" ]; then
      rmdir "$group" 2>/dev/null || true
    fi
    "${first[@]}" || shared=$?
    if [ "$shared" != 2 ]; then # 2: interrupted (Ctrl-C, or errors while collecting)
      "${second[@]}" || serial=$?
    fi
  fi
  rm -rf "$RVTEST_SHARED_DIR"
  unset RVTEST_SHARED_DIR
  if [ "$shared" = 5 ] && [ "$serial" = 5 ]; then
    return 5
  fi
  for status in "$shared" "$serial"; do
    if [ "$status" != 0 ] && [ "$status" != 5 ]; then
      return "$status"
    fi
  done
  return 0
}

# The static checks side by side (mypy keeps a cache per Python version: the two runs do not
# meet), with the Python 3.10 environment made meanwhile; each one's output is printed once all
# have ended, in this order, and any failure ends the script.
logs=$(mktemp -d)
declare -A pid_of=()
order=()
beside() { # NAME COMMAND...
  local name=$1
  shift
  "$@" >"$logs/${#order[@]}" 2>&1 &
  pid_of[$name]=$!
  order+=("$name")
}
beside "ruff check" ruff check .
beside "ruff format" ruff format --check .
beside vulture vulture # dead code ([tool.vulture] in pyproject.toml)
# the bytecode of what the jobs import, cached once before the tests' processes all need it
beside "the imports' bytecode" python -c "import torch.distributed.run, transformers, lightning"
beside "mypy" mypy
beside "mypy --python-version 3.10" mypy --python-version 3.10
if [ -n "$py310" ]; then
  beside "the Python 3.10 environment ($VENV310)" setup_py310
fi
failed=()
for i in "${!order[@]}"; do
  name=${order[$i]}
  status=0
  wait "${pid_of[$name]}" || status=$?
  cat "$logs/$i"
  if [ "$status" != 0 ]; then
    failed+=("$name (exit $status)")
  fi
done
rm -rf "$logs"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'tests/run.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
if [ -n "$py310" ]; then
  echo "tests/run.sh: the fast selection on $("$VENV310/bin/python" -V) without torch ($VENV310)"
  two_phases "$VENV310/bin/python" -q -m "not process and not slurm"
  # the process tests run the daemon from this environment too (test_isolated_install.py)
  RVSUP_TORCHLESS_PYTHON="$(cd "$VENV310/bin" && pwd)/python"
  export RVSUP_TORCHLESS_PYTHON
else
  echo "tests/run.sh: SKIPPED the fast selection on Python 3.10 without torch:" \
    "no python3.10 on PATH or in pyenv" >&2
fi
two_phases python -q --durations=25 "$@"
