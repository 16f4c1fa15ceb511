#!/usr/bin/env bash
# A Slurm cluster across test hosts (scripts/hosts.sh): one slurmd per host, each in its host's
# network namespace under the host's own name, and slurmctld in host 1, so that `srun -N2`
# starts one task per host and the tasks meet over the hosts' switch.
#   scripts/slurm-hosts.sh start DIR HOSTS_DIR  configure and start munged, slurmctld and one
#                                        slurmd per host of HOSTS_DIR (a running `hosts.sh
#                                        start N HOSTS_DIR`), with everything (configuration,
#                                        key, state, spools, logs) in DIR; exit 0 when every
#                                        node takes jobs, 77 when Slurm cannot run here (the
#                                        reason on stderr), 2 on bad input, 1 on a failure
#   scripts/slurm-hosts.sh stop DIR      stop what `start DIR` started, the job steps first,
#                                        and remove the munge socket and what start wrote in
#                                        DIR but its logs (always exit 0)
#   scripts/slurm-hosts.sh env DIR       print SLURM_CONF=DIR/slurm.conf: the clients' setting
#
# Clients. The root namespace cannot reach the hosts' addresses (the switch is a namespace of
# its own), so srun, sbatch, sinfo and scancel run in a host, e.g.
#   scripts/hosts.sh exec HOSTS_DIR 1 env SLURM_CONF=DIR/slurm.conf MASTER_ADDR=ADDR1 \
#     MASTER_PORT=29500 srun -N2 -n2 gradscope run ... --ifname gs0
# Host names do not resolve (no DNS, nothing in /etc/hosts), hence MASTER_ADDR: host 1's
# address (`hosts.sh addr HOSTS_DIR 1`).
#
# Layout. Node K is named gs-hostK, the host name `hosts.sh exec` gives host K, with
# NodeAddr its address; slurmctld listens in host 1 (SlurmctldHost=gs-host1(ADDR1)). munged
# runs in the root namespace: its socket is a path in the file system, which every network
# namespace reaches. Each node has the machine's cores (`slurmd -C`) and 9/10 of its memory
# (the nodes share them). Ports are the first pair from 16817 (GRADSCOPE_SLURM_PORT to
# choose) free in every host; the hosts' ports are apart from the root namespace's, so a
# cluster of scripts/slurm-cluster.sh does not collide.
#
# Cgroups. `ip netns exec` mounts a fresh sysfs on /sys in a mount namespace of its own, which
# hides the cgroup file systems under /sys/fs/cgroup; slurmd 22.05 refuses to start without
# them, even with proctrack/linuxproc and task/none ("error: No filesystem mounted on
# /sys/fs/cgroup", "error: Unable to initialize cgroup plugin"), and a lone cgroup2 mount on a
# machine whose processes are in cgroup v1 hierarchies is refused too ("fatal: Hybrid mode is
# not supported"). So each slurmd first mounts the root namespace's cgroup file systems again,
# at the same places, in its own mount namespace: they go when it exits.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hosts_sh="$here/hosts.sh"

usage() {
  echo "usage: $0 start DIR HOSTS_DIR | stop DIR | env DIR" >&2
  exit 2
}
bad() {
  echo "slurm-hosts: error: $*" >&2
  exit 2
}
skip() {
  echo "slurm-hosts: skipped: $*" >&2
  exit 77
}
die() {
  echo "slurm-hosts: error: $*" >&2
  exit 1
}

# check_path NAME PATH: sets $path to PATH made absolute; it goes into slurm.conf, where a
# space, '#' or '%' would mean something, so plain paths only.
check_path() {
  path="$2"
  [ -n "$path" ] || bad "an empty $1"
  case "$path" in
    /*) ;;
    *) path="$PWD/$path" ;;
  esac
  case "$path" in
    *[!A-Za-z0-9/._+,=@~-]*)
      bad "$1 '$path' holds a character other than A-Za-z0-9/._+,=@~- (it goes into slurm.conf)"
      ;;
  esac
  [ "${#path}" -le 200 ] || bad "$1 '$path' is longer than 200 bytes"
}

# The munge socket: a short path in /tmp named after DIR (a socket's path holds ~100 bytes).
socket_of() {
  echo "/tmp/gradscope-munge-hosts-$(printf '%s' "$1" | cksum | cut -d' ' -f1).socket"
}

# stop_daemons PID_FILE...: TERM to the daemons of the pid files at once (each takes about 2 s
# to exit), KILL to those left after 5 s; the pid files go.
stop_daemons() {
  local pid_file pid pids=""
  for pid_file in "$@"; do
    [ -f "$pid_file" ] || continue
    pid="$(cat "$pid_file" 2>/dev/null)"
    rm -f "$pid_file"
    case "$pid" in '' | *[!0-9]*) continue ;; esac
    kill -TERM "$pid" 2>/dev/null && pids+=" $pid"
  done
  for _ in $(seq 50); do
    for pid in $pids; do
      kill -0 "$pid" 2>/dev/null || pids="${pids/ $pid/}"
    done
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086 # one word per pid
  kill -KILL $pids 2>/dev/null
  return 0
}

# in_host K CMD...: CMD in host K of the recorded hosts.
in_host() {
  local k="$1"
  shift
  bash "$hosts_sh" exec "$hosts_dir" "$k" "$@"
}

# stepds: the slurmstepd processes of this cluster (a step's keeper, which outlives slurmd
# when slurmd is killed first): those in the recorded hosts' namespaces that hold a file in
# DIR open (their node's log), so that another cluster's on the same hosts stay.
stepds() {
  local ns pid
  [ -f "$hosts_dir/hosts" ] || return 0
  for ns in $(awk '/^[1-8] / { print $2 }' "$hosts_dir/hosts"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] &&
        ls -l "/proc/$pid/fd" 2>/dev/null | grep -qF -- " -> $dir/" && echo "$pid"
    done
  done
}

# descendants PID: the children of process PID, theirs, and so on.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

stop_all() {
  # The hosts of the cluster that runs, which need not be the ones a start is given.
  local pids pid hosts_dir
  hosts_dir="$(cat "$dir/hosts-dir" 2>/dev/null)"
  # Jobs first (their steps would keep slurmd's children alive), then the daemons.
  if [ -n "$hosts_dir" ] && [ -f "$dir/slurm.conf" ] && [ -f "$dir/run/slurmctld.pid" ]; then
    in_host 1 env SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet \
      --user "$(id -un)" >/dev/null 2>&1 || true
  fi
  # munged last: the others may still authenticate a message as they stop.
  stop_daemons "$dir/run/slurmd-gs-host"[1-8].pid "$dir/run/slurmctld.pid"
  stop_daemons "$dir/run/munged.pid"
  if [ -n "$hosts_dir" ]; then
    # The steps' keepers and their tasks, found before any is killed (a task whose keeper is
    # gone has another parent).
    pids="$(for pid in $(stepds); do echo "$pid"; descendants "$pid"; done | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one word per pid
    [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null
  fi
  rm -f "$(socket_of "$dir")"*
  rm -rf "$dir/run" "$dir/state" "$dir/spool" "$dir/munge"
  rm -f "$dir/slurm.conf" "$dir/hosts-dir"
}

port_free_everywhere() { # port
  local k
  for k in $(seq "$count"); do
    in_host "$k" bash -c '! (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null' port-check \
      "$(awk -v k="$k" '$1 == k { print $3 }' "$hosts_dir/hosts")" "$1" || return 1
  done
}

# cgroup_mounts: the root namespace's mounts at and under /sys/fs/cgroup, one a line as
# "PATH TYPE OPTIONS", in mount order (a tmpfs at /sys/fs/cgroup before the hierarchies in it).
cgroup_mounts() {
  awk '$2 == "/sys/fs/cgroup" || $2 ~ /^\/sys\/fs\/cgroup\// { print $2, $3, $4 }' /proc/mounts |
    grep -E '^/sys/fs/cgroup[A-Za-z0-9/._,=-]* [a-z0-9]+ [A-Za-z0-9/._,=:-]+$'
}

# start_slurmd K: slurmd of node gs-hostK in host K, after the cgroup mounts (see the header).
start_slurmd() {
  in_host "$1" sh -c '
    printf "%s\n" "$3" | while read -r path type options; do
      [ -n "$path" ] || continue
      mkdir -p "$path" && mount -t "$type" -o "$options" "$type" "$path" || exit 1
    done || { echo "cannot mount the cgroup file systems in host $2" >&2; exit 1; }
    exec slurmd -f "$1" -N "gs-host$2"' start-slurmd "$dir/slurm.conf" "$1" "$cgroups" \
    >>"$dir/log/slurmd.out" 2>&1
}

write_conf() {
  local k addr
  cat <<EOF
# Written by scripts/slurm-hosts.sh: one node per test host of $hosts_dir.
ClusterName=gradscope-hosts
SlurmctldHost=gs-host1($addr1)
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
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
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
KillWait=10
MinJobAge=600
SchedulerParameters=sched_interval=2
EOF
  for k in $(seq "$count"); do
    addr="$(awk -v k="$k" '$1 == k { print $3 }' "$hosts_dir/hosts")"
    echo "NodeName=gs-host$k NodeAddr=$addr CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"
  done
  echo "PartitionName=hosts Nodes=gs-host[1-$count] Default=YES MaxTime=INFINITE State=UP"
}

# wait_idle: every node idle within 30 s (a node that was down comes back: ReturnToService=2).
wait_idle() {
  local states
  for _ in $(seq 60); do
    states="$(in_host 1 env SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o '%N %T' 2>/dev/null)"
    [ "$(grep -cE ' (idle|mixed|allocated)$' <<<"$states")" -eq "$count" ] && return 0
    sleep 0.5
  done
  echo "nodes not idle within 30 s: $(tr '\n' ' ' <<<"$states")"
  return 1
}

# fail_start MESSAGE LOG: stop what this start started and skip, quoting LOG's last lines.
fail_start() {
  local tail_lines
  tail_lines="$(tail -n 3 "$2" 2>/dev/null | tr '\n' ' ')"
  stop_all
  skip "$1${tail_lines:+: $tail_lines}"
}

start() {
  local k tool node_line real_mb why first_port
  check_path HOSTS_DIR "$1"
  hosts_dir="$path"
  [ -f "$hosts_dir/hosts" ] || bad "HOSTS_DIR '$hosts_dir' holds no running hosts (hosts.sh start)"
  count="$(grep -cE '^[1-8] gs-[0-9a-f]{8}-h[1-8] 10\.213\.[0-9]{1,3}\.[1-8] gs0$' \
    "$hosts_dir/hosts")"
  [ "$count" -ge 2 ] && [ "$count" -eq "$(grep -cv '^#' "$hosts_dir/hosts")" ] ||
    bad "'$hosts_dir/hosts' is no record of hosts.sh start"
  stop_all
  for tool in munged slurmctld slurmd slurmstepd srun sinfo scancel ip; do
    command -v "$tool" >/dev/null 2>&1 ||
      skip "$tool is not installed (scripts/install-deps.sh installs Slurm and munge)"
  done
  user="$(id -un)"
  [ "$(id -u)" -eq 0 ] || skip "the Slurm daemons need root here (running as $user)"
  cgroups="$(cgroup_mounts)"
  [ -n "$cgroups" ] || skip "no cgroup file system is mounted under /sys/fs/cgroup"

  mkdir -p "$dir/run" "$dir/state" "$dir/log" "$dir/munge" || die "cannot create $dir"
  for k in $(seq "$count"); do
    mkdir -p "$dir/spool/gs-host$k" || die "cannot create $dir/spool"
  done
  chmod 0700 "$dir/munge"
  echo "$hosts_dir" >"$dir/hosts-dir" || die "cannot write $dir/hosts-dir"
  (umask 077 && head -c 128 /dev/urandom >"$dir/munge/munge.key") || die "cannot write the key"
  chmod 0400 "$dir/munge/munge.key"
  socket="$(socket_of "$dir")"
  munged --force --key-file="$dir/munge/munge.key" --socket="$socket" \
    --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge/munged.seed" \
    --log-file="$dir/log/munged.log" >>"$dir/log/munged.log" 2>&1 ||
    fail_start "munged did not start" "$dir/log/munged.log"

  node_line="$(slurmd -C 2>/dev/null | head -n 1)"
  cpus="$(sed -n 's/^NodeName=.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")"
  real_mb="$(sed -n 's/^NodeName=.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")"
  [ -n "$cpus" ] && [ -n "$real_mb" ] || fail_start "cannot read slurmd -C's '$node_line'"
  memory_mb=$((real_mb * 9 / 10))
  addr1="$(awk '$1 == 1 { print $3 }' "$hosts_dir/hosts")"
  port="${GRADSCOPE_SLURM_PORT:-16817}"
  [[ $port =~ ^[0-9]{1,5}$ ]] && [ "$port" -ge 1024 ] && [ "$port" -le 65000 ] || {
    stop_all
    bad "GRADSCOPE_SLURM_PORT '$port' is not a port of 1024..65000"
  }
  first_port="$port"
  while ! port_free_everywhere "$port" || ! port_free_everywhere "$((port + 1))"; do
    port=$((port + 2))
    [ "$port" -lt $((first_port + 1000)) ] ||
      fail_start "no port pair of the 1000 from $first_port is free in the hosts"
  done
  write_conf >"$dir/slurm.conf" || fail_start "cannot write $dir/slurm.conf"

  in_host 1 slurmctld -i -f "$dir/slurm.conf" >>"$dir/log/slurmctld.out" 2>&1 ||
    fail_start "slurmctld did not start in host 1" "$dir/log/slurmctld.log"
  for k in $(seq "$count"); do
    start_slurmd "$k" || fail_start "slurmd did not start in host $k" \
      "$(ls "$dir/log/slurmd-gs-host$k.log" 2>/dev/null || echo "$dir/log/slurmd.out")"
  done
  why="$(wait_idle)" || fail_start "$why" "$dir/log/slurmctld.log"
  echo "slurm-hosts: nodes gs-host[1-$count] take jobs, slurmctld in host 1 ($addr1:$port);" \
    "SLURM_CONF=$dir/slurm.conf"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    [ $# -eq 2 ] || usage
    check_path DIR "$1"
    dir="$path"
    start "$2"
    ;;
  stop)
    [ $# -eq 1 ] || usage
    check_path DIR "$1"
    dir="$path"
    stop_all
    exit 0
    ;;
  env)
    [ $# -eq 1 ] || usage
    check_path DIR "$1"
    echo "SLURM_CONF=$path/slurm.conf"
    ;;
  *) usage ;;
esac
