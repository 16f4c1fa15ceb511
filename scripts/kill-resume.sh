#!/bin/bash
# A run killed with SIGKILL at a random step and resumed from its training state, against the
# same run trained in one go: every step's loss and the final weights must be equal, bit for
# bit, for each way of computing a step with Adam, and for CG (a line search).
# Usage: scripts/kill-resume.sh [OUT]   (GS=path/to/gradscope, default build/gradscope)
set -u
GS=${GS:-build/gradscope}
OUT=${1:-kill-resume}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
status=0
run_case() {  # name, then the run's extra flags
  local name=$1; shift
  local dir="$OUT/$name"
  rm -rf -- "$dir"; mkdir -p -- "$dir"
  local args=(run --model llama --preset tiny --seq 64 --batch 4 --steps 60 --warmup-steps 1
              --dropout 0.1 --eval-every 10 --eval-batches 1 --threads 1 --sample-period 0
              --dataset "$HERE/tests/fixtures/text/sotu-excerpt.txt" --quiet --no-db "$@")
  "$GS" "${args[@]}" --json "$dir/whole.json" --save-weights "$dir/whole-weights" || return 1
  local k=$((RANDOM % 45 + 2))
  "$GS" "${args[@]}" --json "$dir/killed.json" --save-state "$dir/part" --state-every 1 &
  local pid=$!
  # One poller kills the run as soon as its state holds step k (or gives up when it ends).
  python3 - "$dir/part/state.json" "$k" "$pid" <<'PY'
import json, os, signal, sys, time
path, k, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
while True:
    try:
        if json.load(open(path))["step"] >= k:
            os.kill(pid, signal.SIGKILL)
            break
    except (OSError, ValueError, KeyError):
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        break
    time.sleep(0.002)
PY
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  "$GS" "${args[@]}" --json "$dir/resumed.json" --resume "$dir/part" \
    --save-weights "$dir/resumed-weights" || return 1
  python3 - "$dir/whole.json" "$dir/resumed.json" "$name" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
losses = lambda r: [s["loss"] for s in r["steps"]]
same = losses(a) == losses(b) and a["final_val_loss"] == b["final_val_loss"]
print(f"{sys.argv[3]:<22} resumed from step {b.get('resumed_from_steps')}: "
      f"{len(losses(b))} losses equal {losses(a) == losses(b)}, val loss equal "
      f"{a['final_val_loss'] == b['final_val_loss']}", end="")
sys.exit(0 if same else 1)
PY
  local losses_ok=$?
  if cmp -s "$dir/whole-weights/model.safetensors" "$dir/resumed-weights/model.safetensors"; then echo ", weights equal True"; else
    echo ", weights equal False"; return 1; fi
  return $losses_ok
}
for s in standard checkpoint accumulation fused accumulation+fused; do
  extra=(--optimizer adam --lr 0.003 --strategy "$s")
  case $s in accumulation*) extra+=(--accum-steps 2) ;; esac
  run_case "adam-$s" "${extra[@]}" || status=1
done
run_case "cg-standard" --optimizer cg || status=1
exit $status
