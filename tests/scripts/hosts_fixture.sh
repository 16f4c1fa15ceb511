#!/usr/bin/env bash
# The CTest fixture around the suites that need test hosts (scripts/hosts.sh):
#   tests/scripts/hosts_fixture.sh start HOSTS_SH DIR   remove the hosts of earlier runs whose
#       owner is gone (clean-stale), note the root namespace's links and namespaces, start 2
#       hosts in DIR (exit 77, skipped, where namespaces cannot be made here)
#   tests/scripts/hosts_fixture.sh stop HOSTS_SH DIR    stop them, then fail when the root
#       namespace's `ip -o link` differs from the note, or `ip netns list` still names one of
#       DIR's namespaces, or /etc/netns still holds one of their name tables
# The hosts outlive the start (their owner is none: only DIR counts for clean-stale).
set -uo pipefail

[[ $# -eq 3 && ($1 == start || $1 == stop) ]] || {
  echo "usage: tests/scripts/hosts_fixture.sh start|stop HOSTS_SH DIR" >&2
  exit 2
}
cmd=$1
hosts=$2
dir=$3
note=$dir.links
links() { ip -o link 2> /dev/null | sed 's/^[0-9]*: //' | sort; }

if [[ $cmd == start ]]; then
  bash "$hosts" clean-stale > /dev/null 2>&1
  links > "$note"
  GRADSCOPE_HOSTS_OWNER=0 bash "$hosts" start 2 "$dir"
  exit $?
fi

prefix=$(cat "$dir/prefix" 2> /dev/null)
bash "$hosts" stop "$dir"
[[ -f $note ]] || exit 0  # no start ran
left=0
if [[ -n $prefix ]] && ip netns list 2> /dev/null | grep -q -- "^$prefix-"; then
  echo "hosts_fixture: namespaces left behind: $(ip netns list | grep -- "^$prefix-")" >&2
  left=1
fi
if [[ -n $prefix ]] && compgen -G "/etc/netns/$prefix-*" > /dev/null; then
  echo "hosts_fixture: name tables left behind: $(echo /etc/netns/"$prefix"-*)" >&2
  left=1
fi
if ! diff <(cat "$note") <(links) > /dev/null; then
  echo "hosts_fixture: the root namespace's links changed:" >&2
  diff <(cat "$note") <(links) >&2
  left=1
fi
rm -f -- "$note"
[[ $left -eq 0 ]] && echo "hosts_fixture: nothing left behind (ip netns list, ip -o link)"
exit $left
