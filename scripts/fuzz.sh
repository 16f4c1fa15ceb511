#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ and merges what they find into the committed corpora.
#   scripts/fuzz.sh [TARGET|all] [SECONDS]     (defaults: all, $FUZZ_TIME or 300 seconds each)
# Needs the fuzzers built (`make fuzz`; $FUZZ_BUILD, default build-fuzz). Each target starts
# from fuzz/corpus/TARGET, writes what it finds to $FUZZ_BUILD/fuzz-work/TARGET, and then
# -merge=1 adds to fuzz/corpus/TARGET only the inputs that reach new edges of the code. The
# committed corpora stay small: no input over 256 KiB, and at most $FUZZ_CORPUS_KB (320) KiB
# of merged inputs per target, the smallest kept (seed-* and crash-* files always stay).
# A crash, a sanitizer report or a broken property stops the target and leaves its
# input in $FUZZ_BUILD/findings/TARGET/ (crash-*, leak-*, timeout-*, oom-*); the script ends
# with exit 1 when any target found something. Reproduce with
#   $FUZZ_BUILD/TARGET_fuzzer $FUZZ_BUILD/findings/TARGET/crash-...
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${FUZZ_BUILD:-$repo/build-fuzz}" && pwd)"
which="${1:-all}"
seconds="${2:-${FUZZ_TIME:-300}}"
all=(tokenizer_json gpt2_vocab idx png sweep_file run_record safetensors hf_config train_state
     memory_timeline)
max_corpus_file=262144
budget=$((${FUZZ_CORPUS_KB:-320} * 1024))

# LibTorch is not instrumented: its leaks at exit and its globals are not ours to report.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:detect_odr_violation=0:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

max_len() {
  case "$1" in
    idx | png) echo 1048576 ;;
    *) echo 65536 ;;
  esac
}

if [ "$which" = all ]; then targets=("${all[@]}"); else targets=("$which"); fi
found=0
for target in "${targets[@]}"; do
  fuzzer="$build/${target}_fuzzer"
  [ -x "$fuzzer" ] || { echo "fuzz.sh: no $fuzzer (run make fuzz)" >&2; exit 2; }
  corpus="$repo/fuzz/corpus/$target"
  work="$build/fuzz-work/$target"
  findings="$build/findings/$target"
  mkdir -p "$corpus" "$work" "$findings"
  echo "== $target: ${seconds}s"
  set +e
  "$fuzzer" "$work" "$corpus" -max_total_time="$seconds" -max_len="$(max_len "$target")" \
    -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 -artifact_prefix="$findings/" 2>&1 |
    tee "$build/fuzz-$target.log" | grep -E "^#[0-9]+ +(DONE|INITED)|ERROR|finding|stat::"
  status="${PIPESTATUS[0]}"
  set -e
  if [ "$status" -ne 0 ]; then
    echo "== $target: finding (exit $status), see $build/fuzz-$target.log and $findings/"
    found=1
  fi
  # New inputs that reach new edges (hit counts aside: -use_counters=0) join the corpus.
  "$fuzzer" -merge=1 -use_counters=0 -max_len="$(max_len "$target")" \
    -artifact_prefix="$findings/" "$corpus" "$work" \
    >"$build/merge-$target.log" 2>&1 || echo "== $target: merge failed, see $build/merge-$target.log"
  find "$corpus" -type f -size +"${max_corpus_file}c" -print -delete |
    sed 's/^/== dropped (larger than 256 KiB): /'
  kept=$(find "$corpus" -type f \( -name 'seed-*' -o -name 'crash-*' \) -printf '%s\n' |
    awk '{ s += $1 } END { print s + 0 }')
  find "$corpus" -type f ! -name 'seed-*' ! -name 'crash-*' -printf '%s %p\n' | sort -n |
    awk -v used="$kept" -v budget="$budget" '{ used += $1 } used > budget { print substr($0, index($0, " ") + 1) }' |
    xargs -r -d '\n' rm -f
  echo "== $target: $(find "$corpus" -type f | wc -l) corpus files, $(du -sh --apparent-size "$corpus" | cut -f1)"
done
exit "$found"
