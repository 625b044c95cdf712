#!/bin/bash
# Stop everything up.sh started and leave nothing running: every process inside the node namespaces
# (slurmd, slurmstepd, job tasks) gets SIGTERM, then SIGKILL; slurmctld and the private munged are
# stopped by their PID files; the namespaces, the bridge and the /etc/hosts lines are removed.
# Safe to run any number of times, also when up.sh failed half-way. Settings: SLURM_CI_DIR as in up.sh.
B=${SLURM_CI_DIR:-/tmp/rvsup-slurm}
BR=rvsbr0; MARK="# rvsup-slurm-test"

# alive PID: the process exists and is not a zombie waiting for its parent to reap it
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }
# wait_gone PID...: up to 5 s for the processes to exit; prints those still alive
wait_gone() {
  local left=("$@") next p
  for _ in $(seq 1 50); do
    next=()
    for p in "${left[@]}"; do alive "$p" && next+=("$p"); done
    left=("${next[@]}")
    [ ${#left[@]} = 0 ] && return 0
    sleep 0.1
  done
  echo "${left[@]}"
}
# stop_pids PID...: SIGTERM, up to 5 s, then SIGKILL, then wait for them to disappear
stop_pids() {
  [ $# = 0 ] && return 0
  kill -TERM "$@" 2>/dev/null
  local left
  left=$(wait_gone "$@")
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
    # shellcheck disable=SC2086
    wait_gone $left >/dev/null
  fi
  return 0
}
stop_pidfile() {
  local f=$1 p
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  # only stop it when it still is one of ours (PIDs are reused)
  if [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' < "/proc/$p/cmdline" | grep -q "$2"; then
    stop_pids "$p"
  fi
  rm -f "$f"
}

# 1. every process in a node namespace belongs to the cluster: slurmd, slurmstepd and job tasks
namespaces=$(ip netns list 2>/dev/null | awk '/^rvsns[0-9]+/{print $1}')
pids=""
for ns in $namespaces; do pids="$pids $(ip netns pids "$ns" 2>/dev/null)"; done
# shellcheck disable=SC2086
stop_pids $pids
for f in "$B"/run/slurmd_*.pid; do [ -e "$f" ] && rm -f "$f"; done

# 2. the controller and the private munged
stop_pidfile "$B/run/slurmctld.pid" slurmctld
stop_pidfile "$B/munge/munged.pid" munged

# 3. network and host names
for ns in $namespaces; do ip netns del "$ns"; done
for link in $(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^rvsv[0-9]+(@|$)/{sub(/@.*/, "", $2); print $2}'); do
  ip link del "$link" 2>/dev/null
done
ip link del $BR 2>/dev/null
if grep -q "$MARK\$" /etc/hosts; then
  # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace the file
  kept=$(grep -v "$MARK\$" /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
fi
true
