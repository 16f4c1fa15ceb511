#include "gradscope/measure/peak.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/store/db.h"
#include "test_util.h"

namespace gradscope {
namespace {

using nlohmann::json;

constexpr double kTera = 1e12;

// Expects a usage error whose hint mentions `hint_fragment`.
template <typename F>
void expect_usage_error(F&& f, const std::string& hint_fragment) {
  try {
    f();
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(e.hint().find(hint_fragment), std::string::npos) << e.hint();
  }
}

// Restores the intra-op thread count (MKL's follows it), which run_probe changes, for the
// next tests.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : threads_(at::get_num_threads()) {}
  ~ThreadCountGuard() { at::set_num_threads(threads_); }

 private:
  int threads_;
};

TEST(PeakTable, NamesAsCudaReportsThem) {
  struct Case {
    const char* name;
    const char* dtype;
    double flops_per_s;
  };
  const Case cases[] = {
      {"NVIDIA H200", "bf16", 989.5 * kTera},
      {"NVIDIA H200", "fp32", 67 * kTera},
      {"NVIDIA H200 NVL", "bf16", 835.5 * kTera},
      {"NVIDIA H200 NVL", "fp32", 60 * kTera},
      {"NVIDIA H100 80GB HBM3", "bf16", 989.5 * kTera},
      {"NVIDIA H100 80GB HBM3", "tf32", 494.5 * kTera},
      {"NVIDIA H100 80GB HBM3", "fp32", 67 * kTera},
      {"NVIDIA H100", "bf16", 989.5 * kTera},  // no form factor in the name: the SXM's
      {"NVIDIA H100 PCIe", "bf16", 756.5 * kTera},
      {"NVIDIA H100 PCIe", "fp32", 51 * kTera},
      {"NVIDIA H100 NVL", "fp16", 835.5 * kTera},
      {"NVIDIA A100-SXM4-80GB", "bf16", 312 * kTera},
      {"NVIDIA A100-SXM4-40GB", "fp32", 19.5 * kTera},
      {"NVIDIA A100-PCIE-40GB", "tf32", 156 * kTera},
      {"NVIDIA A100 80GB PCIe", "fp16", 312 * kTera},
      {"NVIDIA L40S", "bf16", 362.05 * kTera},
      {"NVIDIA L40S", "fp32", 91.6 * kTera},
      {"NVIDIA L4", "bf16", 121 * kTera},
      {"NVIDIA L4", "tf32", 60 * kTera},
      {"NVIDIA A10", "bf16", 125 * kTera},
      {"NVIDIA A10", "fp32", 31.2 * kTera},
      {"Tesla V100-SXM2-16GB", "fp16", 125 * kTera},
      {"Tesla V100-SXM2-32GB", "fp32", 15.7 * kTera},
      {"Tesla V100-PCIE-16GB", "fp16", 112 * kTera},
      {"Tesla V100-PCIE-32GB", "fp32", 14 * kTera},
      {"Tesla T4", "fp16", 65 * kTera},
      {"Tesla T4", "fp32", 8.1 * kTera},
      {"NVIDIA GeForce RTX 4090", "bf16", 165.2 * kTera},
      {"NVIDIA GeForce RTX 4090", "fp32", 82.6 * kTera},
      {"NVIDIA GeForce RTX 3090", "fp16", 71 * kTera},
      {"NVIDIA GeForce RTX 3090", "fp32", 35.6 * kTera},
  };
  for (const Case& c : cases) {
    const auto peak = known_peak_flops(c.name, c.dtype);
    ASSERT_TRUE(peak.has_value()) << c.name << " " << c.dtype;
    EXPECT_DOUBLE_EQ(*peak, c.flops_per_s) << c.name << " " << c.dtype;
  }
}

TEST(PeakTable, CaseInsensitiveAndDtypeAliases) {
  EXPECT_EQ(known_peak_flops("nvidia h100 pcie", "bf16"), 756.5 * kTera);
  EXPECT_EQ(known_peak_flops("TESLA T4", "FP16"), 65 * kTera);
  EXPECT_EQ(known_peak_flops("nvidia a100-sxm4-40gb", "BF16"), 312 * kTera);
  EXPECT_EQ(known_peak_flops("NVIDIA H200", "bfloat16"), known_peak_flops("NVIDIA H200", "bf16"));
  EXPECT_EQ(known_peak_flops("NVIDIA H200", "float32"), 67 * kTera);
  EXPECT_EQ(known_peak_flops("NVIDIA H200", "float16"), 989.5 * kTera);
}

TEST(PeakTable, UnknownNamesAndMissingFiguresAreNullopt) {
  for (const char* name :
       {"", "cuda", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "AMD EPYC 7B13",
        "NVIDIA GH200 480GB", "NVIDIA A10G", "NVIDIA L40", "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU", "Tesla V100S-PCIE-32GB",
        "NVIDIA B200", "AMD Instinct MI300X"}) {
    EXPECT_FALSE(known_peak_flops(name, "fp32").has_value()) << name;
    EXPECT_FALSE(known_peak_flops(name, "bf16").has_value()) << name;
    EXPECT_EQ(known_peak_source(name, "bf16"), "") << name;
  }
  // Products without the units, and dtypes the table does not know.
  EXPECT_FALSE(known_peak_flops("Tesla V100-SXM2-16GB", "bf16").has_value());
  EXPECT_FALSE(known_peak_flops("Tesla V100-SXM2-16GB", "tf32").has_value());
  EXPECT_FALSE(known_peak_flops("Tesla T4", "bf16").has_value());
  EXPECT_FALSE(known_peak_flops("NVIDIA H100 80GB HBM3", "int8").has_value());
  EXPECT_FALSE(known_peak_flops("NVIDIA H100 80GB HBM3", "").has_value());
}

TEST(PeakTable, SourceLabelsNameTheDocumentAndProduct) {
  EXPECT_EQ(known_peak_source("NVIDIA H200", "bf16"), "datasheet: NVIDIA H200 SXM, bf16 dense");
  EXPECT_EQ(known_peak_source("NVIDIA H100 80GB HBM3", "fp32"), "datasheet: NVIDIA H100 SXM, fp32");
  EXPECT_EQ(known_peak_source("NVIDIA A100-PCIE-40GB", "tf32"),
            "datasheet: NVIDIA A100 PCIe, tf32 dense");
  EXPECT_EQ(known_peak_source("NVIDIA GeForce RTX 4090", "fp16"),
            "whitepaper: NVIDIA GeForce RTX 4090, fp16 dense");
  EXPECT_EQ(known_peak_source("Tesla T4", "bf16"), "");
}

// Catches a slipped exponent or a sparsity figure left in: every figure lies between a
// teraFLOP/s and 2 petaFLOP/s, tensor-core dtypes are at least the plain FP32 figure, TF32
// runs at half the bf16 rate (within the sources' rounding), and bf16 and fp16 at the same
// rate on every product listed.
TEST(PeakTable, FiguresAreConsistent) {
  for (const char* name :
       {"NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA L40S",
        "NVIDIA L4", "NVIDIA A10", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"}) {
    const double fp32 = known_peak_flops(name, "fp32").value();
    const double tf32 = known_peak_flops(name, "tf32").value();
    const double bf16 = known_peak_flops(name, "bf16").value();
    EXPECT_GT(fp32, 1 * kTera) << name;
    EXPECT_LT(bf16, 2000 * kTera) << name;
    EXPECT_GE(tf32, fp32) << name;
    EXPECT_NEAR(bf16, 2 * tf32, 0.02 * bf16) << name;
    EXPECT_EQ(known_peak_flops(name, "fp16"), bf16) << name;
  }
}

TEST(ProbeGemm, FlopCountIsTwoNCubed) {
  EXPECT_DOUBLE_EQ(gemm_flops(1), 2.0);
  EXPECT_DOUBLE_EQ(gemm_flops(1000), 2e9);
  EXPECT_DOUBLE_EQ(gemm_flops(8192), 2.0 * 8192.0 * 8192.0 * 8192.0);
}

TEST(ProbeDevice, ParsesCpuAndRefusesOthersWithAHint) {
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  expect_usage_error([] { parse_device("gpu"); }, "cpu, cuda or cuda:N");
  expect_usage_error([] { parse_device(""); }, "cpu, cuda or cuda:N");
  if (!torch::cuda::is_available()) {
    expect_usage_error([] { parse_device("cuda"); }, "--device cpu");
    expect_usage_error([] { parse_device("cuda:0"); }, "--device cpu");
  } else {
    expect_usage_error([] { parse_device("cuda:99"); }, "CUDA device(s)");
  }
}

TEST(ProbeDevice, CpuNameIsTheOneRunsRecord) {
  EXPECT_EQ(reported_device_name(torch::Device(torch::kCPU)), current_env("cpu").device_name);
}

void expect_finite_positive(const json& value, const std::string& what) {
  ASSERT_TRUE(value.is_number()) << what << ": " << value.dump();
  const double v = value.get<double>();
  EXPECT_TRUE(std::isfinite(v)) << what << ": " << v;
  EXPECT_GT(v, 0.0) << what;
}

TEST(ProbeCpu, MeasuresFp32GemmAndBandwidth) {
  ThreadCountGuard guard;
  ProbeOptions options;
  options.threads = 1;
  options.seconds = 0.05;
  options.sizes = {64, 128};
  options.copy_bytes = 8LL << 20;
  const json probe = run_probe(torch::Device(torch::kCPU), options);

  EXPECT_EQ(probe["schema"], "gradscope.probe/1");
  EXPECT_EQ(probe["device"], "cpu");
  EXPECT_EQ(probe["device_name"], current_env("cpu").device_name);
  EXPECT_EQ(probe["host"], current_env("cpu").host);
  EXPECT_EQ(probe["threads"], 1);
  EXPECT_EQ(probe["libtorch"], current_env("cpu").libtorch);
  EXPECT_EQ(probe["created_at"].get<std::string>().size(), 20u);
  EXPECT_TRUE(probe["skipped"].empty()) << probe["skipped"].dump();

  ASSERT_EQ(probe["gemm"].size(), 2u) << probe.dump();
  double best = 0;
  for (size_t i = 0; i < 2; ++i) {
    const json& row = probe["gemm"][i];
    EXPECT_EQ(row["dtype"], "fp32");
    EXPECT_EQ(row["n"], options.sizes[i]);
    expect_finite_positive(row["flops_per_s"], "gemm flops_per_s");
    // A clock that read 0 would give infinity; one core of this decade stays far below this.
    EXPECT_LT(row["flops_per_s"].get<double>(), 1e13);
    best = std::max(best, row["flops_per_s"].get<double>());
  }
  ASSERT_EQ(probe["peak"].size(), 1u) << probe["peak"].dump();  // only fp32 on the CPU
  EXPECT_DOUBLE_EQ(probe["peak"]["fp32"].get<double>(), best);
  expect_finite_positive(probe["bandwidth_bytes_per_s"], "bandwidth_bytes_per_s");
  EXPECT_LT(probe["bandwidth_bytes_per_s"].get<double>(), 1e13);
}

TEST(ProbeCpu, DefaultSizesAndThreadsInUse) {
  ThreadCountGuard guard;
  ProbeOptions options;
  options.seconds = 0.01;  // one warm-up and one timed product per size
  options.copy_bytes = 8LL << 20;
  const json probe = run_probe(torch::Device(torch::kCPU), options);
  std::vector<int64_t> sizes;
  for (const json& row : probe["gemm"]) sizes.push_back(row["n"].get<int64_t>());
  EXPECT_EQ(sizes, (std::vector<int64_t>{512, 1024, 2048}));
  EXPECT_EQ(probe["threads"], at::get_num_threads());  // threads 0: whatever is in use
}

TEST(ProbeCpu, RefusesBadOptions) {
  const torch::Device cpu(torch::kCPU);
  ProbeOptions options;
  options.seconds = 0;
  expect_usage_error([&] { run_probe(cpu, options); }, "--seconds");
  options.seconds = 1;
  options.threads = -1;
  expect_usage_error([&] { run_probe(cpu, options); }, "--threads");
  options.threads = 0;
  options.sizes = {128, 0};
  expect_usage_error([&] { run_probe(cpu, options); }, "1024");
}

TEST(ProbeCuda, MeasuresEveryDtypeOnTheGpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  ProbeOptions options;
  options.seconds = 0.5;
  options.sizes = {2048};
  options.copy_bytes = 64LL << 20;
  const json probe = run_probe(torch::Device(torch::kCUDA, 0), options);
  const std::string name = probe["device_name"];
  EXPECT_FALSE(name.empty());
  EXPECT_NE(name, "cuda");  // the GPU's own name, so the table can know it
  expect_finite_positive(probe["peak"]["fp32"], "fp32 peak");
  expect_finite_positive(probe["bandwidth_bytes_per_s"], "bandwidth");
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    const auto known = known_peak_flops(name, dtype);
    if (known && probe["peak"].contains(dtype)) {
      // Measured under the datasheet figure, with room for boost clocks above the listed.
      EXPECT_LT(probe["peak"][dtype].get<double>(), 1.1 * *known) << dtype;
    }
  }
}

class PeakDevice : public ::testing::Test {
 protected:
  testing::TempDir dir_{"gradscope-peak"};
};

// The peak a run finds: with the newest probe of its host, device and thread count in the
// database, or with no probe when there is no database.
DevicePeak run_peak(const std::string& device_name, const std::string& dtype,
                    const std::string& host, int threads, Database* db) {
  return device_peak(device_name, dtype,
                     db ? db->latest_probe(host, device_name, threads) : json());
}

json probe_with_peak(const std::string& device_name, const std::string& host, int threads,
                     const std::string& created_at, const json& peak) {
  return {{"schema", "gradscope.probe/1"},
          {"device_name", device_name},
          {"host", host},
          {"threads", threads},
          {"peak", peak},
          {"created_at", created_at}};
}

TEST_F(PeakDevice, TableComesBeforeAProbe) {
  Database db(dir_.file("peak.db"));
  db.save_probe(probe_with_peak("NVIDIA H100 80GB HBM3", "h", 1, "2024-05-01T00:00:00Z",
                                {{"bf16", 7e14}, {"fp32", 5e13}}));
  const DevicePeak peak = run_peak("NVIDIA H100 80GB HBM3", "bf16", "h", 1, &db);
  ASSERT_TRUE(peak.flops_per_s.has_value());
  EXPECT_DOUBLE_EQ(*peak.flops_per_s, 989.5 * kTera);
  EXPECT_EQ(peak.source, "datasheet: NVIDIA H100 SXM, bf16 dense");
}

TEST_F(PeakDevice, ProbeOfTheSameHostDeviceAndThreadsWhenNotInTheTable) {
  Database db(dir_.file("peak.db"));
  db.save_probe(probe_with_peak("Some CPU", "h", 2, "2024-05-01T00:00:00Z", {{"fp32", 4e10}}));
  db.save_probe(probe_with_peak("Some CPU", "h", 2, "2024-06-01T00:00:00Z", {{"fp32", 5e10}}));
  const DevicePeak peak = run_peak("Some CPU", "fp32", "h", 2, &db);
  ASSERT_TRUE(peak.flops_per_s.has_value());
  EXPECT_DOUBLE_EQ(*peak.flops_per_s, 5e10);
  EXPECT_EQ(peak.source, "probe 2024-06-01T00:00:00Z");

  // Another thread count, host or device, a dtype the probe did not measure, or no
  // database: unknown, not a neighbour's figure.
  for (const DevicePeak& other :
       {run_peak("Some CPU", "fp32", "h", 1, &db), run_peak("Some CPU", "fp32", "g", 2, &db),
        run_peak("Other CPU", "fp32", "h", 2, &db), run_peak("Some CPU", "bf16", "h", 2, &db),
        run_peak("Some CPU", "fp32", "h", 2, nullptr)}) {
    EXPECT_FALSE(other.flops_per_s.has_value());
    EXPECT_EQ(other.source, "unknown");
  }
}

TEST_F(PeakDevice, AMeasuredProbeIsFoundByTheNameRunsRecord) {
  ThreadCountGuard guard;
  ProbeOptions options;
  options.threads = 1;
  options.seconds = 0.02;
  options.sizes = {64};
  options.copy_bytes = 1LL << 20;
  const EnvInfo env = current_env("cpu");
  if (known_peak_flops(env.device_name, "fp32")) GTEST_SKIP() << "this CPU's name is in the table";
  const json probe = run_probe(torch::Device(torch::kCPU), options);
  Database db(dir_.file("peak.db"));
  db.save_probe(probe);
  const DevicePeak peak = run_peak(env.device_name, "fp32", env.host, 1, &db);
  ASSERT_TRUE(peak.flops_per_s.has_value());
  EXPECT_DOUBLE_EQ(*peak.flops_per_s, probe["peak"]["fp32"].get<double>());
  EXPECT_EQ(peak.source, "probe " + probe["created_at"].get<std::string>());
}

}  // namespace
}  // namespace gradscope
