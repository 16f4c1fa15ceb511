#!/usr/bin/env bash
# Reruns one configuration of the study grid and compares it, bit for bit, with the committed
# report (its runs.csv and steps.csv.gz, as scripts/study.sh writes them): every step's loss,
# learning rate and gradient norm, and the final training loss, validation loss, accuracy and
# learning rate.
#   scripts/study-rerun.sh GRADSCOPE REPORT_DIR [gradscope run flags...]
# The flags name the configuration (model, optimizer, strategy, batch, seed, ...); the study's
# fixed settings come first and the flags given override them. Exit 0 when every value is the
# same, 1 when one differs or the run is not in the report, 2 for bad input. Times differ
# between runs and machines and are not compared.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: scripts/study-rerun.sh GRADSCOPE REPORT_DIR [gradscope run flags...]" >&2
  exit 2
fi
gs=$1
report=$2
shift 2
for f in steps.csv.gz runs.csv; do
  if [[ ! -f $report/$f ]]; then
    echo "study-rerun: $report/$f not found (a report folder of gradscope report?)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
# The [fixed] settings of configs/sweeps/study-cpu.toml, then the configuration's own. Should
# the two files disagree, the run's id is not in the report, and the check says so.
"$gs" run --preset tiny --steps 400 --warmup-steps 2 --eval-every 50 --eval-batches 8 \
  --lr auto --threads 1 "$@" --db "$work/rerun.db" > "$work/run.txt" || {
  status=$?
  cat "$work/run.txt"
  exit "$status"
}
"$gs" report "$work/rerun.db" --out "$work/report" > /dev/null

# run_id,step,samples,tokens,evaluations,flops,time_s,energy_j,loss,lr,grad_norm: the
# deterministic columns of the one run rerun, and the same run's rows in the committed report.
id=$(awk -F, 'NR == 2 {print $1}' "$work/report/steps.csv")
steps() { awk -F, -v id="$id" '$1 == id {print $2, $9, $10, $11}'; }
steps < "$work/report/steps.csv" > "$work/new-steps"
gzip -dc -- "$report/steps.csv.gz" | steps > "$work/old-steps"
if [[ ! -s $work/old-steps ]]; then
  echo "study-rerun: run $id is not in $report (is it a configuration of the study grid?)" >&2
  exit 1
fi
# final_loss, final_val_loss, final_accuracy and lr by name, not position; quoted fields (the
# configuration's label holds commas) emptied first.
finals() {
  sed 's/"[^"]*"//g' "$1" | awk -F, -v id="$id" 'NR == 1 {for (i = 1; i <= NF; ++i) col[$i] = i; next}
    $1 == id {print $col["final_loss"], $col["final_val_loss"], $col["final_accuracy"], $col["lr"]}'
}
finals "$work/report/runs.csv" > "$work/new-finals"
finals "$report/runs.csv" > "$work/old-finals"

n=$(wc -l < "$work/new-steps")
if cmp -s "$work/new-steps" "$work/old-steps" && cmp -s "$work/new-finals" "$work/old-finals"; then
  echo "run $id: $n steps' loss, learning rate and gradient norm, and the final training and" \
    "validation losses, bit for bit as in $report"
  echo "final (training loss, validation loss, accuracy, learning rate): $(cat "$work/new-finals")"
  exit 0
fi
echo "run $id differs from $report:" >&2
diff <(cat "$work/old-steps" "$work/old-finals") <(cat "$work/new-steps" "$work/new-finals") \
  | head -20 >&2 || true
exit 1
