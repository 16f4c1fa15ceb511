// The peak FLOP/s a device can do, the denominator of MFU (model FLOPs utilization):
//   mfu = achieved FLOP/s / peak FLOP/s of the dtype the matmuls run in.
// Two sources, in this order:
//   1. a table of published dense peaks (no 2:4 sparsity) of NVIDIA GPUs, from the vendor's
//      datasheets and architecture whitepapers, matched on the name CUDA reports;
//   2. `gradscope probe`: the best GEMM FLOP/s measured on this host, device and thread
//      count, stored in the results database.
// Neither: the peak is unknown and MFU stays null rather than a guess.
//
// Units: FLOP/s (one multiply-add counts 2), bytes/s. Dtype names: "fp32", "tf32", "bf16",
// "fp16". "fp32" is the plain FP32 (CUDA core) figure: LibTorch leaves TF32 off for matmuls
// by default, so an fp32 run does not reach the TF32 tensor-core figure.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradscope {

// The published dense peak of `dtype` on the GPU CUDA/NVML calls `device_name` (e.g.
// "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4"), case-insensitive; nullopt
// for a device not in the table or a dtype the product has no figure for (bf16 on a V100).
std::optional<double> known_peak_flops(const std::string& device_name, const std::string& dtype);

// Where known_peak_flops' figure comes from, e.g. "datasheet: NVIDIA H200 SXM, bf16 dense";
// "" when it has none.
std::string known_peak_source(const std::string& device_name, const std::string& dtype);

// A device's peak for one dtype and where it came from: "datasheet: ...", "whitepaper: ...",
// "probe <created_at>", or "unknown" (flops_per_s nullopt).
struct DevicePeak {
  std::optional<double> flops_per_s;
  std::string source;
};

// The table first; else, when `probe` (the newest probe of the same host, device name and
// thread count, as the database finds it; null when there is none) measured `dtype`, its best
// FLOP/s; else {nullopt, "unknown"}. A CPU's peak depends on its thread count, so the caller
// must not pass a probe with other threads.
DevicePeak device_peak(const std::string& device_name, const std::string& dtype,
                       const nlohmann::json& probe);

// The name runs and probes record for a device: the CPU model (as current_env() gives it)
// on the CPU; on CUDA the GPU's own name as the driver reports it ("NVIDIA H200"), read
// through the driver library at run time so that a CPU-only build compiles it too. Falls
// back to current_env()'s name when the driver cannot be asked.
std::string reported_device_name(const torch::Device& device);

// "cpu", "cuda" or "cuda:N" -> the device; anything else, or CUDA on a machine without it,
// is a usage error whose hint says what to write.
torch::Device parse_device(const std::string& text);

// FLOPs of one (n x n) @ (n x n) matrix product: n^3 multiply-adds.
inline double gemm_flops(int64_t n) {
  const double d = static_cast<double>(n);
  return 2.0 * d * d * d;
}

// What run_probe measures and for how long.
struct ProbeOptions {
  // Intra-op and BLAS threads to measure with; 0 keeps LibTorch's current setting. The
  // record says the count in use either way.
  int threads = 0;
  // Wall-clock budget for the whole probe, in seconds, shared evenly between the
  // measurements. Each still gets one warm-up and one timed repetition, so a tiny budget
  // gives a quick, noisier answer rather than none.
  double seconds = 3.0;
  // Square GEMM sizes; empty: 512, 1024, 2048 on the CPU, 1024 .. 8192 on CUDA (large
  // sizes reach the peak, small ones show the launch and cache effects).
  std::vector<int64_t> sizes;
  // Bytes of each of the two buffers of the copy that measures memory bandwidth; 0: 256 MiB
  // on the CPU (well past any cache), 1 GiB on CUDA.
  int64_t copy_bytes = 0;
};

// Measures the device: for each dtype (fp32; on CUDA also bf16 and fp16) and size, the best
// FLOP/s = 2 n^3 / time of one product over timed repetitions after a warm-up (on CUDA the
// device is synchronized before each clock read); and the bandwidth of a tensor copy,
// (bytes read + bytes written) / time, best of its repetitions. Returns the probe record:
//   {"schema": "gradscope.probe/1", "device", "device_name", "host", "threads",
//    "blas_threads", "libtorch", "seconds", "gemm": [{"dtype", "n", "flops_per_s"}],
//    "peak": {dtype: best flops_per_s over sizes}, "bandwidth_bytes_per_s",
//    "skipped": [{"dtype", "n", "reason"}], "created_at"}
// A dtype or size the device cannot multiply (bf16 on an old GPU, a size that does not fit)
// is listed in "skipped" ("dtype": "copy", "n": bytes for the copy) instead of failing.
nlohmann::json run_probe(const torch::Device& device, const ProbeOptions& options = {});

}  // namespace gradscope
