#!/usr/bin/env bash
# Installs every Debian package gradscope needs to build, test, fetch data and draw figures,
# on Debian 12 or 13. LibTorch is not among them: it comes from the PyTorch wheel pinned in
# requirements.txt, in the project's own environment (scripts/python-env.sh).
# Idempotent: packages already present are skipped, so a second run costs a few seconds.
#   scripts/install-deps.sh          what `make test` and `make demo` need
#   scripts/install-deps.sh bench    also perf, for the benchmarks
#   scripts/install-deps.sh fuzz     also clang and its libFuzzer runtime, for `make fuzz`
set -euo pipefail

packages=(
  # toolchain; venv for the project's Python environment (scripts/python-env.sh) where the
  # Python 3.11 on PATH is Debian's own
  g++ cmake ninja-build make pkg-config git ca-certificates xz-utils python3-venv
  # command line, configuration, JSON
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  # results database, tokenizer regexes, gzipped IDX files, emoji images
  libsqlite3-dev sqlite3 libpcre2-dev zlib1g-dev libpng-dev
  # tests and micro-benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # figures (plain gnuplot pulls in Qt); headless Chromium renders the HTML report in a test
  gnuplot-nox chromium
  # a one-node Slurm cluster for the tests of the emitted job arrays (scripts/slurm-cluster.sh)
  slurmctld slurmd slurm-client munge
  # data sets shipped by Debian
  dataset-fashion-mnist
)
if [ "${1:-}" = "bench" ]; then
  # a profiler
  packages+=(linux-perf)
fi
if [ "${1:-}" = "fuzz" ]; then
  # libFuzzer and the sanitizers come with clang's runtime (Debian 12: clang 14; 13: clang 19)
  packages+=(clang libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Node.js and npm fetch the npm data packages; they are preinstalled on these machines and
# Debian's npm package conflicts with them, so only install Debian's when none is present.
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
echo "install-deps: done"
