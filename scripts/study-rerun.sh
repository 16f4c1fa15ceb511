#!/usr/bin/env bash
# Reruns one run of the study grid and compares it, bit for bit, with the committed report (its
# runs.csv and steps.csv.gz, as scripts/study.sh writes them): the run's status, every step's
# loss, learning rate and gradient norm, and the final training loss, validation loss, accuracy
# and learning rate.
#   scripts/study-rerun.sh GRADSCOPE REPORT_DIR RUN_ID
# RUN_ID: a run of the report (the first column of runs.csv). The sweep file that ran it gives
# its settings, overrides and picked learning rate included: one of the report's sweeps/ (the
# files scripts/study.sh swept, copied beside the report); for a report made before the study
# picked its rates first (no sweeps/ folder), configs/sweeps/study-cpu.toml as it was at the
# commit made.md names. Exit 0 when every value is the same, 1 when one differs, 2 for
# bad input. Times differ between runs and machines and are not compared. A report made on
# another LibTorch than the binary's is not compared: the script says so and exits 0 without
# running anything (made.md names the LibTorch; reports without the line were made on 1.13).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: scripts/study-rerun.sh GRADSCOPE REPORT_DIR RUN_ID" >&2
  exit 2
fi
gs=$1
report=$2
id=$3
if [[ ! $id =~ ^[0-9a-f]{16}$ ]]; then
  echo "study-rerun: '$id' is not a run id (16 hexadecimal digits, the first column of runs.csv)" >&2
  exit 2
fi
for f in steps.csv.gz runs.csv; do
  if [[ ! -f $report/$f ]]; then
    echo "study-rerun: $report/$f not found (a folder written by scripts/study.sh?)" >&2
    exit 2
  fi
done

# The same LibTorch, or no bit-for-bit comparison: kernels, BLAS and fused attention differ
# between versions, so a run's losses do too. made.md names the one the report was made on
# (reports made before it did were made on Debian's LibTorch 1.13).
made_on=$(sed -n 's/^- LibTorch: `\([^`]*\)`.*/\1/p' "$report/made.md" 2>/dev/null | head -1)
made_on=${made_on:-1.13.0}
running=$("$gs" --version | sed -n 's/.* on LibTorch //p')
if [[ -z $running ]]; then
  echo "study-rerun: $gs --version does not name its LibTorch (not a gradscope binary?)" >&2
  exit 2
fi
if [[ $made_on != "$running" ]]; then
  echo "study-rerun: $report was made on LibTorch $made_on and this gradscope runs on LibTorch" \
    "$running: a bit-for-bit comparison needs the same LibTorch; run \`make study\` to make" \
    "the report again on this one"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
# The sweep files the report's runs came from.
files=()
if [[ -d $report/sweeps ]]; then
  files=("$report"/sweeps/*.toml)
else
  made_at=$(sed -n 's/^- source tree at commit `\([0-9a-f]\{40\}\)`.*/\1/p' "$report/made.md" \
    2>/dev/null | head -1)
  if [[ -z $made_at ]] || ! git -C "$(dirname -- "$0")" show \
    "$made_at:configs/sweeps/study-cpu.toml" > "$work/study-cpu.toml" 2>/dev/null; then
    echo "study-rerun: $report has no sweeps/ folder, and configs/sweeps/study-cpu.toml at the" \
      "commit its made.md names cannot be read from git" >&2
    exit 2
  fi
  files=("$work/study-cpu.toml")
fi
# The one that holds the run: its dry run lists the id.
sweep_file=""
for f in "${files[@]}"; do
  if "$gs" sweep "$f" --dry-run 2>/dev/null | awk -v id="$id" '$0 ~ "  " id "  " {found = 1}
      END {exit !found}'; then
    sweep_file=$f
    break
  fi
done
if [[ -z $sweep_file ]]; then
  echo "study-rerun: run $id is in none of the sweep files of $report (${files[*]})" >&2
  exit 1
fi
# The sweep runs it as it ran in the grid (exit 1 when the run did not end ok: a diverged run
# is compared like any other; a bad id is exit 2).
status=0
"$gs" sweep "$sweep_file" --db "$work/rerun.db" --only "$id" > "$work/sweep.txt" 2>&1 ||
  status=$?
if [[ $status -ne 0 && $status -ne 1 ]]; then
  cat "$work/sweep.txt" >&2
  exit "$status"
fi
"$gs" report "$work/rerun.db" --out "$work/report" > /dev/null

# run_id,step,samples,tokens,evaluations,flops,time_s,energy_j,loss,lr,grad_norm: the
# deterministic columns of the run, rerun and as committed.
steps() { awk -F, -v id="$id" '$1 == id {print $2, $9, $10, $11}'; }
steps < "$work/report/steps.csv" > "$work/new-steps"
gzip -dc -- "$report/steps.csv.gz" | steps > "$work/old-steps"
# status, final_loss, final_val_loss, final_accuracy and lr by name, not position; quoted
# fields (the configuration's label holds commas) emptied first.
finals() {
  sed 's/"[^"]*"//g' "$1" | awk -F, -v id="$id" 'NR == 1 {for (i = 1; i <= NF; ++i) col[$i] = i; next}
    $1 == id {print $col["status"], $col["final_loss"], $col["final_val_loss"], $col["final_accuracy"], $col["lr"]}'
}
finals "$work/report/runs.csv" > "$work/new-finals"
finals "$report/runs.csv" > "$work/old-finals"
if [[ ! -s $work/old-finals ]]; then
  echo "study-rerun: run $id is not in $report" >&2
  exit 1
fi

n=$(wc -l < "$work/new-steps")
if cmp -s "$work/new-steps" "$work/old-steps" && cmp -s "$work/new-finals" "$work/old-finals"; then
  echo "run $id: its status, $n steps' loss, learning rate and gradient norm, and its final" \
    "losses, bit for bit as in $report"
  echo "final (status, training loss, validation loss, accuracy, learning rate): $(cat "$work/new-finals")"
  exit 0
fi
echo "run $id differs from $report (< committed, > rerun):" >&2
diff <(cat "$work/old-finals" "$work/old-steps") <(cat "$work/new-finals" "$work/new-steps") \
  | head -20 >&2 || true
exit 1
