#!/usr/bin/env bash
# The study from scratch on this machine, then its report: what `make study` runs.
#   scripts/study.sh GRADSCOPE OUT WORK
# GRADSCOPE: the binary; OUT: the report folder to write (results/cpu-tiny is the committed
# one); WORK: a folder for the databases, the run logs and the sweeps' output. In order:
#   1. rates: configs/sweeps/study-rates.toml into WORK/rates.db (full-length runs at seed
#      100, a few rates per model, optimizer and step);
#   2. pick: scripts/study-rates.sh WORK/rates.db WORK, the lowest final validation loss per
#      model, optimizer and step (WORK/rates.md, rates.toml, accumulation-own-rate.toml);
#   3. compare: copies of configs/sweeps/study-cpu.toml and study-dropout.toml with rates.toml
#      appended (WORK/sweeps/), and accumulation-own-rate.toml when the pick wrote one, swept
#      into WORK/study.db;
#   4. the report of WORK/study.db into OUT.
# A killed study resumes where it stopped when run again with the same WORK (every sweep skips
# finished runs; the pick is made again from the same runs); remove WORK to start over. OUT is
# replaced only by a whole new report, and only when it is a report this script wrote (it holds
# made.md) or does not exist; it gets made.md (the command, the commit, the machine, every
# invocation on WORK with each phase's wall time, the chosen rates), rates.md, rates.toml and
# sweeps/: the sweep files phase 3 ran, which `make study-rerun` reruns a run from.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: scripts/study.sh GRADSCOPE OUT WORK" >&2
  exit 2
fi
gs=$1
out=$2
work=$3
# The files beside this script, wherever it is run from (OUT and WORK are the caller's paths).
here=$(dirname -- "$0")
rates_file=$here/../configs/sweeps/study-rates.toml
compare_files=("$here/../configs/sweeps/study-cpu.toml"
  "$here/../configs/sweeps/study-dropout.toml")

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
for db in "$work/rates.db" "$work/study.db"; do
  [[ -f $db ]] || continue
  # The versions as the records give them, control characters shown as '?' (a record is data).
  others=$(sqlite3 -readonly "$db" \
    "SELECT DISTINCT coalesce(json_extract(record_json, '$.env.libtorch'), 'unknown') FROM runs" |
    grep -vxF -- "$running" | tr -c '[:print:]\n' '?' || true)
  if [[ -n $others ]]; then
    echo "study: $db holds runs made on LibTorch $(echo "$others" | tr '\n' ' ')and" \
      "this gradscope runs on LibTorch $running: remove $work to start the study over" >&2
    exit 2
  fi
done

# The source as the sweep starts (the tree may move on while it runs).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
if [[ $commit != unknown && -n $(git status --porcelain 2>/dev/null) ]]; then
  dirty=" (with uncommitted or untracked changes)"
fi
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# Sweeps FILE into DB, its output appended to LOG (a resumed sweep keeps the log of the one
# before). Exit 1 is a sweep whose runs ended, some of them not ok: the study goes on. But 1 is
# also a sweep that stopped on an error: only a grid with nothing left to run goes on.
sweep() {
  local file=$1 db=$2 log=$3 status left
  set +e
  "$gs" sweep "$file" --db "$db" | tee -a "$log"
  status=${PIPESTATUS[0]}
  set -e
  left=$("$gs" sweep "$file" --db "$db" --dry-run | tail -n 1) ||
    left="the dry run to check it failed"
  if [[ ($status -ne 0 && $status -ne 1) || $left != "0 to run,"* ]]; then
    echo "study: the sweep of $file stopped with exit status $status ($left); run again to" \
      "resume" >&2
    return 1
  fi
}
took() { echo "$(( $1 / 60 )) min $(( $1 % 60 )) s"; }

# 1. The rates grid.
t0=$(date +%s)
rates_status=0
sweep "$rates_file" "$work/rates.db" "$work/rates-sweep.txt" || rates_status=$?
t1=$(date +%s)
if [[ $rates_status -ne 0 ]]; then
  echo "- started $started at commit \`$commit\`$dirty: the rates sweep took $(took $((t1 - t0)))" \
    "and stopped before its end" >> "$work/invocations.md"
  exit 1
fi

# 2. The pick, and the sweep files of the comparison: the committed grids with the picked rates
# appended, and the accumulation step's own rates where they differ.
bash "$here/study-rates.sh" "$work/rates.db" "$work"
# A resumed study keeps the runs it has, which ran at the rates picked when they started: a
# pick that changed since (another rates grid, another rule) would mix two sets of rates in
# one report. The picks (each model's and optimizer's rates, not the grids' other settings)
# the comparison's runs were made at are kept beside its database.
picks=$(cat -- "$work/rates.toml" && if [[ -f $work/accumulation-own-rate.toml ]]; then
  grep -E '^(when|lr) = ' -- "$work/accumulation-own-rate.toml"; fi)
if [[ -f $work/study.db && -f $work/picks-used.toml ]]; then
  if [[ $picks != "$(cat -- "$work/picks-used.toml")" ]]; then
    echo "study: the rates picked now differ from those the runs in $work/study.db were made" \
      "at ($work/picks-used.toml): remove $work/study.db (the rates grid's runs in" \
      "$work/rates.db stay) to run the comparison again" >&2
    exit 2
  fi
elif [[ -f $work/study.db ]]; then
  echo "study: $work/study.db has no record of the rates its runs were made at" \
    "($work/picks-used.toml): remove $work/study.db to run the comparison again" >&2
  exit 2
else
  printf '%s\n' "$picks" > "$work/picks-used.toml"
fi
# Every model and optimizer of the main grid has its pick: one without would run at the
# optimizer's default rate. The dry run's lines of runs (those with a run id) start with the
# number, the model and the optimizer.
unpicked=$(comm -23 <("$gs" sweep "${compare_files[0]}" --db "$work/study.db" --dry-run |
  awk '{for (i = 4; i <= NF; ++i) if (length($i) == 16 && $i ~ /^[0-9a-f]+$/) {
    print $2, $3; break } }' | sort -u) \
  <(sed -n 's/^when = { model = "\(.*\)", optimizer = "\(.*\)" }$/\1 \2/p' \
    "$work/rates.toml" | sort -u))
if [[ -n $unpicked ]]; then
  echo "study: the rates grid picked no rate for $(echo "$unpicked" | paste -sd, - |
    sed 's/,/, /g') of ${compare_files[0]}" >&2
  exit 1
fi
rm -rf -- "$work/sweeps"
mkdir -p -- "$work/sweeps"
phase2=()
for f in "${compare_files[@]}"; do
  phase2+=("$work/sweeps/$(basename -- "$f")")
  {
    cat -- "$f"
    echo
    echo "# The study's learning rates, picked from the rates grid (scripts/study.sh appended"
    echo "# scripts/study-rates.sh's rates.toml below)."
    cat -- "$work/rates.toml"
  } > "$work/sweeps/$(basename -- "$f")"
done
if [[ -f $work/accumulation-own-rate.toml ]]; then
  cp -- "$work/accumulation-own-rate.toml" "$work/sweeps/"
  phase2+=("$work/sweeps/accumulation-own-rate.toml")
fi

# 3. The comparison, every sweep file into one database.
t2=$(date +%s)
study_status=0
for f in "${phase2[@]}"; do
  sweep "$f" "$work/study.db" "$work/sweep.txt" || { study_status=$?; break; }
done
t3=$(date +%s)
stopped=""
[[ $study_status -eq 0 ]] || stopped=", and stopped before their end"
echo "- started $started at commit \`$commit\`$dirty: the rates sweep took $(took $((t1 - t0)))," \
  "the study's sweeps $(took $((t3 - t2)))$stopped" >> "$work/invocations.md"
[[ $study_status -eq 0 ]] || exit 1

# The new report is made beside the old one, which it replaces only once it is whole.
next="$work/report.next"
rm -rf -- "$next"
"$gs" report "$work/study.db" --out "$next"
# One row per step of every run: megabytes as text, a third of that compressed (-n: no name or
# time in the header).
gzip -9 -n -f -- "$next/steps.csv"
# What phase 3 ran and how its rates were chosen, so the committed study says what it ran.
cp -- "$work/rates.md" "$work/rates.toml" "$next/"
cp -r -- "$work/sweeps" "$next/sweeps"

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
{
  echo "# How this folder was made"
  echo
  echo "- command: \`scripts/study.sh $gs $out $work\` (what \`make study\` runs)"
  echo "- phase 1, the rates: \`configs/sweeps/study-rates.toml\` (not in this report);"
  echo "  the pick: \`scripts/study-rates.sh\` (\`rates.md\`: every rate tried, \`rates.toml\`)"
  echo "- phase 2, the comparison, this report's runs: in \`sweeps/\`, in this order,"
  echo "  $(for f in "${phase2[@]}"; do basename -- "$f"; done | sed 's/.*/`&`/' | paste -sd, - |
    sed 's/,/, /g'): the committed grids with the picked rates appended, and the"
  echo "  accumulation step's own rates where they differ (\`make study-rerun\` finds a run there)"
  echo "- source tree at commit \`$commit\`$dirty when the last invocation started; \`$("$gs" --version)\`"
  echo "- LibTorch: \`$(libtorch_of "$gs")\` (\`make study-rerun\` compares bit for bit only on the same one)"
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "- \`steps.csv.gz\` is the report's \`steps.csv\`, compressed (the page's link to \`steps.csv\` means this file)"
  echo "- the report's first line gives the commits the runs were built from, when the first"
  echo "  run's training started and when the last finished"
  echo
  echo "Each \`make study\` on this work folder (a resumed sweep runs only what was left):"
  echo
  cat "$work/invocations.md"
  echo
  echo "The chosen rates (\`rates.md\` lists every rate tried and flags a pick at an edge):"
  echo
  awk '/^\| model \| optimizer \| standard step/ {on = 1} on' "$work/rates.md" |
    sed 's/ (its own sweep: accumulation-own-rate.toml)/ (own sweep)/'
} > "$next/made.md"
rm -rf -- "$out"
mkdir -p -- "$(dirname -- "$out")"
mv -- "$next" "$out"
echo "study: report in $out (made.md says how it was made)"
