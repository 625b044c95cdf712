#!/bin/bash
# Bring up a throw-away Slurm cluster (Debian 12: slurm-wlm 22.05) for the test suite. Needs root.
#
# Every node is a network + UTS (+ mount) namespace with its own hostname (node1..N) and address
# ($SUBNET.11..), like separate machines; slurmctld listens on the bridge address $SUBNET.1.
# The cluster has its own munged (own key and socket under $SLURM_CI_DIR), so it neither needs nor
# disturbs a system-wide munge. Running this script again first tears down what a previous run left
# (it calls down.sh), so it can be used any number of times in one CI run.
#
# Settings (environment):
#   SLURM_CI_DIR   state, logs, configuration             (/tmp/rvsup-slurm; the munge user must
#                  be able to reach it: not below a 0700 directory)
#   NNODES         number of nodes                        (2)
#   NODE_CPUS      CPUs per node                          (4)
#   NODE_GPUS      GPUs per node, bookkeeping only: no devices behind them (2; 0 for none)
#   KILLWAIT       seconds between SIGTERM and SIGKILL    (5)
#   CRED_EXPIRE    munge credential lifetime, seconds     (5; lets a requeued job restart quickly)
#   SUBNET         first three octets of the node network (10.200.0)
#   CTLD_PORT / SLURMD_PORT                               (6817 / 6818)
# The last line printed is `export SLURM_CONF=...`; Slurm clients need that variable.
set -euo pipefail
B=${SLURM_CI_DIR:-/tmp/rvsup-slurm}
N=${NNODES:-2}; CPUS=${NODE_CPUS:-4}; GPUS=${NODE_GPUS:-2}; KILLWAIT=${KILLWAIT:-5}; CRED_EXPIRE=${CRED_EXPIRE:-5}
SUBNET=${SUBNET:-10.200.0}; CTLD_PORT=${CTLD_PORT:-6817}; SLURMD_PORT=${SLURMD_PORT:-6818}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Names shared with down.sh: namespaces rvsns<i>, host-side veths rvsv<i>, bridge rvsbr0.
BR=rvsbr0; MARK="# rvsup-slurm-test"
export DEBIAN_FRONTEND=noninteractive
[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root" >&2; exit 1; }

# ---- 1. packages (a fresh Debian 12 has none of them; the package lists may be empty)
need=""
command -v slurmctld >/dev/null || need="$need slurm-wlm"
command -v munged >/dev/null || need="$need munge"
command -v ip >/dev/null || need="$need iproute2"
command -v nsenter >/dev/null || need="$need util-linux"
command -v ss >/dev/null || need="$need iproute2"
if [ -n "$need" ]; then
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# ---- 2. leftovers of an earlier run (daemons, namespaces, jobs) go first
"$HERE/down.sh"
for p in "$CTLD_PORT" "$SLURMD_PORT"; do
  if ss -Hltn "sport = :$p" | grep -q .; then
    echo "up.sh: TCP port $p is in use by another program (another Slurm?); set CTLD_PORT/SLURMD_PORT" >&2
    exit 1
  fi
done
if ip -4 -o addr show | grep -q " inet $SUBNET\."; then
  echo "up.sh: $SUBNET.0/24 is already in use on this machine; set SUBNET" >&2; exit 1
fi
rm -rf "$B/conf" "$B/state" "$B/log" "$B/run" "$B/munge" "$B/dev"
mkdir -p "$B/conf" "$B/state/ctld" "$B/log" "$B/run"

# ---- 3. a private munged (no systemd here; the daemon forks itself)
install -d -o munge -g munge -m 0755 "$B/munge"
dd if=/dev/urandom of="$B/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$B/munge/munge.key"; chmod 0400 "$B/munge/munge.key"
install -o munge -g munge -m 0640 /dev/null "$B/log/munged.log"
MUNGE_SOCKET=$B/munge/munge.socket
runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$B/munge/munge.key" \
  --pid-file="$B/munge/munged.pid" --log-file="$B/log/munged.log" --seed-file="$B/munge/munged.seed"
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null

# ---- 4. network namespaces and host names
CTL_ADDR=$SUBNET.1
ip link add $BR type bridge
ip addr add "$CTL_ADDR/24" dev $BR
ip link set $BR up
hosts=""
for i in $(seq 1 "$N"); do
  ip netns add rvsns$i
  ip link add rvsv$i type veth peer name eth0 netns rvsns$i
  ip link set rvsv$i master $BR up
  ip -n rvsns$i addr add "$SUBNET.$((10 + i))/24" dev eth0
  ip -n rvsns$i link set lo up
  ip -n rvsns$i link set eth0 up
  ip -n rvsns$i route add default via "$CTL_ADDR"
  hosts="$hosts$SUBNET.$((10 + i)) node$i $MARK"$'\n'
done
# /etc/hosts may be a bind mount (containers): append in place, never replace the file
[ -z "$(tail -c 1 /etc/hosts)" ] || echo >> /etc/hosts
printf '%s' "$hosts" >> /etc/hosts
# the machine's DNS server is unreachable from the namespaces: make look-ups fail fast
printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "$B/conf/resolv.conf.nodes"

# ---- 5. slurm.conf
{
cat <<CONF
ClusterName=rvsup-test
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$B/state/ctld
SlurmdSpoolDir=$B/state/slurmd_%n
SlurmctldPidFile=$B/run/slurmctld.pid
SlurmdPidFile=$B/run/slurmd_%n.pid
SlurmctldLogFile=$B/log/slurmctld.log
SlurmdLogFile=$B/log/slurmd_%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$B/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=$KILLWAIT
Waittime=0
CONF
gres=""
if [ "$GPUS" -gt 0 ]; then
  echo "GresTypes=gpu"
  gres=" Gres=gpu:$GPUS"
  # Slurm drops GPUs without device files; empty files stand in for /dev/nvidia<i>
  mkdir -p "$B/dev"
  for g in $(seq 0 $((GPUS - 1))); do : > "$B/dev/gpu$g"; done
  echo "NodeName=node[1-$N] Name=gpu File=$B/dev/gpu[0-$((GPUS - 1))]" > "$B/conf/gres.conf"
fi
for i in $(seq 1 "$N"); do
  echo "NodeName=node$i NodeHostname=node$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS RealMemory=4000$gres"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$B/conf/slurm.conf"
export SLURM_CONF=$B/conf/slurm.conf

# ---- 6. daemons (they fork themselves; PIDs land in $B/run/*.pid)
/usr/sbin/slurmctld -i
for i in $(seq 1 "$N"); do
  mkdir -p "$B/state/slurmd_node$i"
  nsenter --net=/run/netns/rvsns$i unshare --uts --mount --propagation private -- sh -c \
    "mount --bind '$B/conf/resolv.conf.nodes' /etc/resolv.conf && hostname node$i \
     && exec /usr/sbin/slurmd -N node$i"
done

# ---- 7. wait until every node is idle
for _ in $(seq 1 150); do
  [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = "$N" ] && break
  sleep 0.2
done
if [ "$(sinfo -h -t idle -o %D)" != "$N" ]; then
  echo "up.sh: the cluster did not come up" >&2
  sinfo -N >&2 || true
  tail -n 20 "$B"/log/*.log >&2 || true
  exit 1
fi
sinfo -N
echo "export SLURM_CONF=$SLURM_CONF"
