#!/usr/bin/env bash
# The study's grid from scratch on this machine, then its report: what `make study` runs.
#   scripts/study.sh GRADSCOPE OUT WORK
# GRADSCOPE: the binary; OUT: the report folder to write (results/cpu-tiny is the committed
# one); WORK: a folder for the database, the run logs and the sweep's output. A killed study
# resumes where it stopped when run again with the same WORK (the sweep skips finished runs);
# remove WORK to start over. OUT is replaced only by a whole new report, and only when it is a
# report this script wrote (it holds made.md) or does not exist; it gets made.md: the command,
# the commit, the machine and every invocation on WORK with its sweep's wall time.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: scripts/study.sh GRADSCOPE OUT WORK" >&2
  exit 2
fi
gs=$1
out=$2
work=$3
# The grid beside this script, wherever it is run from (OUT and WORK are the caller's paths).
sweep_file=$(dirname -- "$0")/../configs/sweeps/study-cpu.toml

mkdir -p -- "$work"
out_abs=$(realpath -m -- "$out")
work_abs=$(realpath -m -- "$work")
# OUT is removed before the new report takes its place: never the database's folder or one
# above it, never a folder this script did not write.
if [[ $out_abs == / || $work_abs == "$out_abs" || $work_abs == "$out_abs"/* ||
  $out_abs == "$work_abs"/* ]]; then
  echo "study: refusing to write the report to '$out': it holds, or is inside, the work folder '$work'" >&2
  exit 2
fi
if [[ -e $out && ! -f $out/made.md ]]; then
  echo "study: refusing to replace '$out': it exists and is not a report of scripts/study.sh (no made.md)" >&2
  exit 2
fi

# The LibTorch a binary runs on, from its --version ("gradscope X on LibTorch Y").
libtorch_of() { "$1" --version | sed -n 's/.* on LibTorch //p'; }
# A resumed study keeps the runs it has: they must have run on this binary's LibTorch, or the
# report would mix runs of two (their losses differ in the last bits, their times more).
running=$(libtorch_of "$gs")
if [[ -f $work/study.db ]]; then
  others=$(sqlite3 -readonly "$work/study.db" \
    "SELECT DISTINCT coalesce(json_extract(record_json, '$.env.libtorch'), 'unknown') FROM runs" |
    grep -vxF -- "$running" || true)
  if [[ -n $others ]]; then
    echo "study: $work/study.db holds runs made on LibTorch $(echo "$others" | tr '\n' ' ')and" \
      "this gradscope runs on LibTorch $running: remove $work to start the study over" >&2
    exit 2
  fi
fi

# The source as the sweep starts (the tree may move on while it runs).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
if [[ $commit != unknown && -n $(git status --porcelain 2>/dev/null) ]]; then
  dirty=" (with uncommitted or untracked changes)"
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)
# The sweep's exit status, not tee's; its output is appended, so a resumed sweep keeps the log
# of the one before.
set +e
"$gs" sweep "$sweep_file" --db "$work/study.db" | tee -a "$work/sweep.txt"
sweep_status=${PIPESTATUS[0]}
set -e
t1=$(date +%s)
echo "- started $started at commit \`$commit\`$dirty: the sweep took $(( (t1 - t0) / 60 )) min $(( (t1 - t0) % 60 )) s (exit status $sweep_status)" \
  >> "$work/invocations.md"
# Exit 1 is a sweep whose runs ended, some of them not ok; a report of it is still wanted. But
# 1 is also a sweep that stopped on an error: only a grid with nothing left to run is reported.
left=$("$gs" sweep "$sweep_file" --db "$work/study.db" --dry-run | tail -n 1) ||
  left="the dry run to check it failed"
if [[ ($sweep_status -ne 0 && $sweep_status -ne 1) || $left != "0 to run,"* ]]; then
  echo "study: the sweep stopped with exit status $sweep_status ($left); run again to resume" >&2
  exit 1
fi

# The new report is made beside the old one, which it replaces only once it is whole.
next="$work/report.next"
rm -rf -- "$next"
"$gs" report "$work/study.db" --out "$next"
# One row per step of 240 runs: 13 MB as text, a third of that compressed (-n: no name or
# time in the header).
gzip -9 -n -f -- "$next/steps.csv"

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
{
  echo "# How this folder was made"
  echo
  echo "- command: \`scripts/study.sh $gs $out $work\` (what \`make study\` runs), sweep file \`configs/sweeps/study-cpu.toml\`"
  echo "- source tree at commit \`$commit\`$dirty when the last invocation started; \`$("$gs" --version)\`"
  echo "- LibTorch: \`$(libtorch_of "$gs")\` (\`make study-rerun\` compares bit for bit only on the same one)"
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "- \`steps.csv.gz\` is the report's \`steps.csv\`, compressed (the page's link to \`steps.csv\` means this file)"
  echo "- the report's first line gives the commits the runs were built from, when the first"
  echo "  run's training started (after its learning-rate search) and when the last finished"
  echo
  echo "Each \`make study\` on this database (a resumed sweep runs only what was left):"
  echo
  cat "$work/invocations.md"
} > "$next/made.md"
rm -rf -- "$out"
mkdir -p -- "$(dirname -- "$out")"
mv -- "$next" "$out"
echo "study: report in $out (made.md says how it was made)"
