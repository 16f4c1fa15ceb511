#!/bin/bash
# Weights out and back in, for each model: a tiny run writes its weights (--save-weights), then
# `gradscope eval --init-from` reads them in a new process with the run's evaluation settings;
# its loss must equal the validation loss the run recorded, bit for bit.
# Usage: scripts/weights-roundtrip.sh [OUT]   (GS=path/to/gradscope, default build/gradscope)
GS=${GS:-build/gradscope}
OUT=${1:-weights-roundtrip}
set -u
mkdir -p "$OUT"
status=0
for m in llama modernbert vit nanovlm; do
  "$GS" run --model $m --preset tiny --optimizer adam --steps 20 --warmup-steps 0 --batch 8 --eval-batches 2 \
    --quiet --no-db --sample-period 0 --json "$OUT/$m.json" --save-weights "$OUT/$m-w" || exit 1
  "$GS" eval --model $m --preset tiny --batch 8 --eval-batches 2 --init-from "$OUT/$m-w" --json "$OUT/$m-eval.json" > /dev/null || exit 1
  python3 - "$OUT/$m.json" "$OUT/$m-eval.json" $m <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
same = r['final_val_loss'] == e['loss_nats']
print(f"{sys.argv[3]:<11} run final_val_loss {r['final_val_loss']!r:<22} eval loss_nats {e['loss_nats']!r:<22} bitwise {same}")
sys.exit(0 if same else 1)
PY
  [ $? -eq 0 ] || status=1
done
exit $status
