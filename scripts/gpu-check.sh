#!/usr/bin/env bash
# GPU readiness: builds gradscope on a CUDA machine whose only LibTorch is the one inside its
# python3's PyTorch, then runs, most valuable first, each step logged with its time and exit
# status as it ends, so that a try cut short still returns what it did:
#   1. build; the GPU tests (GoogleTest's *_CUDA*); `gradscope verify --device cuda` for the
#      four models in fp32 and in bf16
#   2. gradscope's Llama against Hugging Face's LlamaForCausalLM at the paper preset
#      (bench/peers/hf_llama_peer.py): tokens/s, peak memory, MFU; and from_pretrained on a
#      folder gradscope wrote, whose loss must be gradscope's
#   3. the four models at their paper presets in bf16, Adam, under the three strategies, a few
#      steps each, into a database, and its report
#   4. if time remains: the other study optimizers on the Llama; the Llama and NanoVLM rows
#      under --memory-cap 24GiB; the probe
# Results go to $OUT (default gpu-check-out/), eight files at most: gpu-check.log (every
# step's output), summary.txt (one line per step), gs-llama.json, hf-llama.json, gpu.db,
# report.tar.gz, probe.json. GPU_CHECK_BUDGET (seconds, default 540) stops starting steps
# that would not end in time; each step has its own timeout too.
#
# The machine may have no internet and no Debian -dev packages, so it is done in two halves:
#   scripts/gpu-check.sh prepare   here, on a Debian machine after scripts/install-deps.sh and
#                                  `make data-all`: packs into .gpu-deps.tar.xz (ignored by
#                                  git; the repository and it must stay under 64 MiB together)
#                                  the headers and static libraries the build needs beyond
#                                  LibTorch and its fmt (nlohmann-json, CLI11, toml++, SQLite, PCRE2,
#                                  libpng, zlib, GoogleTest's sources) and the data the steps
#                                  read (tokenizers, the text corpus, part of the emoji set,
#                                  Fashion-MNIST's format from the test fixture)
#   scripts/gpu-check.sh           there, with .gpu-deps.tar.xz (or .gpu-deps/) beside the
#                                  sources
# Needs CMake, Ninja, a C++20 compiler and CUDA's toolkit there (PyTorch's CMake files look
# for nvcc), and python3 with torch and transformers for step 2. The exit code is the number
# of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
deps=.gpu-deps
pack=.gpu-deps.tar.xz

if [ "${1:-}" = "prepare" ]; then
  set -e
  data="${GRADSCOPE_DATA:-$HOME/.cache/gradscope}"
  for need in tokenizers/llama3 tokenizers/gpt2 text/sotu emoji/emoji.json; do
    [ -e "$data/$need" ] || {
      echo "prepare: $data/$need is missing: run make data-all first" >&2
      exit 2
    }
  done
  rm -rf "$deps" "$pack"
  mkdir -p "$deps/include" "$deps/lib" "$deps/data/text" "$deps/data/images" "$deps/data/emoji/img"
  for d in nlohmann CLI toml++; do cp -rL "/usr/include/$d" "$deps/include/"; done
  for h in sqlite3.h sqlite3ext.h pcre2.h png.h pngconf.h pnglibconf.h zlib.h zconf.h; do
    cp -L "/usr/include/$h" "$deps/include/"
  done
  arch_lib=/usr/lib/$(gcc -print-multiarch)
  for l in libsqlite3.a libpcre2-8.a libpng16.a libz.a; do cp -L "$arch_lib/$l" "$deps/lib/"; done
  cp "$deps/lib/libpng16.a" "$deps/lib/libpng.a"
  cp -r /usr/src/googletest "$deps/googletest"
  rm -rf "$deps/googletest/googlemock/docs" "$deps/googletest/googletest/docs"
  cp -r "$data/tokenizers" "$deps/data/"
  cp -r "$data/text/sotu" "$deps/data/text/"
  # The first 1200 emoji that have an image, and their images: enough batches for a few steps
  # at the paper preset, in a tenth of the set's 22 MB.
  python3 - "$data/emoji" "$deps/data/emoji" 1200 <<'PY'
import json, re, shutil, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
items = json.load(open(f"{src}/emoji.json"))
# A downloaded name goes into a path: plain file names only.
plain = lambda name: isinstance(name, str) and re.fullmatch(r"[0-9A-Za-z_.-]+\.png", name) is not None
kept = [e for e in items if e.get("has_img_google") and plain(e.get("image"))][:n]
json.dump(kept, open(f"{dst}/emoji.json", "w"))
for e in kept:
    shutil.copy(f"{src}/img/{e['image']}", f"{dst}/img/{e['image']}")
for extra in ("LICENSE",):
    try:
        shutil.copy(f"{src}/{extra}", f"{dst}/{extra}")
    except OSError:
        pass
PY
  # ViT reads Fashion-MNIST's IDX files; the committed fixture has the same format.
  cp -r tests/fixtures/images/idx "$deps/data/images/fashion-mnist"
  tar -cJf "$pack" "$deps"
  rm -rf "$deps"
  tree_bytes=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  pack_bytes=$(stat -c %s "$pack")
  echo "prepare: $pack is $((pack_bytes >> 20)) MiB; with the repository's $((tree_bytes >> 20)) MiB," \
    "$(((pack_bytes + tree_bytes) >> 20)) of the 64 MiB a device call carries"
  exit 0
fi

out="${OUT:-gpu-check-out}"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
budget="${GPU_CHECK_BUDGET:-540}"
failed=0
summary="$out/summary.txt"
: >"$summary"
# NAME LIMIT COMMAND...: runs one step under `timeout LIMIT` unless the budget is spent; logs
# its time and exit status at once (in the log and in summary.txt).
step() {
  local name=$1 limit=$2 started=$SECONDS status
  shift 2
  if [ $((SECONDS + 10)) -gt "$budget" ]; then
    echo "=== $name: skipped, ${budget} s budget spent" | tee -a "$summary"
    return 0
  fi
  [ $((SECONDS + limit)) -le "$budget" ] || limit=$((budget - SECONDS))
  echo "=== $name (at ${SECONDS} s, up to ${limit} s): $*"
  if declare -F "$1" >/dev/null; then
    # timeout runs programs, not shell functions: a shell of its own runs the (exported) one.
    timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"
  else
    timeout --kill-after=10 "$limit" "$@"
  fi
  status=$?
  if [ $status -eq 0 ]; then
    echo "=== $name: ok in $((SECONDS - started)) s" | tee -a "$summary"
  else
    echo "=== $name: FAILED (exit $status) after $((SECONDS - started)) s" | tee -a "$summary"
    failed=$((failed + 1))
  fi
  return 0
}

if [ ! -d "$deps" ] && [ -f "$pack" ]; then tar -xJf "$pack"; fi
if [ ! -d "$deps" ]; then
  echo "no $deps/ or $pack: run 'scripts/gpu-check.sh prepare' on a Debian machine first and carry it" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda,
  "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
capability=$(python3 -c 'import torch; c = torch.cuda.get_device_capability(0); print(f"{c[0]}.{c[1]}")' 2>/dev/null || echo 9.0)
export GRADSCOPE_DATA="$PWD/$deps/data"
gs=build-gpu/gradscope
export out gs

# 1. Build, the GPU tests, verify.
step configure 120 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DTorch_DIR=$torch_prefix/Torch" "-DCMAKE_PREFIX_PATH=$PWD/$deps" "-DGRADSCOPE_GTEST_SOURCE=$PWD/$deps/googletest" \
  "-DTORCH_CUDA_ARCH_LIST=$capability" -DCMAKE_CUDA_ARCHITECTURES=native
step build 420 cmake --build build-gpu -j "$(nproc)"
if [ ! -x "$gs" ]; then
  echo "gpu-check: no binary, stopping after $failed failed step(s)"
  exit "$failed"
fi
# CTest entries are suites; the GPU tests are GoogleTest names ending in _CUDA, so run the
# test binary by filter. A filter that selects nothing must not pass.
cuda_tests() {
  local log="$out/cuda-tests.tmp" status
  build-gpu/gradscope_tests --gtest_filter='*_CUDA*' 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  grep -q '^\[  PASSED  \] [1-9]' "$log" || { echo "no GPU test ran"; status=1; }
  rm -f "$log"
  return "$status"
}
export -f cuda_tests
step cuda-tests 180 cuda_tests
for m in llama vit modernbert nanovlm; do
  step "verify-$m-fp32" 120 "$gs" verify --model "$m" --device cuda --dtype fp32
  step "verify-$m-bf16" 120 "$gs" verify --model "$m" --device cuda --dtype bf16
done

# 2. gradscope's Llama against Hugging Face's, same batch, sequence, dtype, optimizer, steps
# (10 timed after 2 untimed in both; gradscope's --steps counts the timed ones) and attention
# through scaled_dot_product_attention in both.
step llama-gradscope 240 "$gs" run --model llama --preset paper --device cuda --dtype bf16 \
  --optimizer adamw --weight-decay 0 --batch 4 --steps 10 --warmup-steps 2 --eval-batches 1 \
  --no-db --json "$out/gs-llama.json"
step llama-hf 240 python3 bench/peers/hf_llama_peer.py train --preset paper --batch 4 \
  --steps 10 --warmup 2 --dtype bf16 --attention sdpa --json "$out/hf-llama.json"
compare() {
  python3 - "$out/gs-llama.json" "$out/hf-llama.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1])); h = json.load(open(sys.argv[2]))
gt = g["throughput"]["tokens_per_s"]; ht = h["tokens_per_s"]
gm = g["memory"]["peak_bytes"]; hm = h["peak_allocated_bytes"]
f = g["flops"]
c = g["config"]
per_token = f["per_step"] / (c["batch"] * c["accum_steps"] * c["seq_len"])
peak = f.get("peak_per_s")
hf_mfu = per_token * ht / peak if peak else None
print(f"gradscope {gt:.0f} tokens/s, peak {gm / 2**30:.2f} GiB, MFU {f.get('mfu')}")
print(f"HF        {ht:.0f} tokens/s, peak {hm / 2**30:.2f} GiB, MFU {hf_mfu} ({h['attention']} attention)")
print(f"gradscope/HF tokens/s {gt / ht:.3f}, peak memory {gm / hm:.3f}")
PY
}
export -f compare
step llama-compare 30 compare
# from_pretrained on a folder gradscope wrote: the same loss as gradscope's own eval.
hf_load() {
  local w="$out/hf-load"
  rm -rf "$w" && mkdir -p "$w" &&
    "$gs" run --model llama --preset tiny --steps 20 --batch 8 --quiet --no-db --sample-period 0 \
      --json "$w/run.json" --save-weights "$w/weights" &&
    "$gs" eval --model llama --preset tiny --batch 8 --init-from "$w/weights" \
      --text tests/fixtures/text/sotu-excerpt.txt --json "$w/eval.json" &&
    python3 bench/peers/hf_llama_peer.py loss --weights "$w/weights" --seq 64 \
      --text tests/fixtures/text/sotu-excerpt.txt --gradscope-eval "$w/eval.json"
  local status=$?
  rm -rf "$w"
  return $status
}
export -f hf_load
step hf-from-pretrained 120 hf_load

# 3. The study's four models on the GPU.
cat >build-gpu/gpu-grid.toml <<'EOF'
# The study's four models at their paper presets on the GPU, Adam, the three strategies:
# a few steps each, enough to time the step and read memory, utilization and power.
name = "gpu-check"
[sweep]
jobs = 1
run_timeout = 300
[fixed]
preset = "paper"
device = "cuda"
dtype = "bf16"
optimizer = "adam"
steps = 4
warmup_steps = 1
eval_batches = 1
sample_period = 0.05
[axes]
model = ["vit", "modernbert", "llama", "nanovlm"]
strategy = ["standard", "checkpoint", "accumulation"]
[[override]]
when = { model = "vit" }
set = { batch = 64 }
[[override]]
when = { model = "modernbert" }
set = { batch = 16 }
[[override]]
when = { model = "llama" }
set = { batch = 4 }
[[override]]
when = { model = "nanovlm" }
set = { batch = 32 }
[[override]]
when = { strategy = "accumulation" }
set = { accum_steps = 4 }
EOF
step grid 400 "$gs" sweep build-gpu/gpu-grid.toml --db "$out/gpu.db" --heartbeat 30
report() {
  "$gs" report "$out/gpu.db" --out build-gpu/report && tar czf "$out/report.tar.gz" -C build-gpu report
}
export -f report
step report 60 report

# 4. If time remains.
for o in sgd adagrad adadelta cg; do
  step "llama-$o" 120 "$gs" run --model llama --preset paper --device cuda --dtype bf16 \
    --optimizer "$o" --batch 4 --steps 4 --warmup-steps 1 --eval-batches 1 --db "$out/gpu.db"
done
for m in llama nanovlm; do
  step "$m-cap-24GiB" 180 "$gs" run --model "$m" --preset paper --device cuda --dtype bf16 \
    --optimizer adam --memory-cap 24GiB --steps 4 --warmup-steps 1 --eval-batches 1 \
    --db "$out/gpu.db"
done
step probe 120 "$gs" probe --device cuda --no-db --json "$out/probe.json"
step report-again 60 report

echo "gpu-check: $failed failed step(s); results in $out/"
cat "$summary"
exit "$failed"
