#!/usr/bin/env bash
# Compiles and links gradscope and its tests against a CUDA LibTorch, with no GPU needed:
#   scripts/check-cuda.sh VENV BUILD JOBS      (`make check-cuda`; CI runs it)
# VENV holds the CUDA PyTorch wheel (requirements-cuda.txt). nvcc must be of the wheel's CUDA
# major (CUDA_HOME, else /usr/local/cuda, else the one on PATH). Ends by showing that the
# binary links LibTorch's CUDA library and NCCL's process group, and runs here.
set -euo pipefail
venv=${1:?usage: check-cuda.sh VENV BUILD JOBS}
build=${2:?usage: check-cuda.sh VENV BUILD JOBS}
jobs=${3:-$(nproc)}
start=$(date +%s)

nvcc=""
for candidate in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then nvcc=$candidate; break; fi
done
[ -n "$nvcc" ] || { echo "check-cuda: no nvcc (set CUDA_HOME to a CUDA toolkit)" >&2; exit 2; }
toolkit=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9]*\).*/\1.\2/p')
wheel=$("$venv/bin/python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
[ -n "$wheel" ] || { echo "check-cuda: $venv's torch is not a CUDA build" >&2; exit 2; }
echo "check-cuda: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) (CUDA $wheel), nvcc $toolkit ($nvcc)"
if [ "${wheel%%.*}" != "${toolkit%%.*}" ]; then
  echo "check-cuda: the wheel's CUDA major ($wheel) is not nvcc's ($toolkit): install a toolkit of CUDA ${wheel%%.*}" >&2
  exit 2
fi

torch_dir=$("$venv/bin/python" -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))' 2>/dev/null)
toolkit_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
# LibTorch's CMake files look for NVRTC in the toolkit; a toolkit without it (as here) has the
# wheel's own, from its nvidia-cuda-nvrtc package.
nvrtc=$(find "$toolkit_root/lib64" "$venv" -name 'libnvrtc.so*' 2>/dev/null | head -1)
[ -n "$nvrtc" ] || { echo "check-cuda: no libnvrtc in $toolkit_root or $venv" >&2; exit 2; }
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_dir" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDA_TOOLKIT_ROOT_DIR="$toolkit_root" \
  -DCUDAToolkit_ROOT="$toolkit_root" -DCUDA_nvrtc_LIBRARY="$nvrtc"
cmake --build "$build" -j "$jobs"

echo "check-cuda: what the CUDA build links:"
readelf -d "$build/gradscope" | grep -E 'NEEDED.*(torch|c10)' | sed 's/^ */  /'
nccl=$(nm -C "$build/gradscope" | grep -c 'c10d::ProcessGroupNCCL::ProcessGroupNCCL(' || true)
echo "  c10d::ProcessGroupNCCL constructed by gradscope (ranks on CUDA): $nccl call site(s)"
if [ "$nccl" -eq 0 ]; then
  echo "check-cuda: the build has no NCCL path (no nccl.h beside the wheel?): see CMake's output" >&2
  exit 1
fi
echo "  tests ending in _CUDA: $("$build/gradscope_tests" --gtest_list_tests | grep -c '_CUDA' || true)"
echo "check-cuda: the CUDA build runs here: $("$build/gradscope" --version); without a GPU a run on"
echo "  CUDA is refused by name:"
"$build/gradscope" run --model llama --preset tiny --steps 1 --device cuda --no-db \
  --json "$build/check-cuda-run.json" 2>&1 | head -2 | sed 's/^/  /' || true
echo "check-cuda: done in $(( $(date +%s) - start )) s"
