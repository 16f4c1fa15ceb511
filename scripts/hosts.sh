#!/usr/bin/env bash
# Test hosts on this machine, for training across several hosts (ranks meeting over TCP):
# each host is a network namespace of its own, wired to a switch.
#   scripts/hosts.sh start N DIR [RATE]  make hosts 1..N (2 <= N <= 8); exit 0 when they reach
#                                        each other, 77 when namespaces cannot be made here
#                                        (the reason on stderr), 1 on another failure; a failed
#                                        start leaves nothing behind
#   scripts/hosts.sh stop DIR            remove what `start DIR` made, the processes still
#                                        running in its hosts first (always exit 0)
#   scripts/hosts.sh exec DIR K CMD [ARG...]  run CMD in host K (it replaces the script, so its
#                                        exit status and signals are CMD's own)
#   scripts/hosts.sh addr DIR K          print host K's address
#   scripts/hosts.sh ifname              print the hosts' interface name (gs0), for
#                                        GLOO_SOCKET_IFNAME
#   scripts/hosts.sh rate DIR K RATE     change host K's link rate, both directions
#   scripts/hosts.sh cut DIR K           pull host K's cable: its link goes down
#   scripts/hosts.sh mend DIR K          plug it back in
#   scripts/hosts.sh clean-stale         remove the hosts of every earlier start whose DIR is
#                                        gone or whose owner process has exited
#
# Layout. A start picks a prefix gs-<8 hex digits> and makes the namespaces PREFIX-sw (the
# switch: a bridge named sw) and PREFIX-h1..PREFIX-hN (the hosts). Host K's interface is gs0,
# one end of a veth pair whose other end is the switch's port hK; its address is 10.213.S.K/24,
# where S (1..254) is a subnet no other running start uses. The veth pairs are made inside the
# switch's namespace and their host ends moved to the hosts, so the root namespace sees nothing
# (its `ip link` and `ip addr` do not change). Loopback is up in each host; IPv6 is off there,
# so gs0 holds one address only (a library that takes an interface's first address, as Gloo
# does, gets the IPv4 one).
#
# DIR holds the record of a start:
#   DIR/prefix   the namespaces' prefix (gs-<hex>), written before any namespace is made
#   DIR/hosts    one line per host: index, namespace, address, interface, e.g.
#                "1 gs-0a1b2c3d-h1 10.213.4.1 gs0"; lines starting with '#' are comments
#   DIR/owner    the owner process (see clean-stale) as "PID START_TIME"
#
# Rate. RATE is a tc rate, digits and a unit: bit, kbit, mbit, gbit, tbit (bits per second)
# or bps, kbps, mbps, gbps, tbps (bytes per second), from 8kbit to 1tbit, e.g. 100mbit or
# 1gbit; `off` (the default) sets no limit. A limit is a token bucket filter (tbf) on the
# egress of both ends of the host's link, so that sending and receiving are both limited. Its
# bucket (burst) holds 2 ms of the rate, at least 16 KiB, so that timer slack does not keep it
# under the rate; its queue holds the bucket and 50 ms more (at least 64 KiB), a switch's
# buffer. Measured TCP throughput is about 96% of the rate from 10mbit to 10gbit (the rest is
# the Ethernet, IP and TCP headers tbf counts). Only the rate is modelled, no delay or loss:
# netem, which would add them, is not in every kernel.
#
# Host names. `exec` runs CMD in a UTS namespace of its own named gs-hostK, so gethostname()
# differs from host to host (the names are the same in every DIR: hosts of different starts
# never meet). Every host resolves every host's name to its address through
# /etc/netns/PREFIX-hK/hosts, which `ip netns exec` shows as its /etc/hosts (removed by stop).
#
# Cut and mend. `cut` sets the switch's port of the host down: the host keeps its interface,
# its address and its routes, but the link has no carrier, so packets it sends are lost, a
# connect times out and an open TCP connection retransmits until `mend` sets the port up
# again, as when a cable is pulled and plugged back in.
#
# Stale hosts. The switch's bridge carries the start's record in its alias: the owner's PID and
# start time, the subnet and DIR. The owner is the process that ran `start` (its parent), or
# the PID in GRADSCOPE_HOSTS_OWNER (0: none, only DIR counts). `clean-stale` removes every
# prefix whose switch is missing or unrecorded, whose DIR is gone or records another prefix,
# or whose owner has exited, with the processes in it; a test run that crashed (kill -9) leaves
# nothing behind past the next clean-stale, which a test harness runs before its starts (start
# does not, so that hosts made by hand from a shell that exited live on until their stop).
# Starts and clean-stale take the lock /run/lock/gradscope-hosts.lock, so neither sees the
# other's start half made.
set -uo pipefail

ifname=gs0
net=10.213
lock_file=/run/lock/gradscope-hosts.lock

usage() {
  cat >&2 <<EOF
usage: $0 start N DIR [RATE] | stop DIR | exec DIR K CMD [ARG...] | addr DIR K | ifname
       | rate DIR K RATE | cut DIR K | mend DIR K | clean-stale
EOF
  exit 2
}
bad() {
  echo "hosts: error: $*" >&2
  exit 2
}
skip() {
  echo "hosts: skipped: $*" >&2
  exit 77
}
die() {
  echo "hosts: error: $*" >&2
  exit 1
}

# check_dir DIR: sets $dir to DIR made absolute, a plain path (it goes into an alias with
# spaces as separators, and into messages), at most 200 bytes (an alias holds 255).
check_dir() {
  dir="$1"
  [ -n "$dir" ] || bad "an empty DIR"
  case "$dir" in
    /*) ;;
    *) dir="$PWD/$dir" ;;
  esac
  case "$dir" in
    *[!A-Za-z0-9/._+,=@~-]*) bad "DIR '$dir' holds a character other than A-Za-z0-9/._+,=@~-" ;;
  esac
  [ "${#dir}" -le 200 ] || bad "DIR '$dir' is longer than 200 bytes"
}

# check_rate RATE: sets $rate_bits to RATE in bits per second (0 for off).
check_rate() {
  local digits per
  if [ "$1" = off ]; then
    rate_bits=0
    return 0
  fi
  [[ $1 =~ ^([0-9]{1,12})(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] ||
    bad "RATE '$1' is not a tc rate such as 100mbit, 1gbit or 500kbit, nor off"
  digits=$((10#${BASH_REMATCH[1]}))
  case "${BASH_REMATCH[2]}" in
    bit) per=1 ;;
    kbit) per=1000 ;;
    mbit) per=1000000 ;;
    gbit) per=1000000000 ;;
    tbit) per=1000000000000 ;;
    bps) per=8 ;;
    kbps) per=8000 ;;
    mbps) per=8000000 ;;
    gbps) per=8000000000 ;;
    tbps) per=8000000000000 ;;
  esac
  # Compared before multiplying, so that no digits overflow 64 bits.
  [ "$digits" -le $((1000000000000 / per)) ] || bad "RATE '$1' is above 1tbit"
  rate_bits=$((digits * per))
  [ "$rate_bits" -ge 8000 ] || bad "RATE '$1' is below 8kbit"
}

# read_hosts: sets $prefix and $count from DIR's record; exit 1 when DIR holds no hosts.
read_hosts() {
  [ -f "$dir/hosts" ] && [ -f "$dir/prefix" ] || die "'$dir' holds no running hosts"
  prefix="$(cat "$dir/prefix")"
  [[ $prefix =~ ^gs-[0-9a-f]{8}$ ]] || die "'$dir/prefix' holds no prefix"
  count="$(grep -c '^[1-8] ' "$dir/hosts")"
  [ "$count" -ge 2 ] || die "'$dir/hosts' lists no hosts"
}

# check_host DIR K: DIR must hold running hosts and K be one of them; sets $dir, $prefix,
# $count, $k, $ns (host K's namespace) and $sw (the switch's).
check_host() {
  check_dir "$1"
  [[ $2 =~ ^[1-8]$ ]] || bad "K '$2' is not a host number (1..8)"
  read_hosts
  [ "$2" -le "$count" ] || bad "K '$2' is not a host of $dir (1..$count)"
  k="$2"
  ns="$prefix-h$k"
  sw="$prefix-sw"
}

# set_rate NAMESPACE DEVICE: the tbf of $rate_bits on DEVICE's egress, or none when 0.
set_rate() {
  local burst limit left
  if [ "$rate_bits" -eq 0 ]; then
    # Deleting a root qdisc that is not there fails; what counts is that none is left.
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null
    left="$(tc -n "$1" qdisc show dev "$2")" || return 1
    [[ $left != *"qdisc tbf"* ]]
    return
  fi
  # 2 ms of the rate (bits / 8 / 500), at least 16 KiB; the queue 50 ms more (bits / 8 / 20),
  # at least 64 KiB: a switch's buffer, deep enough that TCP's window fills it without drops
  # (a drop at a low rate costs a retransmission timeout of 200 ms or more).
  burst=$((rate_bits / 4000))
  [ "$burst" -ge 16384 ] || burst=16384
  limit=$((rate_bits / 160))
  [ "$limit" -ge 65536 ] || limit=65536
  limit=$((burst + limit))
  tc -n "$1" qdisc replace dev "$2" root tbf rate "${rate_bits}bit" burst "$burst" \
    limit "$limit"
}

# netns_names: the names of all network namespaces, one a line.
netns_names() { ip netns list 2>/dev/null | cut -d' ' -f1; }

# kill_in NAMESPACE: end the processes running in NAMESPACE (TERM, then KILL after 2 s).
kill_in() {
  local pids
  pids="$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')"
  [ -n "${pids// /}" ] || return 0
  # shellcheck disable=SC2086 # one word per pid
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 20); do
    [ -z "$(ip netns pids "$1" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  for _ in $(seq 30); do
    pids="$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')"
    [ -n "${pids// /}" ] || return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.1
  done
}

# remove_prefix PREFIX: the hosts' namespaces, then the switch's (which holds the record that
# clean-stale reads, so it goes last), each after the processes in it.
remove_prefix() {
  local name
  for name in $(netns_names | grep -E "^$1-h[0-9]+\$") $(netns_names | grep -Fx "$1-sw"); do
    kill_in "$name"
    ip netns del "$name" 2>/dev/null
  done
  # The hosts' name tables (`ip netns exec` shows /etc/netns/NAME/hosts as /etc/hosts).
  rm -rf -- /etc/netns/"$1"-h[0-9]* 2>/dev/null
}

# record_of PREFIX: the record in PREFIX's switch ("gradscope-hosts owner=... dir=..."), or
# nothing.
record_of() {
  ip -n "$1-sw" -o link show dev sw 2>/dev/null |
    sed -n 's/.*\\ *alias \(gradscope-hosts .*\)$/\1/p'
}

# field RECORD NAME: the value of NAME= in RECORD.
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }

stop_dir() {
  local p
  {
    [ -f "$dir/prefix" ] && cat "$dir/prefix" 2>/dev/null
    # A DIR whose record went missing: the switches that name it.
    for p in $(netns_names | sed -n 's/^\(gs-[0-9a-f]\{8\}\)-sw$/\1/p'); do
      [ "$(field "$(record_of "$p")" dir)" = "$dir" ] && echo "$p"
    done
  } | grep -E '^gs-[0-9a-f]{8}$' | sort -u | while read -r p; do
    remove_prefix "$p"
  done
  rm -f "$dir/hosts" "$dir/prefix" "$dir/owner" "$dir/hosts.tmp"
}

# start_time PID: the start time of process PID (field 22 of its stat), or nothing.
start_time() {
  sed -n 's/.*) [^ ]* //p' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f19
}

# take_lock: 0 with the lock held on $lock_fd, 77 when the lock file cannot be opened (no
# right to), 1 when another process held the lock for 60 s.
take_lock() {
  mkdir -p "${lock_file%/*}" 2>/dev/null
  exec {lock_fd}>>"$lock_file" || return 77
  flock -w 60 "$lock_fd" || return 1
}

clean_stale() {
  local p record owner dir_of
  take_lock || die "cannot take the lock $lock_file"
  for p in $(netns_names | sed -n 's/^\(gs-[0-9a-f]\{8\}\)-\(sw\|h[0-9]*\)$/\1/p' | sort -u); do
    record="$(record_of "$p")"
    dir_of="$(field "$record" dir)"
    owner="$(field "$record" owner)"
    if [ -n "$record" ] && [ -n "$dir_of" ] && [ -d "$dir_of" ] &&
      [ "$(cat "$dir_of/prefix" 2>/dev/null)" = "$p" ]; then
      case "$owner" in
        0:*) continue ;;
        *:*) [ "$(start_time "${owner%%:*}")" = "${owner#*:}" ] && continue ;;
      esac
    fi
    echo "hosts: removing $p (${dir_of:-no record}${owner:+, owner $owner})" >&2
    remove_prefix "$p"
  done
  exec {lock_fd}>&-
}

# owner_record: "PID:START_TIME" of the owner (GRADSCOPE_HOSTS_OWNER or the parent), "0:0" for
# none.
owner_record() {
  local pid="${GRADSCOPE_HOSTS_OWNER:-$PPID}" start
  [[ $pid =~ ^[0-9]{1,9}$ ]] || bad "GRADSCOPE_HOSTS_OWNER '$pid' is not a process id"
  if [ "$pid" -eq 0 ]; then
    echo "0:0"
    return 0
  fi
  start="$(start_time "$pid")"
  [ -n "$start" ] || bad "GRADSCOPE_HOSTS_OWNER '$pid' is no running process"
  echo "$pid:$start"
}

# make_switch OWNER: under the lock, picks a prefix no namespace has and a free subnet, writes
# DIR/prefix and makes the switch with its record; sets $prefix and $subnet. Exit 77 when a
# namespace or a bridge cannot be made here.
make_switch() {
  local used s err
  take_lock 2>/dev/null
  case $? in
    0) ;;
    77) give_up 77 "cannot open the lock $lock_file as $(id -un) (namespaces need root)" ;;
    *) give_up 1 "the lock $lock_file stayed taken for 60 s" ;;
  esac
  while :; do
    prefix="gs-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
    [[ $prefix =~ ^gs-[0-9a-f]{8}$ ]] || die "cannot read /dev/urandom"
    netns_names | grep -q "^$prefix-" || break
  done
  used=" "
  for s in $(netns_names | sed -n 's/^\(gs-[0-9a-f]\{8\}\)-sw$/\1/p'); do
    used+="$(field "$(record_of "$s")" subnet) "
  done
  for subnet in $(seq 1 254) none; do
    [[ $used == *" $subnet "* ]] || break
  done
  [ "$subnet" != none ] || give_up 1 "all 254 subnets of $net.0.0/16 are in use"
  echo "$prefix" >"$dir/prefix" || give_up 1 "cannot write $dir/prefix"
  err="$(ip netns add "$prefix-sw" 2>&1)" ||
    give_up 77 "cannot make a network namespace here (ip netns add: $err)"
  err="$(ip -n "$prefix-sw" link add name sw type bridge 2>&1)" ||
    give_up 77 "cannot make a bridge here (ip link add type bridge: $err)"
  ip -n "$prefix-sw" link set dev sw alias \
    "gradscope-hosts owner=$1 subnet=$subnet dir=$dir" &&
    ip -n "$prefix-sw" link set dev sw up && no_ipv6 "$prefix-sw" ||
    give_up 1 "cannot set up the switch"
  exec {lock_fd}>&-
}

# no_ipv6 NAMESPACE: IPv6 off in NAMESPACE (a kernel without IPv6 has it off already).
no_ipv6() {
  [ -e /proc/sys/net/ipv6 ] || return 0
  ip netns exec "$1" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 &&
    echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6'
}

# give_up CODE MESSAGE: remove what this start made (DIR too, when it made DIR and DIR is
# empty) and exit CODE: 77 where hosts cannot be made here, 1 on another failure.
give_up() {
  stop_dir
  [ "$made_dir" = 1 ] && rmdir "$dir" 2>/dev/null
  if [ "$1" -eq 77 ]; then
    echo "hosts: skipped: $2" >&2
  else
    echo "hosts: error: $2" >&2
  fi
  exit "$1"
}

# make_host K: host K's namespace, its link to the switch, its address and its rate. The first
# host's veth pair and tbf tell whether this kernel has them: exit 77 when not.
make_host() {
  local k="$1" ns="$prefix-h$1" sw="$prefix-sw" err
  ip netns add "$ns" || give_up 1 "cannot make the namespace $ns"
  ip -n "$ns" link set dev lo up && no_ipv6 "$ns" || give_up 1 "cannot set up $ns"
  if ! err="$(ip -n "$sw" link add name "h$k" type veth peer name "$ifname" netns "$ns" 2>&1)"
  then
    [ "$k" -ne 1 ] || give_up 77 "cannot make a veth pair here ($err)"
    give_up 1 "cannot link $ns to the switch: $err"
  fi
  ip -n "$sw" link set dev "h$k" master sw up &&
    ip -n "$ns" addr add "$net.$subnet.$k/24" dev "$ifname" &&
    ip -n "$ns" link set dev "$ifname" up || give_up 1 "cannot set up the link of $ns"
  if [ "$rate_bits" -gt 0 ]; then
    err="$( (set_rate "$ns" "$ifname" && set_rate "$sw" "h$k") 2>&1)" || {
      [ "$k" -ne 1 ] || give_up 77 "cannot limit a link's rate with tbf here ($err)"
      give_up 1 "cannot limit the rate of $ns: $err"
    }
  fi
}

# wait_ready N: every port of the switch forwards and every host's link is up (5 s at most).
wait_ready() {
  local k up
  for _ in $(seq 50); do
    up="$(bridge -n "$prefix-sw" link show 2>/dev/null | grep -c 'state forwarding')"
    for k in $(seq "$1"); do
      ip -n "$prefix-h$k" -o link show dev "$ifname" 2>/dev/null | grep -q 'LOWER_UP' ||
        up=-1
    done
    [ "$up" -eq "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

start() {
  local n="$1" owner k
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 8 ] || bad "N '$n' is not 2..8"
  check_dir "$2"
  check_rate "${3:-off}"
  owner="$(owner_record)" || exit 2
  command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed"
  if [ "$rate_bits" -gt 0 ]; then
    command -v tc >/dev/null 2>&1 || skip "tc (iproute2) is not installed"
  fi
  command -v flock >/dev/null 2>&1 || skip "flock (util-linux) is not installed"
  # Hosts left by an earlier start in the same folder go first.
  stop_dir
  made_dir=0
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir" || die "cannot create $dir"
    made_dir=1
  fi
  trap 'give_up 1 "interrupted"' INT TERM HUP
  make_switch "$owner"
  for k in $(seq "$n"); do
    make_host "$k"
  done
  wait_ready "$n" || give_up 1 "the switch's ports did not come up within 5 s"
  # Each host resolves the others' names (gs-hostK) to their addresses, as a cluster's DNS
  # would: `ip netns exec` shows /etc/netns/NAME/hosts as the host's /etc/hosts.
  for k in $(seq "$n"); do
    mkdir -p "/etc/netns/$prefix-h$k" && {
      echo "127.0.0.1 localhost"
      for j in $(seq "$n"); do echo "$net.$subnet.$j gs-host$j"; done
    } >"/etc/netns/$prefix-h$k/hosts" || give_up 1 "cannot write /etc/netns/$prefix-h$k/hosts"
  done
  {
    echo "# host namespace address interface"
    for k in $(seq "$n"); do
      echo "$k $prefix-h$k $net.$subnet.$k $ifname"
    done
  } >"$dir/hosts.tmp" && echo "${owner/:/ }" >"$dir/owner" && mv "$dir/hosts.tmp" "$dir/hosts" ||
    give_up 1 "cannot write $dir/hosts"
  trap - INT TERM HUP
  echo "hosts: $n hosts in $prefix-h1..h$n, $net.$subnet.1..$n on $ifname, rate ${3:-off}"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    [ $# -ge 2 ] && [ $# -le 3 ] || usage
    start "$@"
    ;;
  stop)
    [ $# -eq 1 ] || usage
    check_dir "$1"
    stop_dir
    exit 0
    ;;
  exec)
    [ $# -ge 3 ] || usage
    check_host "$1" "$2"
    shift 2
    # The host name is written through /proc, inside the new UTS namespace; CMD and its
    # arguments stay an argument vector ("$@"), never a string the shell reads again.
    exec ip netns exec "$ns" unshare --uts -- sh -c \
      'printf "%s" "$1" >/proc/sys/kernel/hostname && shift && exec "$@"' \
      hosts-exec "gs-host$k" "$@"
    ;;
  addr)
    [ $# -eq 2 ] || usage
    check_host "$1" "$2"
    awk -v k="$k" '$1 == k { print $3 }' "$dir/hosts"
    ;;
  ifname)
    [ $# -eq 0 ] || usage
    echo "$ifname"
    ;;
  rate)
    [ $# -eq 3 ] || usage
    check_rate "$3"
    check_host "$1" "$2"
    set_rate "$ns" "$ifname" && set_rate "$sw" "h$k" || die "cannot set the rate of host $k"
    ;;
  cut | mend)
    [ $# -eq 2 ] || usage
    check_host "$1" "$2"
    state=down
    [ "$cmd" = mend ] && state=up
    ip -n "$sw" link set dev "h$k" "$state" || die "cannot set the switch's port h$k $state"
    ;;
  clean-stale)
    [ $# -eq 0 ] || usage
    clean_stale
    exit 0
    ;;
  *) usage ;;
esac
