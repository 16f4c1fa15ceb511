#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests of `gradscope sweep --emit slurm`.
#   scripts/slurm-cluster.sh start DIR   configure and start munged, slurmctld and slurmd with
#                                        everything (configuration, keys, state, logs) in DIR;
#                                        exit 0 when the node takes jobs, 77 when Slurm cannot
#                                        start here (the reason on stderr), 1 on a failure
#   scripts/slurm-cluster.sh stop DIR    stop what `start DIR` started (always exit 0)
#   scripts/slurm-cluster.sh env DIR     print SLURM_CONF=DIR/slurm.conf: the clients' setting
# The node is this machine with its real cores and memory (`slurmd -C`), process tracking by
# parent process (proctrack/linuxproc) and no task confinement (task/none), so it needs no
# cgroups; root (or the user who starts it) is the Slurm user. Ports are the first free pair
# from 16817 (GRADSCOPE_SLURM_PORT to choose), so a site's own Slurm is not disturbed.
set -uo pipefail

skip() {
  echo "slurm-cluster: skipped: $*" >&2
  exit 77
}
die() {
  echo "slurm-cluster: error: $*" >&2
  exit 1
}

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || {
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
}
case "$dir" in
  /*) ;;
  *) dir="$PWD/$dir" ;;
esac
# DIR goes into slurm.conf, where a space, '#' or '%' would mean something: plain paths only.
case "$dir" in
  *[!A-Za-z0-9/._+,=@~-]*)
    echo "slurm-cluster: error: '$dir' holds a character slurm.conf cannot carry; use a plain path" >&2
    exit 2
    ;;
esac

stop_daemon() { # pid file
  local pid_file="$1" pid
  [ -f "$pid_file" ] || return 0
  pid="$(cat "$pid_file" 2>/dev/null)"
  rm -f "$pid_file"
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  return 0
}

stop_all() {
  # Jobs first (their steps would keep slurmd's children alive), then the daemons.
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/run/slurmctld.pid" ]; then
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user "$(id -un)" \
      >/dev/null 2>&1 || true
  fi
  stop_daemon "$dir/run/slurmd.pid"
  stop_daemon "$dir/run/slurmctld.pid"
  stop_daemon "$dir/run/munged.pid"
  rm -f "/tmp/gradscope-munge-$(printf '%s' "$dir" | cksum | cut -d' ' -f1).socket"*
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "$cmd" in
  env)
    echo "SLURM_CONF=$dir/slurm.conf"
    exit 0
    ;;
  stop)
    stop_all
    rm -f "$dir/slurm.conf" # so that nothing takes the stopped cluster for a running one
    exit 0
    ;;
  start)
    # A cluster left by an earlier start in the same folder goes first, and with it the
    # configuration the tests look for.
    stop_all
    rm -f "$dir/slurm.conf"
    ;;
  *)
    echo "usage: $0 start|stop|env DIR" >&2
    exit 2
    ;;
esac

for tool in munged slurmctld slurmd sbatch squeue sinfo scontrol srun scancel; do
  command -v "$tool" >/dev/null 2>&1 ||
    skip "$tool is not installed (scripts/install-deps.sh installs Slurm and munge)"
done
user="$(id -un)"
[ "$(id -u)" -eq 0 ] || skip "the Slurm daemons need root here (running as $user)"

mkdir -p "$dir/run" "$dir/state" "$dir/spool" "$dir/log" "$dir/munge" || die "cannot create $dir"
chmod 0700 "$dir/munge"

# munge: a key of its own and a socket in DIR, so a site's munged is neither needed nor used.
key="$dir/munge/munge.key"
if [ ! -s "$key" ]; then
  (umask 077 && head -c 128 /dev/urandom >"$key") || die "cannot write $key"
fi
chmod 0400 "$key"
# A socket's path is limited to about 100 bytes: a short one in /tmp, named after DIR.
socket="/tmp/gradscope-munge-$(printf '%s' "$dir" | cksum | cut -d' ' -f1).socket"
munged --force --key-file="$key" --socket="$socket" --pid-file="$dir/run/munged.pid" \
  --seed-file="$dir/munge/munged.seed" --log-file="$dir/log/munged.log" \
  >>"$dir/log/munged.log" 2>&1 || skip "munged did not start: $(tail -n 2 "$dir/log/munged.log")"

node_line="$(slurmd -C 2>/dev/null | head -n 1)"
case "$node_line" in
  NodeName=*) ;;
  *) skip "slurmd -C could not describe this machine" ;;
esac
node="$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node_line")"
cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")"
real_mb="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")"
[ -n "$node" ] && [ -n "$cpus" ] && [ -n "$real_mb" ] || skip "cannot read '$node_line'"
# Slurm drains a node that reports less memory than configured: keep a margin.
memory_mb=$((real_mb * 9 / 10))

port="${GRADSCOPE_SLURM_PORT:-16817}"
while ! port_free "$port" || ! port_free "$((port + 1))"; do
  port=$((port + 2))
  [ "$port" -lt 17817 ] || skip "no free port pair between 16817 and 17817"
done

cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-cluster.sh: a one-node cluster for gradscope's tests.
ClusterName=gradscope
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((memory_mb / cpus))
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
SchedulerParameters=sched_interval=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
# A partition no task of more than a minute fits: the tests' job that cannot start.
PartitionName=short Nodes=$node MaxTime=1 State=UP
EOF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -i -f "$SLURM_CONF" >>"$dir/log/slurmctld.out" 2>&1 ||
  { stop_all; skip "slurmctld did not start: $(tail -n 3 "$dir/log/slurmctld.log" 2>/dev/null)"; }
slurmd -f "$SLURM_CONF" -N "$node" >>"$dir/log/slurmd.out" 2>&1 ||
  { stop_all; skip "slurmd did not start: $(tail -n 3 "$dir/log/slurmd.log" 2>/dev/null)"; }

# Ready when the node is idle (a node that was down comes back by itself: ReturnToService=2).
for _ in $(seq 60); do
  state="$(sinfo -h -n "$node" -o '%T' 2>/dev/null | head -n 1)"
  if [ "$state" = "idle" ] || [ "$state" = "mixed" ] || [ "$state" = "allocated" ]; then
    echo "slurm-cluster: node $node ($cpus CPUs, $memory_mb MiB) takes jobs; SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  if [ "$state" = "down" ] || [ "$state" = "drained" ] || [ "$state" = "down*" ]; then
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
  fi
  sleep 0.5
done
reason="$(sinfo -h -R 2>/dev/null | head -n 1)"
stop_all
skip "the node did not become idle within 30 s (state '${state:-unknown}'${reason:+, $reason})"
