#include "gradscope/measure/sensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "gradscope-sensors-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// ---------------------------------------------------------------------------------------
// ProcCpuSensor

// A /proc/<pid>/stat line: `comm` in parentheses, then fields 3..52 with utime (14), stime
// (15) and num_threads (20) set, every other field 0 except the state.
std::string stat_line(const std::string& comm, uint64_t utime, uint64_t stime, int threads) {
  std::string line = "4242 (" + comm + ") S";
  for (int field = 4; field <= 52; ++field) {
    uint64_t value = 0;
    if (field == 14) value = utime;
    if (field == 15) value = stime;
    if (field == 20) value = static_cast<uint64_t>(threads);
    line += " " + std::to_string(value);
  }
  return line + "\n";
}

TEST(ProcCpuSensor, ParsesFakeFilesWithAwkwardComm) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // Spaces, a ')' and digits in the name: fields must be counted from the last ')'.
  write_file(fs::path(dir.path()) / "stat", stat_line("my (odd) 1 2 3 prog)", 250, 50, 7));
  write_file(fs::path(dir.path()) / "statm", "1000 300 20 10 0 200 0\n");
  ProcCpuSensor sensor(dir.path());
  const auto reading = sensor.read();
  ASSERT_TRUE(reading.has_value());
  const double ticks_per_s = static_cast<double>(sysconf(_SC_CLK_TCK));
  EXPECT_DOUBLE_EQ(reading->cpu_s, 300.0 / ticks_per_s);
  EXPECT_EQ(reading->threads, 7);
  EXPECT_EQ(reading->rss_bytes, 300 * static_cast<int64_t>(sysconf(_SC_PAGESIZE)));
}

TEST(ProcCpuSensor, RefusesMissingOrMalformedFiles) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const fs::path stat = fs::path(dir.path()) / "stat", statm = fs::path(dir.path()) / "statm";
  ProcCpuSensor sensor(dir.path());
  EXPECT_FALSE(sensor.read().has_value());  // no files at all

  write_file(stat, stat_line("prog", 12345, 2, 3));
  EXPECT_FALSE(sensor.read().has_value());  // no statm
  write_file(statm, "1000 300\n");
  EXPECT_TRUE(sensor.read().has_value());

  write_file(stat, "4242 (prog) S 1 2 3 4 5\n");  // cut short before utime
  EXPECT_FALSE(sensor.read().has_value());
  std::string garbled = stat_line("prog", 12345, 2, 3);
  garbled.replace(garbled.find(" 12345 "), 7, " 12x45 ");  // utime is not a number
  write_file(stat, garbled);
  EXPECT_FALSE(sensor.read().has_value()) << garbled;
  write_file(stat, "4242 prog S 1\n");  // no ')'
  EXPECT_FALSE(sensor.read().has_value());

  write_file(stat, stat_line("prog", 1, 2, 3));
  write_file(statm, "1000 -5\n");
  EXPECT_FALSE(sensor.read().has_value());
}

TEST(ProcCpuSensor, ReadsThisProcess) {
  // Burn a little CPU so that at least one clock tick is charged.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < until) sink = sink + 1.0;
  ProcCpuSensor sensor;
  const auto reading = sensor.read();
  ASSERT_TRUE(reading.has_value());
  EXPECT_GT(reading->cpu_s, 0.0);
  EXPECT_GE(reading->threads, 1);
  EXPECT_GT(reading->rss_bytes, 1 << 20);  // LibTorch alone is far larger than 1 MiB
}

// ---------------------------------------------------------------------------------------
// NVML through a table of fakes

// What the fake driver reports, and what it was asked.
struct FakeNvml {
  NvmlReturn util_rc = kNvmlSuccess, memory_rc = kNvmlSuccess, power_rc = kNvmlSuccess,
             clock_rc = kNvmlSuccess, energy_rc = kNvmlSuccess, handle_rc = kNvmlSuccess;
  int asked_index = -1;
  std::string asked_uuid;
  int asked_clock_type = -1;
};
FakeNvml fake;
NvmlDeviceOpaque* const kFakeDevice = reinterpret_cast<NvmlDeviceOpaque*>(0x1234);

NvmlReturn fake_handle_by_index(unsigned int index, NvmlDevice* device) {
  fake.asked_index = static_cast<int>(index);
  *device = kFakeDevice;
  return fake.handle_rc;
}
NvmlReturn fake_handle_by_uuid(const char* uuid, NvmlDevice* device) {
  fake.asked_uuid = uuid;
  *device = kFakeDevice;
  return fake.handle_rc;
}
NvmlReturn fake_utilization(NvmlDevice device, NvmlUtilization* u) {
  if (device != kFakeDevice) return 999;
  u->gpu = 77;
  u->memory = 12;
  return fake.util_rc;
}
NvmlReturn fake_memory(NvmlDevice device, NvmlMemory* m) {
  if (device != kFakeDevice) return 999;
  m->total = 141ull << 30;
  m->used = 3ull << 30;
  m->free = m->total - m->used;
  return fake.memory_rc;
}
NvmlReturn fake_power(NvmlDevice device, unsigned int* mw) {
  if (device != kFakeDevice) return 999;
  *mw = 123456;
  return fake.power_rc;
}
NvmlReturn fake_clock(NvmlDevice device, int type, unsigned int* mhz) {
  if (device != kFakeDevice) return 999;
  fake.asked_clock_type = type;
  *mhz = 1980;
  return fake.clock_rc;
}
NvmlReturn fake_energy(NvmlDevice device, unsigned long long* mj) {
  if (device != kFakeDevice) return 999;
  *mj = 5000500;
  return fake.energy_rc;
}
NvmlReturn fake_name(NvmlDevice device, char* name, unsigned int length) {
  std::strncpy(name, "Fake H200", length);
  return kNvmlSuccess;
}
const char* fake_error_string(NvmlReturn rc) { return rc == 3 ? "Not Supported" : "Unknown"; }

NvmlApi fake_api() {
  fake = FakeNvml();
  NvmlApi api;
  api.nvmlDeviceGetHandleByIndex_v2 = &fake_handle_by_index;
  api.nvmlDeviceGetHandleByUUID = &fake_handle_by_uuid;
  api.nvmlDeviceGetUtilizationRates = &fake_utilization;
  api.nvmlDeviceGetMemoryInfo = &fake_memory;
  api.nvmlDeviceGetPowerUsage = &fake_power;
  api.nvmlDeviceGetClockInfo = &fake_clock;
  api.nvmlDeviceGetTotalEnergyConsumption = &fake_energy;
  api.nvmlDeviceGetName = &fake_name;
  api.nvmlErrorString = &fake_error_string;
  return api;
}

// Sets (or unsets, with nullptr) an environment variable and puts back what was there.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvGuard() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(NvmlSensor, ConvertsUnits) {
  EnvGuard env("CUDA_VISIBLE_DEVICES", nullptr);
  NvmlSensor sensor(fake_api(), 0);
  EXPECT_EQ(sensor.name(), "Fake H200");
  const GpuReading r = sensor.read();
  ASSERT_TRUE(r.util_pct && r.power_w && r.sm_clock_mhz && r.energy_j && r.memory_used_bytes);
  EXPECT_DOUBLE_EQ(*r.util_pct, 77.0);
  EXPECT_DOUBLE_EQ(*r.power_w, 123.456);  // mW -> W
  EXPECT_DOUBLE_EQ(*r.energy_j, 5000.5);  // mJ -> J
  EXPECT_DOUBLE_EQ(*r.sm_clock_mhz, 1980.0);
  EXPECT_EQ(fake.asked_clock_type, kNvmlClockSm);
  EXPECT_EQ(*r.memory_used_bytes, int64_t{3} << 30);
}

TEST(NvmlSensor, UnsupportedFieldsAreNullNotZero) {
  EnvGuard env("CUDA_VISIBLE_DEVICES", nullptr);
  NvmlApi api = fake_api();
  api.nvmlDeviceGetClockInfo = nullptr;  // a symbol an old driver lacks
  NvmlSensor sensor(api, 0);
  fake.util_rc = kNvmlErrorNotSupported;    // e.g. a MIG instance
  fake.energy_rc = kNvmlErrorNotSupported;  // e.g. a pre-Volta GPU
  fake.memory_rc = 999;                     // any other failure
  const GpuReading r = sensor.read();
  EXPECT_FALSE(r.util_pct.has_value());
  EXPECT_FALSE(r.energy_j.has_value());
  EXPECT_FALSE(r.memory_used_bytes.has_value());
  EXPECT_FALSE(r.sm_clock_mhz.has_value());
  ASSERT_TRUE(r.power_w.has_value());
  EXPECT_DOUBLE_EQ(*r.power_w, 123.456);
}

TEST(NvmlSensor, WithoutCudaVisibleDevicesUsesTheSameIndex) {
  EnvGuard env("CUDA_VISIBLE_DEVICES", nullptr);
  NvmlSensor sensor(fake_api(), 3);
  EXPECT_EQ(fake.asked_index, 3);
  EXPECT_EQ(fake.asked_uuid, "");
}

TEST(NvmlSensor, MapsThroughCudaVisibleDevices) {
  {
    EnvGuard env("CUDA_VISIBLE_DEVICES", "6, 2");
    NvmlSensor sensor(fake_api(), 1);
    EXPECT_EQ(fake.asked_index, 2);
  }
  {
    EnvGuard env("CUDA_VISIBLE_DEVICES", "GPU-aaaa-1111,MIG-bbbb-2222");
    NvmlSensor first(fake_api(), 0);
    EXPECT_EQ(fake.asked_uuid, "GPU-aaaa-1111");
    NvmlSensor second(fake_api(), 1);
    EXPECT_EQ(fake.asked_uuid, "MIG-bbbb-2222");
    EXPECT_EQ(fake.asked_index, -1);
  }
  {
    // CUDA stops at the first entry that names no device: only "4" is visible.
    EnvGuard env("CUDA_VISIBLE_DEVICES", "4,-1,5");
    NvmlSensor sensor(fake_api(), 0);
    EXPECT_EQ(fake.asked_index, 4);
    EXPECT_THROW(NvmlSensor(fake_api(), 1), Error);
  }
  {
    EnvGuard env("CUDA_VISIBLE_DEVICES", "");
    EXPECT_THROW(NvmlSensor(fake_api(), 0), Error);
  }
}

TEST(NvmlSensor, UnknownDeviceThrowsWithTheDriversReason) {
  EnvGuard env("CUDA_VISIBLE_DEVICES", nullptr);
  NvmlApi api = fake_api();
  fake.handle_rc = 2;  // NVML_ERROR_INVALID_ARGUMENT
  try {
    NvmlSensor sensor(api, 5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("index 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NVML error 2"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(NvmlSensor(fake_api(), -1), Error);
}

TEST(NvmlLoad, MissingLibraryGivesAReason) {
  std::string why;
  EXPECT_FALSE(load_nvml(&why, "libgradscope-no-such-nvml.so.1").has_value());
  EXPECT_NE(why.find("libgradscope-no-such-nvml.so.1 not found"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;  // one line
  EXPECT_FALSE(load_nvml(nullptr, "libgradscope-no-such-nvml.so.1").has_value());
}

// Without an NVIDIA driver (the build machines) NVML must be refused with a reason; with
// one, the sensor must read the device CUDA calls 0.
TEST(NvmlLoad, OnThisMachine) {
  std::string why;
  auto api = load_nvml(&why);
  if (!api) {
    EXPECT_FALSE(why.empty());
    EXPECT_TRUE(why.find("nvidia-ml") != std::string::npos || why.find("nvml") != std::string::npos)
        << why;
    why.clear();
    EXPECT_EQ(open_nvml_sensor(0, &why), nullptr);
    EXPECT_FALSE(why.empty());
    return;
  }
  EXPECT_TRUE(api->library);
  auto sensor = open_nvml_sensor(0, &why);
  ASSERT_NE(sensor, nullptr) << why;
  EXPECT_FALSE(sensor->name().empty());
  const GpuReading r = sensor->read();
  EXPECT_TRUE(r.memory_used_bytes.has_value());
}

// ---------------------------------------------------------------------------------------
// RAPL on a fake powercap tree

void write_zone(const fs::path& root, const std::string& dir, const std::string& name,
                uint64_t energy_uj, uint64_t range_uj) {
  write_file(root / dir / "name", name + "\n");
  write_file(root / dir / "energy_uj", std::to_string(energy_uj) + "\n");
  write_file(root / dir / "max_energy_range_uj", std::to_string(range_uj) + "\n");
}

TEST(RaplCounter, SumsPackagesAndUnwrapsEachOnItsOwn) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const fs::path root = dir.path();
  write_zone(root, "intel-rapl:0", "package-0", 1'000'000, 10'000'000);  // 1 J of 10
  write_zone(root, "intel-rapl:1", "package-1", 2'000'000, 20'000'000);  // 2 J of 20
  write_zone(root, "intel-rapl:0:0", "core", 500'000, 10'000'000);       // inside package-0
  write_zone(root, "intel-rapl:2", "psys", 90'000'000, 100'000'000);     // whole platform
  write_zone(root, "intel-rapl-mmio:0", "package-0", 7'000'000, 10'000'000);
  std::string why;
  auto rapl = open_rapl(&why, root.string());
  ASSERT_NE(rapl, nullptr) << why;
  EXPECT_FALSE(rapl->wrap_j().has_value());
  EXPECT_NE(rapl->source().find("package-0 + package-1"), std::string::npos) << rapl->source();
  EXPECT_EQ(rapl->source().find("psys"), std::string::npos) << rapl->source();

  auto first = rapl->read_j();
  ASSERT_TRUE(first.has_value());
  EXPECT_NEAR(*first, 3.0, 1e-9);
  write_file(root / "intel-rapl:0" / "energy_uj", "9000000\n");  // +8 J
  EXPECT_NEAR(*rapl->read_j(), 11.0, 1e-9);
  write_file(root / "intel-rapl:0" / "energy_uj", "500000\n");   // wrapped: +1.5 J
  write_file(root / "intel-rapl:1" / "energy_uj", "3000000\n");  // +1 J
  EXPECT_NEAR(*rapl->read_j(), 13.5, 1e-9);

  fs::remove(root / "intel-rapl:1" / "energy_uj");
  EXPECT_FALSE(rapl->read_j().has_value());
  write_file(root / "intel-rapl:1" / "energy_uj", "4000000\n");  // +1 J; package-0 unchanged
  EXPECT_NEAR(*rapl->read_j(), 14.5, 1e-9);
}

TEST(RaplCounter, PlatformZoneOnlyWhenNoPackage) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  write_zone(dir.path(), "intel-rapl:0", "psys", 4'000'000, 100'000'000);
  std::string why;
  auto rapl = open_rapl(&why, dir.path());
  ASSERT_NE(rapl, nullptr) << why;
  EXPECT_NEAR(*rapl->read_j(), 4.0, 1e-9);
  EXPECT_NE(rapl->source().find("psys"), std::string::npos);
}

TEST(RaplCounter, RefusedWithAReason) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const fs::path root = dir.path();
  std::string why;
  EXPECT_EQ(open_rapl(&why, (root / "absent").string()), nullptr);
  EXPECT_NE(why.find("no RAPL zones"), std::string::npos) << why;

  write_zone(root, "intel-rapl:0", "package-0", 1, 10);
  fs::remove(root / "intel-rapl:0" / "energy_uj");  // what a non-root user meets, as far as
  why.clear();                                      // reading goes
  EXPECT_EQ(open_rapl(&why, root.string()), nullptr);
  EXPECT_NE(why.find("energy_uj"), std::string::npos) << why;

  write_file(root / "intel-rapl:0" / "energy_uj", "garbage\n");
  why.clear();
  EXPECT_EQ(open_rapl(&why, root.string()), nullptr);
  EXPECT_FALSE(why.empty());

  // This machine: a counter, or a reason why not.
  why.clear();
  auto real = open_rapl(&why);
  EXPECT_TRUE(real != nullptr || !why.empty());
}

}  // namespace
}  // namespace gradscope
