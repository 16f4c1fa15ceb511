#!/usr/bin/env bash
# Trains the tiny and the small Llama with Adam and with the optimizers that followed the
# study (adam-mini, apollo, apollo-mini, muon), each at its default learning rate, for the same
# steps, and prints Markdown tables of the loss at equal steps, the optimizer state against the
# estimate, and the step time (the tables of docs/optimizers.md, "After the study").
#   scripts/new-optimizers-table.sh [TINY_STEPS] [SMALL_STEPS] [OUT_DIR]
#   (defaults: 200, 30, new-optimizers-out)
# One thread per run. Extra `gradscope run` flags can be passed in GRADSCOPE_FLAGS;
# REPORT_ONLY=1 prints the tables from OUT_DIR's records. About 10 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
tiny_steps="${1:-200}"
small_steps="${2:-30}"
out="${3:-new-optimizers-out}"
bin="${GRADSCOPE:-build/gradscope}"
mkdir -p "$out"
# Extra flags, split on blanks only (never expanded as file patterns).
read -r -a extra <<<"${GRADSCOPE_FLAGS:-}"
optimizers=(adam adam-mini apollo apollo-mini muon)

if [ -z "${REPORT_ONLY:-}" ]; then
  for preset in tiny small; do
    steps="$tiny_steps"
    if [ "$preset" = small ]; then steps="$small_steps"; fi
    for opt in "${optimizers[@]}"; do
      echo "run $preset $opt ($steps steps)" >&2
      # A failed run (diverged, say) still writes its record; the table shows its status.
      "$bin" run --model llama --preset "$preset" --optimizer "$opt" --batch 8 \
        --steps "$steps" --warmup-steps 1 --threads 1 --eval-batches 4 --db "$out/runs.db" \
        --json "$out/$preset-$opt.json" --quiet "${extra[@]}" || true
    done
  done
fi

python3 - "$out" "${optimizers[@]}" <<'PY'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
for preset in ("tiny", "small"):
    base = json.load(open(os.path.join(out, preset + "-adam.json")))
    print("### Llama {}, batch 8, {} steps\n".format(preset, len(base["steps"])))
    print("| optimizer | lr | status | train loss (mean of last 10 steps) | val loss | "
          "state (bytes) | state / params | estimated state | step (ms) | step vs adam |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = json.load(open(os.path.join(out, preset + "-" + name + ".json")))
        tail = [s["loss"] for s in r["steps"][-10:] if s["loss"] is not None]
        m = r["memory"]
        e = (r.get("estimate") or {}).get("optimizer_state_bytes")
        step = r["time"]["step_median_s"]
        base_step = base["time"]["step_median_s"]
        val = r["final_val_loss"]
        print("| `{}` | {:g} | {} | {} | {} | {:,} | {:.3f} | {} | {} | {} |".format(
            name, r["config"]["lr"], r["status"],
            "{:.4f}".format(sum(tail) / len(tail)) if tail else "n/a",
            "{:.4f}".format(val) if val is not None else "n/a",
            m["optimizer_state_bytes"], m["optimizer_state_bytes"] / m["params_bytes"],
            "{:,}".format(e) if e is not None else "n/a",
            "{:.0f}".format(1000 * step) if step else "n/a",
            "{:.2f}x".format(step / base_step) if step and base_step else "n/a"))
    print()
PY
