#include "gradscope/measure/peak.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/measure/clock.h"

namespace gradscope {
namespace {

using nlohmann::json;

constexpr double kTera = 1e12;

// Published peaks of one product in TFLOP/s; 0 where it has none (no bf16 or tf32 units
// before Ampere).
struct TeraFlops {
  double fp32;
  double tf32;
  double bf16;
  double fp16;
};

// One product of the table. Its name matches a reported device name when every word of
// `words` is a word of the lower-cased reported name (words are split at anything but
// letters and digits) and no word of `excluded` is. Matching whole words keeps "a10" from
// matching "a100", "l4" from "l40s" and "h200" from "gh200".
struct PeakEntry {
  const char* product;   // as the source label names it
  const char* document;  // "datasheet" or "whitepaper"
  std::vector<std::string> words;
  std::vector<std::string> excluded;
  TeraFlops dense;
};

constexpr char kDatasheet[] = "datasheet";
constexpr char kWhitepaper[] = "whitepaper";

// Published dense peaks. The datasheets print tensor-core figures with 2:4 sparsity (marked
// *, "one-half lower without sparsity"); the figures here are the dense halves. First match
// wins, so a specific form factor stands before its family's default.
const std::vector<PeakEntry>& peak_table() {
  static const std::vector<PeakEntry> table = {
      // NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: FP32 60, TF32 835*,
      // BF16 1,671*, FP16 1,671* TFLOPS.
      {"NVIDIA H200 NVL", kDatasheet, {"h200", "nvl"}, {}, {60, 417.5, 835.5, 835.5}},
      // Same datasheet, H200 SXM column: FP32 67, TF32 989*, BF16 1,979*, FP16 1,979*.
      // The SXM board reports itself as plain "NVIDIA H200".
      {"NVIDIA H200 SXM", kDatasheet, {"h200"}, {}, {67, 494.5, 989.5, 989.5}},
      // NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: FP32 60, TF32 835*,
      // BF16 1,671*, FP16 1,671*.
      {"NVIDIA H100 NVL", kDatasheet, {"h100", "nvl"}, {}, {60, 417.5, 835.5, 835.5}},
      // Same datasheet, H100 PCIe column: FP32 51, TF32 756*, BF16 1,513*, FP16 1,513*.
      {"NVIDIA H100 PCIe", kDatasheet, {"h100", "pcie"}, {}, {51, 378, 756.5, 756.5}},
      // Same datasheet, H100 SXM column: FP32 67, TF32 989*, BF16 1,979*, FP16 1,979*. The
      // SXM5 board reports "NVIDIA H100 80GB HBM3". A name with no form factor in it (plain
      // "NVIDIA H100") is ambiguous; it gets the SXM figures, the board such names come from
      // most often, so its MFU may read low if it is in fact a slower board.
      {"NVIDIA H100 SXM", kDatasheet, {"h100"}, {}, {67, 494.5, 989.5, 989.5}},
      // NVIDIA A100 Tensor Core GPU datasheet: the 40GB and 80GB, PCIe and SXM4 boards share
      // FP32 19.5, TF32 156 (312*), BF16 312 (624*), FP16 312 (624*). Reported as e.g.
      // "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB".
      {"NVIDIA A100 PCIe", kDatasheet, {"a100", "pcie"}, {}, {19.5, 156, 312, 312}},
      {"NVIDIA A100 SXM4", kDatasheet, {"a100"}, {}, {19.5, 156, 312, 312}},
      // NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16 362.05 (733*),
      // FP16 362.05 (733*).
      {"NVIDIA L40S", kDatasheet, {"l40s"}, {}, {91.6, 183, 362.05, 362.05}},
      // NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16 242*, FP16 242*.
      {"NVIDIA L4", kDatasheet, {"l4"}, {}, {30.3, 60, 121, 121}},
      // NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16 125 (250*), FP16 125 (250*).
      // The A10G (AWS) is another board and is not matched.
      {"NVIDIA A10", kDatasheet, {"a10"}, {}, {31.2, 62.5, 125, 125}},
      // NVIDIA Tesla V100 datasheet: single precision 15.7 (SXM2) / 14 (PCIe); tensor
      // performance (FP16 products, FP32 accumulate) 125 / 112. No TF32 or BF16 units.
      // V100S, SXM3 and other boards clock differently and are not matched.
      {"NVIDIA V100 SXM2", kDatasheet, {"v100", "sxm2"}, {}, {15.7, 0, 0, 125}},
      {"NVIDIA V100 PCIe", kDatasheet, {"v100", "pcie"}, {}, {14, 0, 0, 112}},
      // NVIDIA T4 datasheet: single precision 8.1, mixed precision (FP16/FP32) 65.
      {"NVIDIA T4", kDatasheet, {"t4"}, {}, {8.1, 0, 0, 65}},
      // NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 specifications: FP32 82.6,
      // TF32 tensor 82.6, BF16 and FP16 tensor with FP32 accumulate 165.2 (LibTorch's
      // matmuls accumulate in FP32; GeForce boards do FP16 accumulate twice as fast). The
      // 4090 D and laptop parts have other figures.
      {"NVIDIA GeForce RTX 4090",
       kWhitepaper,
       {"rtx", "4090"},
       {"d", "laptop", "mobile"},
       {82.6, 82.6, 165.2, 165.2}},
      // NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A (GeForce RTX 3090):
      // FP32 35.6, TF32 tensor 35.6, BF16 and FP16 tensor with FP32 accumulate 71.
      {"NVIDIA GeForce RTX 3090",
       kWhitepaper,
       {"rtx", "3090"},
       {"ti", "laptop", "mobile"},
       {35.6, 35.6, 71, 71}},
  };
  return table;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> words;
  std::string word;
  for (unsigned char c : lower(name)) {
    if (std::isalnum(c)) {
      word += static_cast<char>(c);
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

const PeakEntry* find_entry(const std::string& device_name) {
  const std::vector<std::string> words = words_of(device_name);
  const auto has = [&](const std::string& w) {
    return std::find(words.begin(), words.end(), w) != words.end();
  };
  for (const PeakEntry& entry : peak_table()) {
    if (std::all_of(entry.words.begin(), entry.words.end(), has) &&
        std::none_of(entry.excluded.begin(), entry.excluded.end(), has)) {
      return &entry;
    }
  }
  return nullptr;
}

// "fp32", "tf32", "bf16" or "fp16" for the names a user or a record may use; "" otherwise.
std::string canonical_dtype(const std::string& dtype) {
  const std::string d = lower(dtype);
  if (d == "fp32" || d == "float32" || d == "float") return "fp32";
  if (d == "tf32") return "tf32";
  if (d == "bf16" || d == "bfloat16") return "bf16";
  if (d == "fp16" || d == "float16" || d == "half") return "fp16";
  return "";
}

// FLOP/s of `dtype` (canonical) on the product; 0 when it has none.
double entry_flops_per_s(const PeakEntry& entry, const std::string& dtype) {
  const TeraFlops& f = entry.dense;
  if (dtype == "fp32") return f.fp32 * kTera;
  if (dtype == "tf32") return f.tf32 * kTera;
  if (dtype == "bf16") return f.bf16 * kTera;
  if (dtype == "fp16") return f.fp16 * kTera;
  return 0;
}

// The GPU's name from the CUDA driver API (cuDeviceGetName), "" when the driver library or
// the device is not there. Device ordinals follow CUDA_VISIBLE_DEVICES, as LibTorch's do.
std::string cuda_driver_device_name(int ordinal) {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (lib == nullptr) return "";
  using Init = int (*)(unsigned int);
  using DeviceGet = int (*)(int*, int);
  using DeviceGetName = int (*)(char*, int, int);
  const auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  const auto device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
  const auto device_get_name = reinterpret_cast<DeviceGetName>(dlsym(lib, "cuDeviceGetName"));
  std::string name;
  int device = 0;
  char text[256] = {};
  if (init != nullptr && device_get != nullptr && device_get_name != nullptr && init(0) == 0 &&
      device_get(&device, ordinal) == 0 &&
      device_get_name(text, static_cast<int>(sizeof(text)) - 1, device) == 0) {
    name = text;
  }
  dlclose(lib);
  return name;
}

// Seconds of one call of `op`, the best over timed blocks that fill about budget_s after
// one untimed warm-up call (which pays for first-use costs: page faults, BLAS handles and
// kernel selection). A block repeats the call until it lasts about kBlockS, so that the
// synchronize and clock read around it are small next to it. At least one block is timed
// whatever the budget.
double best_call_seconds(const std::function<void()>& op, const torch::Device& device,
                         double budget_s) {
  constexpr double kBlockS = 2e-3;
  constexpr int64_t kMaxCallsPerBlock = 1000;
  const SteadyClock clock;
  const double start_s = clock.now_s();
  op();
  sync(device);
  double t0_s = clock.now_s();
  op();
  sync(device);
  double best_s = clock.now_s() - t0_s;
  const int64_t calls = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(kBlockS / std::max(best_s, 1e-9))), 1, kMaxCallsPerBlock);
  while (clock.now_s() - start_s < budget_s) {
    sync(device);
    t0_s = clock.now_s();
    for (int64_t i = 0; i < calls; ++i) op();
    sync(device);
    best_s = std::min(best_s, (clock.now_s() - t0_s) / static_cast<double>(calls));
  }
  return best_s;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

std::optional<double> known_peak_flops(const std::string& device_name, const std::string& dtype) {
  const PeakEntry* entry = find_entry(device_name);
  if (entry == nullptr) return std::nullopt;
  const double figure = entry_flops_per_s(*entry, canonical_dtype(dtype));
  if (figure <= 0) return std::nullopt;
  return figure;
}

std::string known_peak_source(const std::string& device_name, const std::string& dtype) {
  if (!known_peak_flops(device_name, dtype)) return "";
  const PeakEntry* entry = find_entry(device_name);
  const std::string d = canonical_dtype(dtype);
  // "dense" marks the tensor-core figures, which the sources also print with sparsity.
  return fmt::format("{}: {}, {}{}", entry->document, entry->product, d,
                     d == "fp32" ? "" : " dense");
}

DevicePeak device_peak(const std::string& device_name, const std::string& dtype,
                       const json& probe) {
  if (const auto known = known_peak_flops(device_name, dtype)) {
    return {known, known_peak_source(device_name, dtype)};
  }
  {
    if (probe.is_object()) {
      const auto peak = probe.find("peak");
      const std::string d = canonical_dtype(dtype);
      if (peak != probe.end() && peak->is_object() && !d.empty()) {
        const auto value = peak->find(d);
        if (value != peak->end() && value->is_number() && value->get<double>() > 0) {
          return {value->get<double>(), "probe " + probe.value("created_at", std::string("?"))};
        }
      }
    }
  }
  return {std::nullopt, "unknown"};
}

std::string reported_device_name(const torch::Device& device) {
  if (device.is_cuda()) {
    const std::string name = cuda_driver_device_name(device.has_index() ? device.index() : 0);
    if (!name.empty()) return name;
    return current_env("cuda").device_name;
  }
  return current_env("cpu").device_name;
}

torch::Device parse_device(const std::string& text) {
  if (text == "cpu") return torch::Device(torch::kCPU);
  if (text.rfind("cuda", 0) == 0) {
    check_usage(torch::cuda::is_available(), "device '" + text + "' asked for, but no CUDA device",
                "no GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or this build's "
                "LibTorch has no CUDA (docs/gpu.md); or use --device cpu");
    try {
      torch::Device device(text);
      check_usage(device.index() < static_cast<int>(torch::cuda::device_count()),
                  "device '" + text + "' does not exist",
                  fmt::format("this machine has {} CUDA device(s): use cuda:0 .. cuda:{}",
                              torch::cuda::device_count(), torch::cuda::device_count() - 1));
      return device;
    } catch (const c10::Error&) {
      fail_usage("cannot read device '" + text + "'", "write cpu, cuda or cuda:N");
    }
  }
  fail_usage("unknown device '" + text + "'", "write cpu, cuda or cuda:N");
}

json run_probe(const torch::Device& device, const ProbeOptions& options) {
  check_usage(std::isfinite(options.seconds) && options.seconds > 0,
              fmt::format("probe time {} s must be positive", options.seconds),
              "pass --seconds with a value such as 3");
  check_usage(options.threads >= 0, fmt::format("--threads {} must be 0 or more", options.threads),
              "pass --threads 0 for LibTorch's default, or the count to measure with");
  if (options.threads > 0) {
    at::set_num_threads(options.threads);
  }
  std::vector<int64_t> sizes = options.sizes;
  if (sizes.empty()) {
    sizes = device.is_cuda() ? std::vector<int64_t>{1024, 2048, 4096, 8192}
                             : std::vector<int64_t>{512, 1024, 2048};
  }
  for (const int64_t n : sizes) {
    check_usage(n > 0, fmt::format("GEMM size {} must be positive", n), "use sizes such as 1024");
  }
  const int64_t copy_bytes = options.copy_bytes > 0
                                 ? options.copy_bytes
                                 : (device.is_cuda() ? (1LL << 30) : (256LL << 20));

  // The dtypes a run's matmuls can run in on this device (--dtype fp32 or bf16, and fp16).
  std::vector<std::pair<std::string, torch::ScalarType>> dtypes = {{"fp32", torch::kFloat}};
  if (device.is_cuda()) {
    dtypes.push_back({"bf16", torch::kBFloat16});
    dtypes.push_back({"fp16", torch::kHalf});
  }
  const double share_s = options.seconds / static_cast<double>(dtypes.size() * sizes.size() + 1);

  torch::NoGradGuard no_grad;
  json gemm = json::array();
  json peak = json::object();
  json skipped = json::array();
  for (const auto& [name, scalar_type] : dtypes) {
    for (const int64_t n : sizes) {
      try {
        const auto options_of = torch::TensorOptions().dtype(scalar_type).device(device);
        const torch::Tensor a = torch::randn({n, n}, options_of);  // (n, n)
        const torch::Tensor b = torch::randn({n, n}, options_of);  // (n, n)
        torch::Tensor c = torch::empty({n, n}, options_of);        // (n, n)
        const double seconds = best_call_seconds([&] { torch::mm_out(c, a, b); }, device, share_s);
        const double flops_per_s = gemm_flops(n) / seconds;
        gemm.push_back({{"dtype", name}, {"n", n}, {"flops_per_s", flops_per_s}});
        if (!peak.contains(name) || peak[name].get<double>() < flops_per_s)
          peak[name] = flops_per_s;
      } catch (const c10::Error& e) {
        // A dtype the device has no kernels for, or a size that does not fit: say so and go on.
        skipped.push_back(
            {{"dtype", name}, {"n", n}, {"reason", first_line(e.what_without_backtrace())}});
      }
    }
  }

  json bandwidth = nullptr;
  try {
    const auto float_on_device = torch::TensorOptions().dtype(torch::kFloat).device(device);
    const int64_t elements = std::max<int64_t>(copy_bytes / 4, 1);
    const torch::Tensor source = torch::ones({elements}, float_on_device);
    torch::Tensor target = torch::zeros({elements}, float_on_device);
    const double seconds = best_call_seconds([&] { target.copy_(source); }, device, share_s);
    bandwidth = 2.0 * static_cast<double>(source.nbytes()) / seconds;
  } catch (const c10::Error& e) {
    skipped.push_back(
        {{"dtype", "copy"}, {"n", copy_bytes}, {"reason", first_line(e.what_without_backtrace())}});
  }

  const EnvInfo env = current_env(device.str());
  return {{"schema", "gradscope.probe/1"},
          {"gradscope", env.gradscope_version},
          {"device", device.str()},
          {"device_name", reported_device_name(device)},
          {"host", env.host},
          {"threads", at::get_num_threads()},
          {"blas_threads", blas_threads()},
          {"libtorch", env.libtorch},
          {"seconds", options.seconds},
          {"gemm", gemm},
          {"peak", peak},
          {"bandwidth_bytes_per_s", bandwidth},
          {"skipped", skipped},
          {"created_at", utc_now_iso8601()}};
}

}  // namespace gradscope
