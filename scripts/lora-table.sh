#!/usr/bin/env bash
# Measures LoRA against full training on the small Llama (6 layers, hidden 256, gpt2
# tokenizer: vocabulary 50304, sequence 128), batch 8, Adam, and prints a Markdown table; the
# table of docs/lora.md comes from it.
#   scripts/lora-table.sh [STEPS] [OUT_DIR]   (defaults: 30, lora-out)
# Each configuration runs 1 untimed warm-up step and STEPS timed steps, one thread. Extra
# `gradscope run` flags can be passed in GRADSCOPE_FLAGS; REPORT_ONLY=1 prints the table from
# OUT_DIR's records without running anything. About 10 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-30}"
out="${2:-lora-out}"
bin="${GRADSCOPE:-build/gradscope}"
mkdir -p "$out"
# Extra flags, split on blanks only (never expanded as file patterns).
read -r -a extra <<<"${GRADSCOPE_FLAGS:-}"

run() {  # NAME ARGS...: one run, its record in OUT/NAME.json
  local name="$1"
  shift
  echo "run $name: $*" >&2
  "$bin" run --model llama --preset small --batch 8 --steps "$steps" --warmup-steps 1 \
    --threads 1 --eval-batches 1 --db "$out/runs.db" --json "$out/$name.json" --quiet \
    "${extra[@]}" "$@"
}

if [ -z "${REPORT_ONLY:-}" ]; then
  run full
  run lora-qv --lora-targets q,v
  run lora-all --lora-targets q,k,v,o,gate,up,down
  run lora-all-r32 --lora-targets q,k,v,o,gate,up,down --lora-rank 32 --lora-alpha 64
  run lora-all-checkpoint --lora-targets q,k,v,o,gate,up,down --strategy checkpoint
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rec = lambda name: json.load(open(os.path.join(out, name + ".json")))
mib = lambda b: "n/a" if b is None else "{:.1f}".format(b / 2**20)
base = rec("full")
print("| run | trainable params | params: trainable / frozen (MiB) | gradients (MiB) | "
      "optimizer state (MiB) | activations peak (MiB) | peak (MiB) | vs full | estimate (MiB) | "
      "estimate / measured | step (ms) | loss: step 1 -> last |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for label, name in [("full training", "full"), ("LoRA q,v r8", "lora-qv"),
                    ("LoRA all r8", "lora-all"), ("LoRA all r32", "lora-all-r32"),
                    ("LoRA all r8 + checkpoint", "lora-all-checkpoint")]:
    r = rec(name)
    m = r["memory"]
    trainable_bytes = m["params_bytes"] - m.get("frozen_params_bytes", 0)
    e = r.get("estimate") or {}
    est = e.get("peak_bytes")
    print("| {} | {:,} of {:,} | {} / {} | {} | {} | {} | {} | {:.2f}x | {} | {} | {:.0f} | "
          "{:.4f} -> {:.4f} |".format(
              label, r["trainable_params"], r["params"], mib(trainable_bytes),
              mib(m.get("frozen_params_bytes", 0)), mib(m.get("grads_bytes")),
              mib(m["optimizer_state_bytes"]), mib(m.get("activations_peak_bytes")),
              mib(m["peak_bytes"]), m["peak_bytes"] / base["memory"]["peak_bytes"], mib(est),
              "n/a" if est is None else "{:.2f}".format(est / m["peak_bytes"]),
              1000 * r["time"]["step_median_s"], r["steps"][0]["loss"], r["steps"][-1]["loss"]))
PY
