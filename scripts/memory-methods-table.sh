#!/usr/bin/env bash
# Measures the memory methods that combine with the study's strategies on the small Llama
# (6 layers, hidden 256, gpt2 tokenizer: vocabulary 50304, sequence 128) and prints Markdown
# tables; the tables of docs/strategies.md, "Memory methods measured", come from it.
#   scripts/memory-methods-table.sh [STEPS] [OUT_DIR]   (defaults: 4, memory-methods-out)
# Each configuration runs 3 untimed warm-up steps and STEPS timed steps, one thread (the full
# loss's heap grows in its first steps, and can once more in a later one: the step times of a
# single run are not a comparison; `make bench` makes that side by side). Extra
# `gradscope run` flags can be passed in GRADSCOPE_FLAGS; REPORT_ONLY=1 prints the tables from
# OUT_DIR's records without running anything. About 10 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-4}"
out="${2:-memory-methods-out}"
bin="${GRADSCOPE:-build/gradscope}"
mkdir -p "$out"
# Extra flags, split on blanks only (never expanded as file patterns).
read -r -a extra <<<"${GRADSCOPE_FLAGS:-}"

run() {  # NAME ARGS...: one run, its record in OUT/NAME.json
  local name="$1"
  shift
  echo "run $name: $*" >&2
  "$bin" run --model llama --preset small --steps "$steps" --warmup-steps 3 --threads 1 \
    --eval-batches 1 --db "$out/runs.db" --json "$out/$name.json" --quiet "${extra[@]}" "$@"
}

if [ -z "${REPORT_ONLY:-}" ]; then
  # The loss head and the projections at batch 8, Adam.
  run standard --batch 8
  run chunked --batch 8 --loss chunked
  run checkpoint --batch 8 --strategy checkpoint
  run checkpoint-chunked --batch 8 --strategy checkpoint --loss chunked
  run packed --batch 8 --projections packed
  run packed-chunked --batch 8 --projections packed --loss chunked
  # Accumulation of 4 micro-batches of 2 with and without a gradient buffer, against one
  # micro-batch of 2, for SGD with momentum (exact) and Adam (AdamA's second moment).
  for opt in sgd adam; do
    flags=(--optimizer "$opt")
    if [ "$opt" = sgd ]; then flags+=(--opt momentum=0.9); fi
    run "micro2-$opt" --batch 2 "${flags[@]}"
    run "accum-$opt" --batch 2 --accum-steps 4 "${flags[@]}"
    run "accum-nobuffer-$opt" --batch 2 --accum-steps 4 --optimizer-step in-backward "${flags[@]}"
    run "batch8-$opt" --batch 8 "${flags[@]}"
  done
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rec = lambda name: json.load(open(os.path.join(out, name + ".json")))
mib = lambda b: "n/a" if b is None else "{:.1f}".format(b / 2**20)
ms = lambda r: "{:.0f}".format(1000 * r["time"]["step_median_s"])

def parts(r):
    b = r["memory"]["breakdown"]
    return " / ".join(mib(b.get(k)) for k in
                      ("params", "grads", "optimizer_state", "activations", "logits", "other"))

def estimate(r):
    e = r.get("estimate")
    if not e:
        return "n/a", "n/a"
    return mib(e["peak_bytes"]), "{:.2f}".format(e["peak_bytes"] / r["memory"]["peak_bytes"])

def table(title, names, base_name):
    base = rec(base_name)
    print("### " + title + "\n")
    print("| run | peak (MiB) | vs {} | at the peak: params / grads / state / activations / "
          "logits / other (MiB) | activations peak (MiB) | loss head keeps (MiB) | step (ms) | "
          "vs {} | loss of step 1 | last loss | estimate (MiB) | estimate / measured |"
          .format(base_name, base_name))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, name in names:
        r = rec(name)
        m = r["memory"]
        est, ratio = estimate(r)
        print("| {} | {} | {:.2f}x | {} | {} | {} | {} | {:.2f}x | {:.6f} | {:.6f} | {} | {} |".format(
            label, mib(m["peak_bytes"]), m["peak_bytes"] / base["memory"]["peak_bytes"], parts(r),
            mib(m["activations_peak_bytes"]), mib(m.get("logits_bytes")), ms(r),
            r["time"]["step_median_s"] / base["time"]["step_median_s"], r["steps"][0]["loss"],
            r["steps"][-1]["loss"], est, ratio))
    print()

table("The loss head and the projections (batch 8 x 128 tokens, Adam)",
      (("standard", "standard"), ("--loss chunked", "chunked"),
       ("checkpoint", "checkpoint"), ("checkpoint, --loss chunked", "checkpoint-chunked"),
       ("--projections packed", "packed"),
       ("--projections packed, --loss chunked", "packed-chunked")), "standard")
for opt, label in (("sgd", "SGD, momentum 0.9"), ("adam", "Adam")):
    table("Accumulation with and without a gradient buffer ({}, micro-batch 2)".format(label),
          (("one micro-batch of 2", "micro2-" + opt), ("accumulation 4 x 2", "accum-" + opt),
           ("accumulation 4 x 2, no buffer", "accum-nobuffer-" + opt),
           ("one batch of 8", "batch8-" + opt)), "micro2-" + opt)
env = rec("standard")["env"]
print("Measured with {} timed steps after {} warm-up steps; {} thread(s), LibTorch {}, {}.".format(
    rec("standard")["time"]["timed_steps"], rec("standard")["config"]["warmup_steps"],
    env["threads"], env["libtorch"], env["device_name"]))
PY
