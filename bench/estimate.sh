#!/usr/bin/env bash
# `gradscope estimate` against measurement: for the four models at the tiny and small presets
# under standard, checkpoint and accumulation (4 micro-batches), the measured peak of a 3-step
# run (Adam, batch 8) beside the estimate its record holds. Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/gradscope
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| model | preset | strategy | measured peak | estimated | error |"
echo "|---|---|---|---:|---:|---:|"
for model in llama modernbert nanovlm vit; do
  for preset in tiny small; do
    for strategy in standard checkpoint accumulation; do
      accum=1
      [ "$strategy" = accumulation ] && accum=4
      "$bin" run --model "$model" --preset "$preset" --strategy "$strategy" --accum-steps "$accum" \
        --steps 2 --warmup-steps 1 --eval-batches 1 --quiet --no-db --json "$out/r.json" >/dev/null
      python3 - "$out/r.json" "$model" "$preset" "$strategy" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m, e = r["memory"]["peak_bytes"], r["estimate"]["peak_bytes"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {m/2**20:.2f} MiB | {e/2**20:.2f} MiB | {100*(e/m-1):+.1f}% |")
PY
    done
  done
done
