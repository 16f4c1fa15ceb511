#!/usr/bin/env bash
# Measures what the memory strategies cost on the small Llama (6 layers, hidden 256, gpt2
# tokenizer, sequence 128) and prints Markdown tables; docs/strategies.md comes from it.
#   scripts/strategy-table.sh [STEPS] [OUT_DIR]          (defaults: 4, strategy-table-out)
# Each configuration runs 1 untimed warm-up step and STEPS timed steps. Extra `gradscope run`
# flags can be passed in GRADSCOPE_FLAGS; REPORT_ONLY=1 prints the tables from OUT_DIR's
# records without running anything. The bf16 run takes minutes on CPUs without native
# bfloat16 arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-4}"
out="${2:-strategy-table-out}"
bin="${GRADSCOPE:-build/gradscope}"
mkdir -p "$out"

run() {  # NAME ARGS...: one run, its record in OUT/NAME.json
  local name="$1"
  shift
  echo "run $name: $*" >&2
  "$bin" run --model llama --preset small --optimizer adam --steps "$steps" --warmup-steps 1 \
    --eval-batches 1 --db "$out/runs.db" --json "$out/$name.json" --quiet ${GRADSCOPE_FLAGS:-} "$@"
}

# Checkpointing by depth (batch 8), whole blocks and each branch alone.
if [ -z "${REPORT_ONLY:-}" ]; then
for layers in 2 4 6; do
  for s in standard checkpoint; do
    run "depth$layers-$s" --arch num_hidden_layers=$layers --strategy $s --batch 8
  done
  for policy in attention mlp; do
    run "depth$layers-checkpoint-$policy" --arch num_hidden_layers=$layers --strategy checkpoint \
      --checkpoint-policy $policy --batch 8
  done
done
# Accumulation: 4 micro-batches of 2 against one micro-batch of 2 and one batch of 8.
run accum-micro2 --batch 2
run accum-4x2 --strategy accumulation --batch 2 --accum-steps 4
run accum-batch8 --batch 8
# The fused step at a batch small enough that the optimizer step holds the peak: with the
# gpt2 vocabulary (the tied embedding is 73% of the parameters) and with the bytes one.
for tok in gpt2 bytes; do
  run fused-$tok-standard --batch 1 --seq 32 --tokenizer $tok
  run fused-$tok-fused --strategy fused --batch 1 --seq 32 --tokenizer $tok
done
# bf16 autocast against fp32 (batch 8).
run dtype-bf16 --batch 8 --dtype bf16
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rec = lambda name: json.load(open(os.path.join(out, name + ".json")))
mib = lambda b: "{:.1f}".format(b / 2**20)
def ms(r):
    return "{:.0f}".format(1000 * r["time"]["step_median_s"])

print("### Checkpointing by depth (batch 8 x 128 tokens)\n")
print("| layers | strategy | activations peak (MiB) | vs standard | peak (MiB) | "
      "step (ms) | vs standard |")
print("|---|---|---|---|---|---|---|")
for layers in (2, 4, 6):
    base = rec("depth{}-standard".format(layers))
    for label, name in (("standard", "standard"), ("checkpoint (full)", "checkpoint"),
                        ("checkpoint (attention)", "checkpoint-attention"),
                        ("checkpoint (mlp)", "checkpoint-mlp")):
        r = rec("depth{}-{}".format(layers, name))
        a, a0 = r["memory"]["activations_peak_bytes"], base["memory"]["activations_peak_bytes"]
        t, t0 = r["time"]["step_median_s"], base["time"]["step_median_s"]
        print("| {} | {} | {} | {:.2f}x | {} | {} | {:.2f}x |".format(
            layers, label, mib(a), a / a0, mib(r["memory"]["peak_bytes"]), ms(r), t / t0))

print("\n### Accumulation (6 layers)\n")
print("| run | effective batch | peak (MiB) | activations peak (MiB) | loss of step 1 |")
print("|---|---|---|---|---|")
for label, name in (("one micro-batch of 2", "accum-micro2"),
                    ("accumulation 4 x 2", "accum-4x2"), ("one batch of 8", "accum-batch8")):
    r = rec(name)
    print("| {} | {} | {} | {} | {:.6f} |".format(
        label, r["steps"][0]["samples"], mib(r["memory"]["peak_bytes"]),
        mib(r["memory"]["activations_peak_bytes"]), r["steps"][0]["loss"]))

print("\n### Fused optimizer step (6 layers, batch 1 x 32 tokens, Adam)\n")
print("| tokenizer (parameters) | strategy | peak (MiB) | saved | gradient bytes (MiB) | "
      "optimizer state (MiB) | phase peaks: forward / backward / optimizer (MiB) |")
print("|---|---|---|---|---|---|---|")
for tok in ("gpt2", "bytes"):
    base = rec("fused-{}-standard".format(tok))
    for name in ("standard", "fused"):
        r = rec("fused-{}-{}".format(tok, name))
        m = r["memory"]
        g = m["grads_bytes"]
        pp = m["phase_peak_bytes"]
        saved = base["memory"]["peak_bytes"] - m["peak_bytes"]
        print("| {} ({:,}) | {} | {} | {} | {} | {} | {} / {} / {} |".format(
            tok, r["params"], name, mib(m["peak_bytes"]), mib(saved),
            mib(g) if g is not None else "n/a (freed in backward)",
            mib(m["optimizer_state_bytes"]), mib(pp["forward"]), mib(pp["backward"]),
            mib(pp["optimizer"])))

print("\n### bf16 autocast (6 layers, batch 8)\n")
print("| dtype | activations peak (MiB) | peak (MiB) | step (ms) | loss of step 1 |")
print("|---|---|---|---|---|")
for label, name in (("fp32", "depth6-standard"), ("bf16", "dtype-bf16")):
    r = rec(name)
    print("| {} | {} | {} | {} | {:.6f} |".format(
        label, mib(r["memory"]["activations_peak_bytes"]), mib(r["memory"]["peak_bytes"]), ms(r),
        r["steps"][0]["loss"]))
env = rec("depth6-standard")["env"]
print("\nMeasured with {} timed steps after 1 warm-up step; {} thread(s), LibTorch {}, {}.".format(
    rec("depth6-standard")["time"]["timed_steps"], env["threads"], env["libtorch"],
    env["device_name"]))
PY
