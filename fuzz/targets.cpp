#include "fuzz/targets.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gradscope/core/error.h"
#include "gradscope/core/json_input.h"
#include "gradscope/core/memory_timeline.h"
#include "gradscope/core/record.h"
#include "gradscope/core/safetensors.h"
#include "gradscope/data/bpe.h"
#include "gradscope/data/images.h"
#include "gradscope/models/hf_weights.h"
#include "gradscope/models/registry.h"
#include "gradscope/sweep/grid.h"
#include "gradscope/train/train_state.h"

namespace gradscope {
namespace {

// A broken property: says which, and aborts so that libFuzzer keeps the input.
[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

// Runs `fn`; a gradscope::Error is the expected end of bad input, anything else gets out.
template <typename Fn>
int swallow_errors(const Fn& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
  return 0;
}

std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Text every byte-level BPE must give back unchanged: it starts with a space (so no prefix
// space is added) and holds non-ASCII letters, runs of whitespace, digits, a contraction and
// bytes that are not UTF-8.
const char kRoundTripText[] =
    " Hello world!\n\nna\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 I'LL "
    "say it's 1234567.\r\n\t tabs  and   spaces \n\xff\xfe bytes \xc3 cut";

void check_round_trip(const BpeTokenizer& tokenizer) {
  const std::string text = kRoundTripText;
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= tokenizer.vocab_size())
      finding("encode() gave id " + std::to_string(id) + " outside the vocabulary");
  if (tokenizer.decode(ids) != text) finding("decode(encode(text)) is not the text");
}

// Reads every byte of a uint8 tensor in instrumented code, so that AddressSanitizer sees a
// tensor whose data are shorter than its shape says.
void touch(const torch::Tensor& t) {
  static volatile uint64_t sink = 0;
  const uint8_t* p = t.data_ptr<uint8_t>();
  uint64_t sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  sink = sink + sum;
}

// One temporary file per process and name ending, rewritten for each input of a target that
// reads a path.
std::string scratch_file(const std::string& ending) {
  static std::map<std::string, std::string> paths;
  const auto it = paths.find(ending);
  if (it != paths.end()) return it->second;
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("gradscope-fuzz-XXXXXX" + ending)).string();
  const int fd = ::mkstemps(pattern.data(), static_cast<int>(ending.size()));
  if (fd < 0) finding("cannot make a temporary file");
  ::close(fd);
  if (paths.empty())
    std::atexit([] {
      for (const auto& named : paths) std::remove(named.second.c_str());
    });
  paths[ending] = pattern;
  return pattern;
}

// One temporary folder per process, removed at exit. The name is never destroyed: the exit
// handler that removes the folder reads it, and a static string would be destroyed first.
const std::string& scratch_folder() {
  static const std::string* const path = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gradscope-fuzz-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) finding("cannot make a temporary folder");
    auto* made = new std::string(pattern);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_folder(), ec);
    });
    return made;
  }();
  return *path;
}

void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) finding("cannot write " + path);
}

}  // namespace

int fuzz_tokenizer_json(const uint8_t* data, size_t size) {
  return swallow_errors([&] {
    check_round_trip(
        *parse_hf_tokenizer(text_of(data, size), "tokenizer.json", "fuzz", "<|end_of_text|>"));
  });
}

int fuzz_gpt2_vocab(const uint8_t* data, size_t size) {
  const std::string text = text_of(data, size);
  const size_t split = text.find('\0');
  const std::string encoder = text.substr(0, split);
  const std::string merges = split == std::string::npos ? "" : text.substr(split + 1);
  return swallow_errors([&] {
    check_round_trip(*parse_gpt2_tokenizer(encoder, merges, "encoder.json", "vocab.bpe", "fuzz",
                                           "<|endoftext|>"));
  });
}

int fuzz_idx(const uint8_t* data, size_t size) {
  return swallow_errors([&] {
    const torch::Tensor t = decode_idx(text_of(data, size), "fuzz.idx");
    if (t.scalar_type() != torch::kUInt8 || t.dim() < 1) finding("read_idx gave a bad tensor");
    touch(t);
  });
}

int fuzz_png(const uint8_t* data, size_t size) {
  return swallow_errors([&] {
    const torch::Tensor t =
        decode_png_rgb(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.png");
    if (t.scalar_type() != torch::kUInt8 || t.dim() != 3 || t.size(0) != 3)
      finding("read_png_rgb gave a bad tensor");
    touch(t);
  });
}

int fuzz_sweep_file(const uint8_t* data, size_t size) {
  const std::string path = scratch_file(".toml");
  write_bytes(path, data, size);
  swallow_errors([&] {
    for (const RunSpec& run : load_sweep(path).runs) run.args();
  });
  return swallow_errors([&] { load_run_config(path).args(); });
}

int fuzz_run_record(const uint8_t* data, size_t size) {
  RunRecord record;
  try {
    record = record_from_json(parse_json_input(text_of(data, size), "run record"));
  } catch (const Error&) {
    return 0;
  }
  // What loads must write a record that loads, and to the same JSON.
  const nlohmann::json written = record_to_json(record);
  std::string text;
  try {
    text = written.dump();
  } catch (const nlohmann::json::exception& e) {
    finding(std::string("record_to_json wrote JSON that cannot be printed: ") + e.what());
  }
  RunRecord again;
  try {
    again = record_from_json(parse_json_input(text, "written run record"));
  } catch (const Error& e) {
    finding(std::string("a written record does not load: ") + e.what());
  }
  if (record_to_json(again) != written) finding("a record changes when written and read again");
  return 0;
}

int fuzz_safetensors(const uint8_t* data, size_t size) {
  const std::string path = scratch_file(".safetensors");
  write_bytes(path, data, size);
  return swallow_errors([&] {
    const std::vector<SafetensorsEntry> entries = read_safetensors_header(path);
    const std::map<std::string, torch::Tensor> tensors = read_safetensors(path);
    if (tensors.size() != entries.size()) finding("the header and the tensors read differ");
    for (const SafetensorsEntry& e : entries) {
      const auto it = tensors.find(e.name);
      if (it == tensors.end() || it->second.sizes() != at::IntArrayRef(e.shape) ||
          it->second.numel() * it->second.element_size() != e.end - e.begin)
        finding("tensor " + e.name + " is not as its header entry says");
    }
  });
}

int fuzz_hf_config(const uint8_t* data, size_t size) {
  nlohmann::json config;
  try {
    config = parse_json_input_unique(text_of(data, size), "config.json");
  } catch (const Error&) {
    return 0;
  }
  for (const char* model : {"llama", "modernbert", "vit", "nanovlm"}) {
    swallow_errors([&] {
      const nlohmann::json base = model_registry().get(model).preset("tiny");
      const nlohmann::json arch = arch_from_hf_config(model, config, base, "config.json");
      // The limits keep the tensor list of any architecture a config can give short.
      const auto shapes = hf_tensor_shapes(model, arch);
      if (shapes.size() > 100'000) finding("a config.json gives a list of " +
                                           std::to_string(shapes.size()) + " tensors");
    });
  }
  return 0;
}

int fuzz_train_state(const uint8_t* data, size_t size) {
  const std::string& dir = scratch_folder();
  write_bytes(dir + "/state.json", data, size);
  swallow_errors([&] { read_train_state_info(dir); });
  return swallow_errors([&] { read_train_progress(dir); });
}

int fuzz_memory_timeline(const uint8_t* data, size_t size) {
  return swallow_errors([&] {
    const MemoryTimeline t = parse_memory_timeline(text_of(data, size), "timeline");
    const TimelineReplay r = replay_memory_timeline(t, "timeline");
    if (r.live.size() != t.events.size()) finding("the replay lost events");
    for (size_t i = 0; i < r.live.size(); ++i) {
      int64_t sum = 0;
      for (const int64_t v : r.by_component[i]) {
        if (v < 0) finding("a component's live bytes went below zero");
        sum += v;
      }
      if (sum != r.live[i] || r.live[i] > r.peak_bytes) finding("the totals do not add up");
    }
    int64_t at_peak = 0;
    for (const auto& b : r.live_at_peak) at_peak += b.bytes;
    if (r.peak_event >= 0 && at_peak != r.peak_bytes) finding("the peak's blocks miss bytes");
  });
}

const std::vector<FuzzTarget>& fuzz_targets() {
  static const std::vector<FuzzTarget> targets{
      {"tokenizer_json", &fuzz_tokenizer_json},
      {"gpt2_vocab", &fuzz_gpt2_vocab},
      {"idx", &fuzz_idx},
      {"png", &fuzz_png},
      {"sweep_file", &fuzz_sweep_file},
      {"run_record", &fuzz_run_record},
      {"safetensors", &fuzz_safetensors},
      {"hf_config", &fuzz_hf_config},
      {"train_state", &fuzz_train_state},
      {"memory_timeline", &fuzz_memory_timeline},
  };
  return targets;
}

}  // namespace gradscope
