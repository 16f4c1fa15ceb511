#!/usr/bin/env bash
# The study's grid from scratch on this machine, then its report: what `make study` runs.
#   scripts/study.sh GRADSCOPE OUT WORK
# GRADSCOPE: the binary; OUT: the report folder to write (results/cpu-tiny is the committed
# one); WORK: a folder for the database, the run logs and the sweep's output. A killed study
# resumes where it stopped when run again with the same WORK (the sweep skips finished runs);
# remove WORK to start over. OUT gets made.md: the command, the commit, the machine and the
# sweep's wall time.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: scripts/study.sh GRADSCOPE OUT WORK" >&2
  exit 2
fi
gs=$1
out=$2
work=$3
sweep_file=configs/sweeps/study-cpu.toml
case $out in
  "" | / | . | .. | "$HOME")
    echo "study: refusing to replace '$out' with the report" >&2
    exit 2
    ;;
esac

mkdir -p -- "$work"
# The source as the sweep starts (the tree may move on while it runs).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
if ! git diff --quiet HEAD -- 2>/dev/null; then dirty=" (with uncommitted changes)"; fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)
# The sweep's exit status, not tee's: a grid with failed runs still gets its report.
set +e
"$gs" sweep "$sweep_file" --db "$work/study.db" | tee "$work/sweep.txt"
sweep_status=${PIPESTATUS[0]}
set -e
t1=$(date +%s)
if [[ $sweep_status -ne 0 && $sweep_status -ne 1 ]]; then
  echo "study: the sweep stopped with exit status $sweep_status; run again to resume" >&2
  exit "$sweep_status"
fi

rm -rf -- "$out"
"$gs" report "$work/study.db" --out "$out"
# One row per step of 240 runs: 13 MB as text, a quarter of that compressed (-n: no name or
# time in the header, so the same report gives the same bytes).
gzip -9 -n -f -- "$out/steps.csv"

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
# Every invocation on this work folder, so that a resumed study or a report made again keeps
# the record of the one that ran the grid.
echo "- started $started at commit \`$commit\`$dirty: the sweep took $(( (t1 - t0) / 60 )) min $(( (t1 - t0) % 60 )) s (exit status $sweep_status)" \
  >> "$work/invocations.md"
{
  echo "# How this folder was made"
  echo
  echo "- command: \`make study\` (\`scripts/study.sh $gs $out $work\`), sweep file \`$sweep_file\`"
  echo "- report made at commit \`$commit\`$dirty by \`$("$gs" --version)\`"
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "- \`steps.csv.gz\` is the report's \`steps.csv\`, compressed; the report's first line gives"
  echo "  the commits the runs were built from, when the first started and when the last finished"
  echo
  echo "Each \`make study\` on this database (a resumed sweep runs only what was left):"
  echo
  cat "$work/invocations.md"
} > "$out/made.md"
echo "study: report in $out (made.md says how it was made)"
