#!/usr/bin/env bash
# gradscope started by Slurm across two test hosts: scripts/hosts.sh makes 2 hosts,
# scripts/slurm-hosts.sh a cluster of one slurmd per host, and `srun -N2 -n2` from host 1
# starts one rank per host. Checks that the run ends ok, that its record names both hosts
# (["gs-host1","gs-host2"]), the launcher slurm, 2 nodes and 2 ranks, that each rank ran on
# its own node, and that stopping the cluster and the hosts leaves no daemon, step, munge
# socket or namespace behind. Prints the seconds the job and the whole test took.
#   tests/scripts/slurm_hosts_test.sh HOSTS_SH SLURM_HOSTS_SH GRADSCOPE
# Where namespaces or Slurm cannot run here (not root, not installed), it prints the line
# CTest takes for skipped and exits 77.
set -uo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: tests/scripts/slurm_hosts_test.sh HOSTS_SH SLURM_HOSTS_SH GRADSCOPE" >&2
  exit 2
fi
hosts=$1
slurm_hosts=$2
gradscope=$3
py=${PYTHON:-python3}
for f in "$hosts" "$slurm_hosts"; do
  [[ -f $f ]] || { echo "slurm_hosts_test: error: no script '$f'" >&2; exit 2; }
done
[[ -x $gradscope ]] || { echo "slurm_hosts_test: error: '$gradscope' is no program" >&2; exit 2; }
case "$gradscope" in /*) ;; *) gradscope="$PWD/$gradscope" ;; esac

test_start=$(date +%s.%N)
tmp=$(mktemp -d)
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
skipped() {
  echo "$1"
  echo "no Slurm across test hosts here: the SlurmHosts test is skipped"
  exit 77
}
cleanup() {
  bash "$slurm_hosts" stop "$tmp/slurm" > /dev/null 2>&1
  bash "$hosts" stop "$tmp/hosts" > /dev/null 2>&1
  rm -rf -- "$tmp"
}
trap cleanup EXIT

# The hosts live as long as this script (their owner): clean-stale removes them after a crash,
# those of an earlier run that crashed first.
bash "$hosts" clean-stale > /dev/null 2>&1
out=$(GRADSCOPE_HOSTS_OWNER=$$ bash "$hosts" start 2 "$tmp/hosts" 2>&1)
case $? in
  0) ;;
  77) skipped "$out" ;;
  *) echo "$out" >&2; echo "FAIL: hosts.sh start 2" >&2; exit 1 ;;
esac
prefix=$(cat "$tmp/hosts/prefix")
out=$(bash "$slurm_hosts" start "$tmp/slurm" "$tmp/hosts" 2>&1)
case $? in
  0) echo "$out" ;;
  77) skipped "$out" ;;
  *) echo "$out" >&2; echo "FAIL: slurm-hosts.sh start" >&2; exit 1 ;;
esac

master=$(bash "$hosts" addr "$tmp/hosts" 1) || exit 1
ifname=$(bash "$hosts" ifname)
conf="$tmp/slurm/slurm.conf"
# The ranks and slurmd write in $tmp, which every host sees (namespaces share the file system).
job_start=$(date +%s.%N)
bash "$hosts" exec "$tmp/hosts" 1 env SLURM_CONF="$conf" MASTER_ADDR="$master" \
  MASTER_PORT=29500 timeout 300 srun -N2 -n2 --chdir="$tmp" --label \
  bash -c 'echo "node $SLURMD_NODENAME host $(hostname)"; exec "$@"' rank "$gradscope" \
  run --model llama --preset tiny --steps 10 --batch 2 --threads 1 --nproc 2 --shard ddp \
  --ifname "$ifname" --no-db --json "$tmp/r.json" > "$tmp/job.out" 2>&1
rc=$?
job_s=$("$py" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
  "$job_start" "$(date +%s.%N)")
if [[ $rc -ne 0 ]]; then
  tail -n 20 "$tmp/job.out" >&2
  tail -n 5 "$tmp/slurm/log/"*.log >&2
  fail "srun -N2 -n2 gradscope run exited $rc"
fi
echo "srun -N2 -n2 gradscope run (10 steps, ddp, one rank per host): ${job_s} s, exit $rc"
# Each task names its node and its host name: rank 0 on gs-host1, rank 1 on gs-host2.
for r in 0 1; do
  want="$r: node gs-host$((r + 1)) host gs-host$((r + 1))"
  grep -qxF "$want" "$tmp/job.out" || fail "the job's output lacks '$want'"
done

if [[ -s $tmp/r.json ]]; then
  "$py" - "$tmp/r.json" << 'EOF' || fail "the record is not a run across the two hosts"
import json, sys
record = json.load(open(sys.argv[1]))
d = record.get("distributed") or {}
seen = {"status": record.get("status"), "hosts": d.get("hosts"),
        "launcher": d.get("launcher"), "nnodes": d.get("nnodes"), "world": d.get("world"),
        "interface": d.get("interface")}
want = {"status": "ok", "hosts": ["gs-host1", "gs-host2"], "launcher": "slurm", "nnodes": 2,
        "world": 2, "interface": "gs0"}
print("record:", json.dumps(seen))
sys.exit(0 if seen == want else 1)
EOF
else
  fail "no record at $tmp/r.json"
fi

# Stop: no daemon or step left, no munge socket, nothing of start's in DIR but the logs.
pids=$(cat "$tmp/slurm/run/"*.pid 2> /dev/null | tr '\n' ' ')
[[ $(wc -w <<< "$pids") -eq 4 ]] ||
  fail "expected the pid files of 4 daemons (munged, slurmctld, 2 slurmd): $pids"
socket=$(sed -n 's/^AuthInfo=socket=//p' "$conf")
bash "$slurm_hosts" stop "$tmp/slurm"
for pid in $pids; do
  kill -0 "$pid" 2> /dev/null && fail "daemon $pid ($(cat "/proc/$pid/comm")) outlived stop"
done
for k in 1 2; do
  left=$(ip netns pids "$prefix-h$k" 2> /dev/null | tr '\n' ' ')
  [[ -z ${left// /} ]] || fail "processes left in host $k after stop: $left"
done
[[ -n $socket && ! -e $socket ]] || fail "the munge socket '$socket' is left after stop"
left=$(ls "$tmp/slurm")
[[ $left == log ]] || fail "stop left in DIR: $(tr '\n' ' ' <<< "$left")"
bash "$hosts" stop "$tmp/hosts"
ip netns list 2> /dev/null | grep -q -- "^$prefix-" && fail "namespaces of $prefix left behind"

test_s=$("$py" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
  "$test_start" "$(date +%s.%N)")
echo "slurm_hosts_test: ${test_s} s in all, $failures failure(s)"
[[ $failures -eq 0 ]]
