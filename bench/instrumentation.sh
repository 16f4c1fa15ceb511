#!/usr/bin/env bash
# Instrumentation overhead: median step time with the sampler thread (100 ms) and phase
# timing on, against both off, in paired runs interleaved on/off so that drift in the
# machine's speed hits both alike. Prints each pair's ratio and the min/median/max, and the
# sampler's own measured cost: the seconds it spent reading sensors over the timed seconds.
# On a noisy virtual machine run-to-run spread can exceed the effect: use many pairs.
# Usage: bench/instrumentation.sh [PAIRS] [extra run flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs="${1:-5}"
shift || true
bin=build/gradscope
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(--model vit --preset small --batch 8 --steps 20 --warmup-steps 2 --eval-batches 1
       --threads 1 --quiet --no-db "$@")
median_step() {
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["time"]["step_median_s"])' "$1"
}
ratios=()
for i in $(seq 1 "$pairs"); do
  "$bin" run "${flags[@]}" --sample-period 0 --no-phase-timing --json "$out/off.json"
  "$bin" run "${flags[@]}" --sample-period 0.1 --json "$out/on.json"
  off=$(median_step "$out/off.json")
  on=$(median_step "$out/on.json")
  ratio=$(/usr/bin/python3 -c "print(f'{$on / $off:.4f}')")
  busy=$(/usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.5f" % (r["sampler"]["busy_s"] / r["time"]["total_s"]))' "$out/on.json")
  echo "pair $i: on ${on}s off ${off}s ratio ${ratio} sampler busy ${busy} of the timed time"
  ratios+=("$ratio")
done
/usr/bin/python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"on/off step time: min {r[0]:.4f} median {statistics.median(r):.4f} max {r[-1]:.4f} "
      f"over {len(r)} pairs")
PY
