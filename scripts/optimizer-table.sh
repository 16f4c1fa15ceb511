#!/usr/bin/env bash
# Trains the tiny Llama once per registered optimizer, each at its default learning rate for
# the model, and prints a Markdown table of the measured losses and optimizer state bytes
# (the table in docs/optimizers.md comes from this script).
#   scripts/optimizer-table.sh [STEPS] [OUT_DIR]        (defaults: 300, optimizer-table-out)
# Extra `gradscope run` flags can be passed in GRADSCOPE_FLAGS, e.g. GRADSCOPE_FLAGS="--threads 1".
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-300}"
out="${2:-optimizer-table-out}"
bin="${GRADSCOPE:-build/gradscope}"
mkdir -p "$out"
optimizers=$("$bin" list --json | python3 -c 'import json, sys; print(" ".join(json.load(sys.stdin)["optimizers"]))')
for opt in $optimizers; do
  echo "training the tiny Llama with $opt ($steps steps)" >&2
  # A failed run (diverged, say) still writes its record; the table shows its status.
  "$bin" run --model llama --preset tiny --optimizer "$opt" --batch 16 --steps "$steps" \
    --eval-batches 16 --db "$out/runs.db" --json "$out/$opt.json" --quiet ${GRADSCOPE_FLAGS:-} || true
done
python3 - "$out" $optimizers <<'PY'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
print("| optimizer | lr | status | train loss (mean of last 20 steps) | val loss | "
      "state bytes | state / params | evaluations per step | median step (ms) |")
print("|---|---|---|---|---|---|---|---|---|")
for name in names:
    r = json.load(open(os.path.join(out, name + ".json")))
    steps = [s for s in r["steps"] if s["loss"] is not None]
    tail = [s["loss"] for s in steps[-20:]]
    mem = r["memory"]
    evals = sum(s.get("evaluations", 1) for s in steps) / max(1, len(steps))
    val = r["final_val_loss"]
    median = r["time"]["step_median_s"]
    print("| `{}` | {:g} | {} | {} | {} | {:,} | {:.3f} | {:.2f} | {} |".format(
        name, r["config"]["lr"], r["status"],
        "{:.4f}".format(sum(tail) / len(tail)) if tail else "n/a",
        "{:.4f}".format(val) if val is not None else "n/a",
        mem["optimizer_state_bytes"], mem["optimizer_state_bytes"] / mem["params_bytes"],
        evals, "{:.1f}".format(1000 * median) if median is not None else "n/a"))
first = json.load(open(os.path.join(out, names[0] + ".json")))
print()
print("Tiny Llama, {:,} parameters ({:,} bytes); unigram entropy of the training text {:.4f} "
      "nats; batch 16 x {} tokens; {} steps; {} thread(s); LibTorch {}.".format(
          first["params"], first["memory"]["params_bytes"],
          first["data"]["unigram_entropy_nats"], first["config"]["seq_len"],
          len(first["steps"]), first["env"]["threads"], first["env"]["libtorch"]))
PY
