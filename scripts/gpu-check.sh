#!/usr/bin/env bash
# GPU readiness: builds gradscope on a CUDA machine whose only LibTorch is the one inside its
# python3's PyTorch, then runs the GPU tests (`_CUDA`), `gradscope verify` on CUDA, the probe,
# a short grid at the paper presets and its report, and writes every result file to $OUT
# (default gpu-check-out/).
#
# The machine may have no internet and no Debian -dev packages, so it is done in two halves:
#   scripts/gpu-check.sh prepare   here, on a Debian machine after scripts/install-deps.sh and
#                                  `make data`: copies into .gpu-deps/ (about 55 MB, ignored by
#                                  git) the headers and static libraries the build needs beyond
#                                  LibTorch (fmt, nlohmann-json, CLI11, toml++, SQLite, PCRE2,
#                                  libpng, zlib, GoogleTest's sources) and the data the grid
#                                  reads (tokenizers, the text corpus, the emoji set)
#   scripts/gpu-check.sh           there, with .gpu-deps/ beside the sources
# Needs CMake, Ninja, a C++17 compiler and CUDA's toolkit there (PyTorch's CMake files look
# for nvcc). Each step's failure is logged and the next step still runs; the exit code is the
# number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
deps=.gpu-deps

if [ "${1:-}" = "prepare" ]; then
  set -e
  data="${GRADSCOPE_DATA:-$HOME/.cache/gradscope}"
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/lib" "$deps/data/text" "$deps/data/images"
  for d in fmt nlohmann CLI toml++; do cp -rL "/usr/include/$d" "$deps/include/"; done
  for h in sqlite3.h sqlite3ext.h pcre2.h png.h pngconf.h pnglibconf.h zlib.h zconf.h; do
    cp -L "/usr/include/$h" "$deps/include/"
  done
  arch_lib=/usr/lib/$(gcc -print-multiarch)
  for l in libsqlite3.a libpcre2-8.a libpng16.a libz.a; do cp -L "$arch_lib/$l" "$deps/lib/"; done
  cp "$deps/lib/libpng16.a" "$deps/lib/libpng.a"
  cp -r /usr/src/googletest "$deps/googletest"
  cp -r "$data/tokenizers" "$deps/data/"
  cp -r "$data/text/sotu" "$deps/data/text/"
  cp -r "$data/emoji" "$deps/data/"
  # ViT reads Fashion-MNIST's IDX files; the committed fixture has the same format.
  cp -r tests/fixtures/images/idx "$deps/data/images/fashion-mnist"
  du -sh "$deps"
  exit 0
fi

out="${OUT:-gpu-check-out}"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
failed=0
step() {  # NAME COMMAND...: runs one step, logs its time and outcome, counts failures
  local name=$1 started=$SECONDS
  shift
  echo "=== $name: $*"
  if "$@"; then
    echo "=== $name: ok in $((SECONDS - started)) s"
  else
    echo "=== $name: FAILED (exit $?) after $((SECONDS - started)) s"
    failed=$((failed + 1))
  fi
}

if [ ! -d "$deps" ]; then
  echo "no $deps/: run 'scripts/gpu-check.sh prepare' on a Debian machine first and carry it" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda,
  "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
capability=$(python3 -c 'import torch; c = torch.cuda.get_device_capability(0); print(f"{c[0]}.{c[1]}")' 2>/dev/null || echo 9.0)
export GRADSCOPE_DATA="$PWD/$deps/data"
gs=build-gpu/gradscope

step configure cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$torch_prefix;$PWD/$deps" "-DGRADSCOPE_GTEST_SOURCE=$PWD/$deps/googletest" \
  "-DTORCH_CUDA_ARCH_LIST=$capability" -DCMAKE_CUDA_ARCHITECTURES=native
step build cmake --build build-gpu -j "$(nproc)"
if [ ! -x "$gs" ]; then
  echo "gpu-check: no binary, stopping after $failed failed step(s)"
  exit "$failed"
fi
step cuda-tests bash -c "cd build-gpu && ctest -R '_CUDA' --output-on-failure | tee ../$out/ctest-cuda.txt"
step verify bash -c "for m in llama vit modernbert nanovlm; do $gs verify --model \$m --device cuda || exit 1; done | tee $out/verify.txt"
step probe "$gs" probe --device cuda --no-db --json "$out/probe.json"
cat > build-gpu/gpu-grid.toml <<'EOF'
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
step grid bash -c "$gs sweep build-gpu/gpu-grid.toml --db $out/gpu.db | tee $out/grid.txt"
step report bash -c "$gs report $out/gpu.db --out build-gpu/report && tar czf $out/report.tar.gz -C build-gpu report"
echo "gpu-check: $failed failed step(s); results in $out/"
exit "$failed"
