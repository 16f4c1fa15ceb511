#!/usr/bin/env bash
# scripts/hosts.sh on this machine: hosts reach each other over TCP at the rate asked (within
# 20%, measured with a few MB), `rate` changes it in each direction, `cut` makes a connect time
# out and `mend` brings it back, each host has a host name of its own, two starts at once do not
# clash, stop removes everything (processes killed with -9 or not, a start killed halfway
# included), clean-stale removes the hosts whose owner or DIR is gone and keeps the others, the
# root namespace's links and addresses never change, and bad input is refused with exit 2.
# Exit 77 where hosts cannot be made here (not root, no iproute2, namespaces refused).
#   tests/scripts/hosts_test.sh [HOSTS_SH]
# PYTHON (default python3) runs the small TCP server and client.
set -uo pipefail

if [[ $# -gt 1 ]]; then
  echo "usage: tests/scripts/hosts_test.sh [HOSTS_SH]" >&2
  exit 2
fi
hosts=${1:-$(dirname "$0")/../../scripts/hosts.sh}
py=${PYTHON:-python3}
command -v "$py" > /dev/null 2>&1 || { echo "hosts_test: no $py" >&2; exit 1; }
tmp=$(mktemp -d)
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
bg_pids=()
cleanup() {
  local d
  for d in "$tmp"/d*; do
    [[ -d $d ]] && bash "$hosts" stop "$d" > /dev/null 2>&1
  done
  [[ ${#bg_pids[@]} -gt 0 ]] && kill "${bg_pids[@]}" 2> /dev/null
  rm -rf -- "$tmp"
}
trap cleanup EXIT

# The TCP tool. `serve PORT`: take connections one after the other, count the bytes of each
# until its end and answer the count. `send HOST PORT BYTES`: send BYTES, wait for the answer
# and print the throughput in Mbit/s (connect to answer). `connect HOST PORT`: exit 0 when a
# connection is made within 1 s.
cat > "$tmp/tcp.py" << 'EOF'
import socket, sys, time
mode = sys.argv[1]
if mode == "serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    s.listen(8)
    while True:
        c, _ = s.accept()
        n = 0
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            n += len(b)
        c.sendall(str(n).encode())
        c.close()
host, port = sys.argv[2], int(sys.argv[3])
if mode == "connect":
    socket.create_connection((host, port), timeout=1).close()
    sys.exit(0)
size = int(sys.argv[4])
deadline = time.monotonic() + 5
while True:  # the server may still be starting
    try:
        t0 = time.monotonic()
        c = socket.create_connection((host, port), timeout=20)
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
chunk = b"x" * (1 << 18)
left = size
while left > 0:
    c.sendall(chunk[:min(left, len(chunk))])
    left -= len(chunk)
c.shutdown(socket.SHUT_WR)
got = int(c.recv(64) or b"0")
t = time.monotonic() - t0
if got != size:
    sys.exit(f"sent {size} bytes, the server counted {got}")
print(f"{size * 8 / t / 1e6:.1f}")
EOF

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# serve DIR K: the server in host K of DIR, in the background; its pid in $server.
serve() {
  bash "$hosts" exec "$1" "$2" "$py" "$tmp/tcp.py" serve 5001 &
  server=$!
  bg_pids+=("$server")
}
# measure DIR FROM TO MBIT WHAT: send about 0.6 s of MBIT from host FROM to host TO's server,
# check the throughput is within 20% of MBIT (above 2 * -MBIT when MBIT is negative: no limit).
measure() {
  local bytes mbit to_addr
  bytes=$(($4 < 0 ? 100000000 : $4 * 75000))
  to_addr=$(bash "$hosts" addr "$1" "$3")
  mbit=$(bash "$hosts" exec "$1" "$2" "$py" "$tmp/tcp.py" send "$to_addr" 5001 "$bytes") ||
    { fail "$5: no transfer from host $2 to $3"; return; }
  echo "hosts_test: $5: $mbit Mbit/s ($bytes bytes)"
  if [[ $4 -lt 0 ]]; then
    awk -v m="$mbit" -v r="$((-2 * $4))" 'BEGIN { exit !(m > r) }' ||
      fail "$5: $mbit Mbit/s, not above $((-2 * $4))"
  else
    awk -v m="$mbit" -v r="$4" 'BEGIN { exit !(m >= 0.8 * r && m <= 1.2 * r) }' ||
      fail "$5: $mbit Mbit/s, not within 20% of $4"
  fi
}
# kill9 PID: kill -9 a background job and wait for it, without the shell's note that it was
# killed.
kill9() {
  exec 4>&2 2> /dev/null
  kill -9 "$1"
  wait "$1"
  exec 2>&4 4>&-
}
# expect_bad TEXT ARGS...: hosts.sh ARGS exits 2 and names TEXT.
expect_bad() {
  local text=$1 code=0
  shift
  bash "$hosts" "$@" > /dev/null 2> "$tmp/err" || code=$?
  [[ $code -eq 2 ]] || fail "hosts.sh $*: exit $code, expected 2"
  grep -qF -- "$text" "$tmp/err" || fail "hosts.sh $*: '$text' not in: $(cat "$tmp/err")"
}
# gone DIR PREFIX: no namespace of PREFIX is left and DIR holds no record.
gone() {
  ip netns list | grep -q "^$2-" && fail "namespaces of $1 ($2) left after stop"
  [[ ! -e $1/hosts && ! -e $1/prefix ]] || fail "$1 still holds a record after stop"
}

links_before=$(ip -o link)
addrs_before=$(ip -o addr)
d=$tmp/d1
t0=$(now)
code=0
bash "$hosts" start 2 "$d" 50mbit 2> "$tmp/err" || code=$?
t1=$(now)
if [[ $code -eq 77 ]]; then
  echo "hosts_test: skipped: $(cat "$tmp/err")"
  exit 77
fi
[[ $code -eq 0 ]] || { echo "FAIL: start: exit $code: $(cat "$tmp/err")" >&2; exit 1; }
echo "hosts_test: start of 2 hosts took $(elapsed "$t0" "$t1") s"
prefix=$(cat "$d/prefix")

# --- what start made ---
[[ $(ip -o link) == "$links_before" ]] || fail "the root namespace's links changed while hosts run"
[[ $(ip -o addr) == "$addrs_before" ]] || fail "the root namespace's addresses changed"
ifname=$(bash "$hosts" ifname)
[[ $ifname == gs0 ]] || fail "ifname: '$ifname'"
for k in 1 2; do
  addr=$(bash "$hosts" addr "$d" $k)
  [[ $addr =~ ^10\.213\.[0-9]+\.$k$ ]] || fail "addr of host $k: '$addr'"
  grep -qx "$k $prefix-h$k $addr $ifname" "$d/hosts" || fail "host $k not in $(cat "$d/hosts")"
  own=$(bash "$hosts" exec "$d" $k ip -o -4 addr show dev "$ifname")
  [[ $own == *" inet $addr/24 "* ]] || fail "host $k's $ifname holds '$own', not $addr"
done
name1=$(bash "$hosts" exec "$d" 1 hostname)
name2=$(bash "$hosts" exec "$d" 2 hostname)
echo "hosts_test: host names $name1, $name2 (this machine: $(hostname))"
[[ -n $name1 && $name1 != "$name2" && $name1 != "$(hostname)" ]] ||
  fail "host names are not their own: '$name1', '$name2'"
code=0
bash "$hosts" exec "$d" 1 sh -c 'exit 3' || code=$?
[[ $code -eq 3 ]] || fail "exec passes on exit 3 as $code"
code=0
# Its stderr dropped: the shell's note that its command was terminated.
{ bash "$hosts" exec "$d" 1 sh -c 'kill -TERM $$'; } 2> /dev/null || code=$?
[[ $code -eq 143 ]] || fail "exec passes on a SIGTERM as exit $code, not 143"
args=$(bash "$hosts" exec "$d" 1 printf '%s|' 'a b' '$(echo x)' ';' '*')
[[ $args == 'a b|$(echo x)|;|*|' ]] || fail "exec's arguments came through as '$args'"

# --- throughput, rates, cut and mend ---
serve "$d" 2
measure "$d" 1 2 50 "50mbit from start"
for k in 1 2; do bash "$hosts" rate "$d" $k 400mbit || fail "rate $k 400mbit"; done
measure "$d" 1 2 400 "400mbit after rate"
# Each end alone: host 1's limit is its sending side, host 2's its receiving side.
bash "$hosts" rate "$d" 2 off || fail "rate 2 off"
measure "$d" 1 2 400 "400mbit on the sender's link only"
bash "$hosts" rate "$d" 1 off && bash "$hosts" rate "$d" 2 200mbit || fail "rate 1 off, 2 200mbit"
measure "$d" 1 2 200 "200mbit on the receiver's link only"
bash "$hosts" rate "$d" 2 off || fail "rate 2 off"
measure "$d" 1 2 -400 "no limit"
to=$(bash "$hosts" addr "$d" 2)
bash "$hosts" cut "$d" 2 || fail "cut"
t0=$(now)
if bash "$hosts" exec "$d" 1 "$py" "$tmp/tcp.py" connect "$to" 5001 2> /dev/null; then
  fail "a connect to a cut host succeeded"
else
  echo "hosts_test: a connect to the cut host failed after $(elapsed "$t0" "$(now)") s"
fi
bash "$hosts" mend "$d" 2 || fail "mend"
bash "$hosts" exec "$d" 1 "$py" "$tmp/tcp.py" connect "$to" 5001 ||
  fail "no connect after mend"
measure "$d" 1 2 -400 "after mend"

# --- stop, after a kill -9 of the server and with a process still running ---
bash "$hosts" exec "$d" 1 sleep 300 &
sleeper=$!
bg_pids+=("$sleeper")
sleep 0.3
kill9 "$server"
# exec replaced itself with the server: the job's pid was the server's, in host 2.
[[ -z $(ip netns pids "$prefix-h2") ]] || fail "kill -9 of exec's pid left host 2's server"
t0=$(now)
bash "$hosts" stop "$d" || fail "stop: exit $?"
echo "hosts_test: stop of 2 hosts took $(elapsed "$t0" "$(now)") s"
# A process that ended and was not yet waited for is a zombie (state Z).
state=$(sed -n 's/.*) \([A-Z]\).*/\1/p' "/proc/$sleeper/stat" 2> /dev/null)
[[ -z $state || $state == Z ]] || fail "a process in a host outlived stop (state $state)"
wait "$sleeper" 2> /dev/null
bg_pids=()
gone "$d" "$prefix"
bash "$hosts" stop "$d" || fail "a second stop: exit $?"
bash "$hosts" stop "$tmp/never" || fail "stop of a DIR never started: exit $?"

# --- a start killed halfway (kill -9, so it cleans nothing itself) ---
d=$tmp/d2
bash "$hosts" start 8 "$d" 1gbit > /dev/null 2>&1 &
starter=$!
for _ in $(seq 200); do
  [[ -s $d/prefix ]] && ip netns list | grep -q "^$(cat "$d/prefix")-h3" && break
  sleep 0.01
done
kill9 "$starter"
prefix=$(cat "$d/prefix" 2> /dev/null)
echo "hosts_test: a start killed -9 left $(ip netns list | grep -c "^$prefix-") namespaces"
bash "$hosts" stop "$d" || fail "stop after a start killed halfway: exit $?"
[[ -n $prefix ]] && gone "$d" "$prefix"

# --- two starts at once ---
bash "$hosts" start 3 "$tmp/d3" 100mbit > /dev/null 2> "$tmp/err3" &
first=$!
bash "$hosts" start 3 "$tmp/d4" 100mbit > /dev/null 2> "$tmp/err4" ||
  fail "start d4: $(cat "$tmp/err4")"
wait "$first" || fail "start d3: $(cat "$tmp/err3")"
p3=$(cat "$tmp/d3/prefix")
p4=$(cat "$tmp/d4/prefix")
a3=$(bash "$hosts" addr "$tmp/d3" 1)
a4=$(bash "$hosts" addr "$tmp/d4" 1)
echo "hosts_test: two starts at once: $p3 on $a3/24, $p4 on $a4/24"
[[ $p3 != "$p4" && ${a3%.*} != "${a4%.*}" ]] || fail "two starts share $p3 or ${a3%.*}"
for d in "$tmp/d3" "$tmp/d4"; do
  serve "$d" 3
  measure "$d" 2 3 100 "100mbit in ${d##*/}"
done

# --- clean-stale: an owner that exits, a DIR removed, an owner alive ---
sleep 300 &
owner=$!
bg_pids+=("$owner")
GRADSCOPE_HOSTS_OWNER=$owner bash "$hosts" start 2 "$tmp/d5" > /dev/null || fail "start d5"
bash "$hosts" start 2 "$tmp/d6" > /dev/null || fail "start d6"
p5=$(cat "$tmp/d5/prefix")
p6=$(cat "$tmp/d6/prefix")
rm -rf -- "$tmp/d6"
bash "$hosts" clean-stale 2> "$tmp/err" || fail "clean-stale: exit $?"
grep -q "removing $p6 " "$tmp/err" || fail "clean-stale did not name $p6: $(cat "$tmp/err")"
ip netns list | grep -q "^$p6-" && fail "clean-stale left the hosts of a removed DIR"
for p in "$p3" "$p4" "$p5"; do
  ip netns list | grep -q "^$p-sw" || fail "clean-stale removed $p, whose owner runs"
done
kill "$owner"
wait "$owner" 2> /dev/null
bash "$hosts" clean-stale 2> /dev/null || fail "clean-stale: exit $?"
ip netns list | grep -q "^$p5-" && fail "clean-stale left the hosts of an owner that exited"
ip netns list | grep -q "^$p3-sw" || fail "clean-stale removed $p3"
bash "$hosts" stop "$tmp/d5" || fail "stop d5: exit $?"
gone "$tmp/d5" "$p5"
t0=$(now)
bash "$hosts" stop "$tmp/d3" && bash "$hosts" stop "$tmp/d4" || fail "stop d3, d4"
echo "hosts_test: stop of two starts of 3 hosts took $(elapsed "$t0" "$(now)") s"
wait "${bg_pids[@]}" 2> /dev/null
bg_pids=()
gone "$tmp/d3" "$p3"
gone "$tmp/d4" "$p4"

# --- bad input ---
expect_bad "usage:" ""
expect_bad "usage:" launch 2 "$tmp/d7"
expect_bad "usage:" start 2
expect_bad "N '1'" start 1 "$tmp/d7"
expect_bad "N '9'" start 9 "$tmp/d7"
expect_bad "N 'x2'" start x2 "$tmp/d7"
expect_bad "RATE '10xbit'" start 2 "$tmp/d7" 10xbit
expect_bad "RATE '1e3mbit'" start 2 "$tmp/d7" 1e3mbit
expect_bad "RATE '100mbit;'" start 2 "$tmp/d7" '100mbit;'
expect_bad "DIR '$tmp/d 7'" start 2 "$tmp/d 7"
expect_bad "DIR '$tmp/d\$7'" start 2 "$tmp/d\$7"
GRADSCOPE_HOSTS_OWNER=me expect_bad "GRADSCOPE_HOSTS_OWNER 'me'" start 2 "$tmp/d7"
bash "$hosts" start 2 "$tmp/d8" > /dev/null || fail "start d8"
expect_bad "K '3'" addr "$tmp/d8" 3
expect_bad "K '0'" exec "$tmp/d8" 0 true
expect_bad "K '1x'" cut "$tmp/d8" 1x
expect_bad "RATE 'fast'" rate "$tmp/d8" 1 fast
expect_bad "usage:" exec "$tmp/d8" 1
code=0
bash "$hosts" addr "$tmp/d7" 1 > /dev/null 2>&1 || code=$?
[[ $code -eq 1 ]] || fail "addr of a DIR without hosts: exit $code, expected 1"
bash "$hosts" stop "$tmp/d8" || fail "stop d8"
[[ -d $tmp/d7 ]] && fail "a refused start made its DIR"

# --- the root namespace as before ---
[[ $(ip -o link) == "$links_before" ]] || fail "the root namespace's links differ after stop"
[[ $(ip -o addr) == "$addrs_before" ]] || fail "the root namespace's addresses differ after stop"

if [[ $failures -gt 0 ]]; then
  echo "hosts_test: $failures failed" >&2
  exit 1
fi
echo "hosts_test: every check passed"
