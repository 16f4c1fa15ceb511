#!/usr/bin/env bash
# gradscope across two test hosts (scripts/hosts.sh: network namespaces on one switch), each
# host's ranks started by its own `gradscope run --nnodes 2 --node-rank R`:
#   verify      ddp, zero1, zero2 and fsdp on 2 hosts x 1 rank (fp32 and bf16) and on 2 hosts
#               x 2 ranks (fp32) give one process's losses and parameters on the global batch
#   same-run    a zero2 run on 2 hosts has the losses of the same run's 2 ranks on one host, bit
#               for bit; its record names both hosts, the interface and the measured link, and
#               node 0's meeting point listens on --master-addr alone
#   refuse      a host started with another --lr: both hosts refuse (exit 2), naming the rank,
#               its host and the setting
#   kill        host 2's processes killed mid-run: node 0 records the run crashed, naming
#               gs-host2, within --dist-timeout; each host resumes from its own state folder and
#               the losses are the uninterrupted run's, bit for bit
#   kill4       the same on 2 hosts x 2 ranks: node 0 names host 2's two ranks, and no other
#   cut         host 2's link cut mid-run: both hosts end within --dist-timeout, node 0's
#               record naming gs-host2, host 2's output naming node 0
#   throttle    host 2's link throttled to 20mbit for 4 s mid-run: the run ends ok, and its
#               record's step times show from which step on
# Prints the figures it checks (times to detection, step times).
#   tests/scripts/hosts_ranks_test.sh HOSTS_SH GRADSCOPE DIR
# DIR is a `hosts.sh start 2 DIR` (the CTest fixture HostsStart); where it holds no hosts, the
# script prints the line CTest takes for skipped and exits 77.
set -uo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: tests/scripts/hosts_ranks_test.sh HOSTS_SH GRADSCOPE DIR" >&2
  exit 2
fi
hosts=$1
gradscope=$2
dir=$3
py=${PYTHON:-python3}
if [[ ! -s $dir/hosts ]]; then
  echo "no test hosts here: the HostsRanks suite is skipped"
  exit 77
fi
master=$(bash "$hosts" addr "$dir" 1) || exit 1
ifname=$(bash "$hosts" ifname)
ns1=$(awk '$1 == 1 { print $2 }' "$dir/hosts")
ns2=$(awk '$1 == 2 { print $2 }' "$dir/hosts")
tmp=$(mktemp -d)
failures=0
port=29600
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
cleanup() {
  bash "$hosts" mend "$dir" 2 > /dev/null 2>&1
  bash "$hosts" rate "$dir" 2 off > /dev/null 2>&1
  local ns
  for ns in "$ns1" "$ns2"; do
    ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null
  done
  rm -rf -- "$tmp"
}
trap cleanup EXIT
cd "$tmp" || exit 1

# The setting every run here shares: the tiny Llama, one thread per rank.
run_settings=(run --model llama --preset tiny --batch 2 --threads 1 --nproc-per-node 1 --no-db)

# on_host K ARGS...: gradscope ARGS in host K, meeting at host 1; @HOST@ in an argument
# becomes hK (a folder of the host's own, as on a node-local disk).
on_host() {
  local k=$1
  shift
  bash "$hosts" exec "$dir" "$k" "$gradscope" "${@//@HOST@/h$k}" --nnodes 2 \
    --node-rank $((k - 1)) --master-addr "$master" --master-port "$port" --ifname "$ifname"
}

# both NAME ARGS...: the same command on both hosts at once; NAME-h1.log, NAME-h2.log and the
# exit codes in NAME-h1.rc, NAME-h2.rc. Each host's --json is NAME-hK.json.
both() {
  local name=$1
  shift
  port=$((port + 1))
  on_host 2 "$@" --json "$name-h2.json" > "$name-h2.log" 2>&1 &
  local other=$!
  on_host 1 "$@" --json "$name-h1.json" > "$name-h1.log" 2>&1
  echo $? > "$name-h1.rc"
  wait "$other"
  echo $? > "$name-h2.rc"
}

# json FILE EXPR: a Python expression over the record `r`.
json() {
  "$py" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
losses() { json "$1" '" ".join(repr(s["loss"]) for s in r["steps"])'; }
now() { date +%s.%N; }
elapsed() {
  "$py" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$1" "$2"
}

echo "== verify: every shard mode on 2 hosts against one process"
port=$((port + 1))
on_host 2 verify --model llama --nproc-per-node 1 --dist-timeout 60 > v-h2.log 2>&1 &
pid=$!
on_host 1 verify --model llama --nproc-per-node 1 --dist-timeout 60 > v-h1.log 2>&1 ||
  fail "verify on 2 hosts x 1 rank: $(tail -3 v-h1.log)"
wait $pid || fail "verify's host 2 failed: $(tail -3 v-h2.log)"
grep -E '^(fp32|bf16):' v-h1.log
grep -q 'fp32: 10 of 10 checks hold' v-h1.log && grep -q 'bf16: 10 of 10 checks hold' v-h1.log ||
  fail "verify on 2 hosts x 1 rank: not every check holds"
port=$((port + 1))
on_host 2 verify --model llama --nproc-per-node 2 --dtype fp32 --dist-timeout 60 > v4-h2.log 2>&1 &
pid=$!
on_host 1 verify --model llama --nproc-per-node 2 --dtype fp32 --dist-timeout 60 > v4-h1.log 2>&1 ||
  fail "verify on 2 hosts x 2 ranks: $(tail -3 v4-h1.log)"
wait $pid || fail "verify's host 2 (2 ranks) failed: $(tail -3 v4-h2.log)"
grep -E '^fp32:' v4-h1.log
grep -q '^ddp x4' v4-h1.log && grep -q 'fp32: 10 of 10 checks hold' v4-h1.log ||
  fail "verify on 2 hosts x 2 ranks: not every check holds"

echo "== same-run: a zero2 run on 2 hosts against its 2 ranks on one host"
same=("${run_settings[@]}" --steps 12 --shard zero2 --dist-timeout 60)
both two "${same[@]}"
[[ $(cat two-h1.rc) == 0 && $(cat two-h2.rc) == 0 ]] ||
  fail "the run on 2 hosts failed: $(tail -3 two-h1.log) / $(tail -3 two-h2.log)"
"$gradscope" "${same[@]}" --nproc-per-node 2 --json one.json > one.log 2>&1 ||
  fail "the run on one host failed: $(tail -3 one.log)"
if [[ -s two-h1.json && -s one.json ]]; then
  [[ $(losses two-h1.json) == "$(losses one.json)" ]] ||
    fail "2 hosts' losses differ from one host's: $(losses two-h1.json) / $(losses one.json)"
  hosts_seen=$(json two-h1.json '",".join(r["distributed"]["hosts"])')
  echo "hosts ${hosts_seen}; nnodes $(json two-h1.json 'r["distributed"]["nnodes"]');" \
    "link $(json two-h1.json 'round(r["distributed"]["link"]["bus_bytes_per_s"] * 8e-9, 2)')" \
    "Gbit/s; interface $(json two-h1.json 'r["distributed"]["interface"]')"
  [[ $hosts_seen == gs-host1,gs-host2 ]] || fail "the record's hosts are $hosts_seen"
  [[ $(json two-h1.json 'r["config"]["nnodes"]') == 2 ]] || fail "the record's nnodes is not 2"
  [[ $(json two-h1.json 'r["distributed"]["link"]["bus_bytes_per_s"] > 0') == True ]] ||
    fail "the record has no link figure"
  [[ $(json two-h1.json 'r["run_id"]') != "$(json one.json 'r["run_id"]')" ]] ||
    fail "the run on 2 hosts has the run id of the run on one"
fi
[[ ! -e two-h2.json ]] || fail "host 2 wrote a record: only rank 0 writes one"

echo "== torchrun: one torchrun per host, meeting through its c10d rendezvous"
torchrun=$(dirname "$hosts")/../.venv/bin/torchrun
if [[ -x $torchrun ]]; then
  port=$((port + 1))
  for k in 2 1; do
    bash "$hosts" exec "$dir" "$k" env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \
      GLOO_SOCKET_IFNAME="$ifname" "$torchrun" --nnodes 2 --nproc-per-node 1 \
      --rdzv-backend c10d --rdzv-endpoint "$master:$port" --rdzv-id hosts-ranks \
      --local-addr "$(bash "$hosts" addr "$dir" "$k")" --no-python \
      "$gradscope" "${same[@]}" --nnodes 2 --json "tr-h$k.json" > "tr-h$k.log" 2>&1 &
  done
  wait
  if [[ -s tr-h1.json ]]; then
    tr=tr-h1.json
  else
    tr=tr-h2.json  # the rendezvous decides which host holds rank 0
  fi
  [[ -s $tr ]] || fail "torchrun on 2 hosts wrote no record: $(tail -3 tr-h1.log)"
  if [[ -s $tr && -s two-h1.json ]]; then
    echo "torchrun: launcher $(json "$tr" 'r["distributed"]["launcher"]'), hosts" \
      "$(json "$tr" '",".join(r["distributed"]["hosts"])')"
    [[ $(json "$tr" 'r["distributed"]["nnodes"]') == 2 ]] || fail "torchrun's run: nnodes not 2"
    [[ $(losses "$tr") == "$(losses two-h1.json)" ]] ||
      fail "torchrun's losses differ from gradscope's launcher's on 2 hosts"
  fi
else
  echo "torchrun: skipped (no $torchrun)"
fi

echo "== listen: node 0's meeting point listens on --master-addr alone"
port=$((port + 1))
on_host 2 "${run_settings[@]}" --steps 2000 --shard ddp --json listen-h2.json \
  > listen-h2.log 2>&1 &
pid=$!
on_host 1 "${run_settings[@]}" --steps 2000 --shard ddp --json listen-h1.json \
  > listen-h1.log 2>&1 &
pid1=$!
sleep 3
listeners=$(ip netns exec "$ns1" ss -Hltn "sport = :$port" | awk '{ print $4 }')
echo "listening at port $port: ${listeners:-nothing}"
[[ $listeners == "$master:$port" ]] || fail "the meeting point listens at '$listeners'"
kill -TERM $pid1 2> /dev/null
wait $pid1
wait $pid

echo "== refuse: a host with another learning rate"
port=$((port + 1))
on_host 2 "${run_settings[@]}" --steps 4 --shard ddp --lr 0.002 --json refuse-h2.json \
  > refuse-h2.log 2>&1 &
pid=$!
on_host 1 "${run_settings[@]}" --steps 4 --shard ddp --lr 0.001 --json refuse-h1.json \
  > refuse-h1.log 2>&1
rc1=$?
wait $pid
rc2=$?
grep -h '^error' refuse-h1.log | head -1
[[ $rc1 == 2 && $rc2 == 2 ]] || fail "a host with another --lr: exit $rc1 and $rc2, not 2 and 2"
refusal='rank 1 (host gs-host2) runs another configuration than rank 0 (host gs-host1)'
grep -qF "$refusal: its config.lr" refuse-h1.log ||
  fail "the refusal does not name rank 1, its host and config.lr"

# A run on 2 hosts whose host 2 is hurt after DELAY seconds by ACTION (kill, cut, throttle);
# NAME-hK.log, .json and .rc as `both`, NAME.hurt and NAME-hK.end the times.
hurt_run() {
  local name=$1 delay=$2 action=$3
  shift 3
  port=$((port + 1))
  (
    on_host 2 "$@" --json "$name-h2.json" > "$name-h2.log" 2>&1
    echo $? > "$name-h2.rc"
    now > "$name-h2.end"
  ) &
  local other=$!
  (
    # A number of seconds, or a file to wait for (at most 60 s): the hurt comes once it exists.
    if [[ $delay =~ ^[0-9]+$ ]]; then
      sleep "$delay"
    else
      for _ in $(seq 600); do
        [[ -e $delay ]] && break
        sleep 0.1
      done
    fi
    now > "$name.hurt"
    case $action in
      kill) ip netns pids "$ns2" | xargs -r kill -9 ;;
      cut) bash "$hosts" cut "$dir" 2 ;;
      throttle)
        bash "$hosts" rate "$dir" 2 20mbit
        sleep 4
        bash "$hosts" rate "$dir" 2 off
        ;;
    esac
  ) &
  local hurt=$!
  on_host 1 "$@" --json "$name-h1.json" > "$name-h1.log" 2>&1
  echo $? > "$name-h1.rc"
  now > "$name-h1.end"
  wait "$hurt"
  wait "$other"
  bash "$hosts" mend "$dir" 2
  bash "$hosts" rate "$dir" 2 off
}

echo "== kill: host 2's processes killed mid-run, then resumed from each host's own state"
timeout_s=10
long=("${run_settings[@]}" --steps 400 --shard zero2 --dist-timeout "$timeout_s")
both whole "${long[@]}"
[[ $(cat whole-h1.rc) == 0 ]] || fail "the uninterrupted run failed: $(tail -3 whole-h1.log)"
# Once both hosts saved a state (every 10 steps), so that there is one to resume from.
hurt_run kill "$tmp/h2/rank-1/state.json" kill "${long[@]}" --save-state "$tmp/@HOST@" \
  --state-every 10
status=$(json kill-h1.json 'r["status"]')
message=$(json kill-h1.json 'r["failure"]["message"]')
took=$(elapsed "$(cat kill.hurt)" "$(cat kill-h1.end)")
echo "node 0 ended $took s after the kill (--dist-timeout $timeout_s): $status: ${message:0:120}"
[[ $status == crashed ]] || fail "after the kill node 0 recorded '$status', not crashed"
[[ $message == *"lost host gs-host2 (rank 1)"* ]] || fail "the failure does not name gs-host2"
[[ $("$py" -c "print(float('$took') <= $timeout_s)") == True ]] ||
  fail "node 0 took $took s to end, more than --dist-timeout $timeout_s"
# Each host kept its rank's state in a folder of its own (a node-local disk), and resumes
# from it.
[[ -d h1/rank-0 && -d h2/rank-1 && ! -e h1/rank-1 && ! -e h2/rank-0 ]] ||
  fail "the hosts' state folders do not hold their own ranks' states alone"
both resumed "${long[@]}" --save-state "$tmp/@HOST@" --state-every 10 --resume "$tmp/@HOST@"
[[ $(cat resumed-h1.rc) == 0 ]] || fail "the resumed run failed: $(tail -3 resumed-h1.log)"
if [[ -s resumed-h1.json && -s whole-h1.json ]]; then
  echo "resumed at step $(json resumed-h1.json 'r["resumed_from_steps"]')"
  [[ $(losses resumed-h1.json) == "$(losses whole-h1.json)" ]] ||
    fail "the resumed run's losses differ from the uninterrupted run's"
fi

echo "== kill4: host 2's two ranks killed mid-run, on 2 hosts x 2 ranks"
# Later than on 2 x 1: four ranks take longer to meet, and a kill before they train is no
# kill mid-run.
hurt_run kill4 6 kill "${long[@]}" --nproc-per-node 2 --threads 1
message=$(json kill4-h1.json 'r["failure"]["message"]')
echo "node 0: ${message:0:110}"
[[ $message == *"lost host gs-host2 (ranks 2, 3)"* && $message != *gs-host1* ]] ||
  fail "the failure does not name gs-host2's ranks 2 and 3 alone: $message"

echo "== cut: host 2's link cut mid-run"
hurt_run cut 3 cut "${long[@]}"
status=$(json cut-h1.json 'r["status"]')
message=$(json cut-h1.json 'r["failure"]["message"]')
took1=$(elapsed "$(cat cut.hurt)" "$(cat cut-h1.end)")
took2=$(elapsed "$(cat cut.hurt)" "$(cat cut-h2.end)")
echo "node 0 ended after $took1 s, node 1 after $took2 s (--dist-timeout $timeout_s): $status"
[[ $status == crashed ]] || fail "after the cut node 0 recorded '$status', not crashed"
[[ $message == *"lost host gs-host2 (rank 1)"* ]] || fail "node 0's failure does not name gs-host2"
grep -q 'lost node 0: its meeting point at' cut-h2.log || fail "host 2 does not name node 0"
[[ $(cat cut-h2.rc) == 1 ]] || fail "host 2 exited $(cat cut-h2.rc) after the cut, not 1"
for t in "$took1" "$took2"; do
  [[ $("$py" -c "print(float('$t') <= $timeout_s)") == True ]] ||
    fail "a host took $t s to end after the cut, more than --dist-timeout $timeout_s"
done

echo "== throttle: host 2's link throttled to 20mbit for 4 s mid-run"
hurt_run slow 3 throttle "${run_settings[@]}" --steps 400 --shard ddp --dist-timeout 60
[[ $(json slow-h1.json 'r["status"]') == ok ]] ||
  fail "the throttled run ended $(json slow-h1.json 'r["status"]'), not ok"
# The step at which step times rose 5-fold over the median of the steps before.
json slow-h1.json '(lambda t: next((f"step {i + 1}: {t[i] * 1e3:.0f} ms against a median of "
  f"{sorted(t[:i])[i // 2] * 1e3:.1f} ms before" for i in range(20, len(t))
  if t[i] > 5 * sorted(t[:i])[i // 2]), "no step slowed"))([s["time_s"] for s in r["steps"]])' |
  tee slow.txt
grep -q '^step' slow.txt || fail "the record's step times do not show the throttle"

[[ $failures -eq 0 ]] || {
  echo "$failures check(s) failed" >&2
  exit 1
}
echo "all checks hold"
