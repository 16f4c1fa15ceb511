// Fuzz targets: each feeds bytes to one of gradscope's parsers of outside input. Bad input is
// expected to end in a gradscope::Error (a usage error: exit 2), which a target swallows;
// anything else (a crash, a sanitizer report, another exception, a broken round trip) is a
// finding and is let out (exceptions escape, broken properties abort).
// Each target is linked into a libFuzzer binary (fuzz/<name>_fuzzer.cpp, built with
// -DGRADSCOPE_FUZZ=ON) and into the test binary, which replays the committed corpora
// (fuzz/corpus/<name>/) in the normal build (tests/fuzz/corpus_test.cpp; docs/testing.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradscope {

// A Hugging Face tokenizer.json; a tokenizer that loads must give back the text it encodes.
int fuzz_tokenizer_json(const uint8_t* data, size_t size);
// GPT-2's encoder.json and vocab.bpe, split at the first NUL byte (JSON text holds none).
int fuzz_gpt2_vocab(const uint8_t* data, size_t size);
// An IDX file, plain or gzip; a tensor that loads must have as many bytes as its dims say.
int fuzz_idx(const uint8_t* data, size_t size);
// A PNG file; an image that loads is (3, H, W) uint8.
int fuzz_png(const uint8_t* data, size_t size);
// A sweep file (TOML), read both as a sweep and as a single run configuration.
int fuzz_sweep_file(const uint8_t* data, size_t size);
// A run record (JSON); a record that loads must write a record that loads to the same JSON.
int fuzz_run_record(const uint8_t* data, size_t size);

// A .safetensors file: its header checked, then its tensors read.
int fuzz_safetensors(const uint8_t* data, size_t size);
// A model's config.json, read over each published model's tiny preset, and the tensor list of
// the architecture it gives.
int fuzz_hf_config(const uint8_t* data, size_t size);
// A training state's state.json, read as --resume reads it before any tensor.
int fuzz_train_state(const uint8_t* data, size_t size);
// A memory timeline file, parsed and replayed; a replay that passes its checks must end with
// totals that add up and a peak that is the largest total.
int fuzz_memory_timeline(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // also the corpus folder: fuzz/corpus/<name>
  int (*run)(const uint8_t* data, size_t size);
};
// Every target above, in the order listed.
const std::vector<FuzzTarget>& fuzz_targets();

}  // namespace gradscope
