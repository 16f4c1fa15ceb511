// Sensors the sampler reads: this process's CPU time, threads and RSS (/proc), one GPU's
// utilization, memory, power, clock and energy (NVML), and the CPU packages' energy (RAPL).
// Each sits behind an interface so that tests drive the sampler with fakes, and each reports a
// value it cannot read as nullopt: a record says null (n/a), never 0.
//
// Units are in the names: _s seconds, _bytes bytes, _pct percent, _w watts, _j joules,
// _mhz megahertz.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradscope {

// ---------------------------------------------------------------------------------------
// CPU

struct CpuReading {
  double cpu_s = 0.0;     // CPU seconds (user + system) of the whole process, all threads
  int threads = 0;        // threads the process has now
  int64_t rss_bytes = 0;  // resident set size now
};

class CpuSensor {
 public:
  virtual ~CpuSensor() = default;
  // nullopt when the system does not answer.
  virtual std::optional<CpuReading> read() = 0;
};

// Reads <proc_dir>/stat and <proc_dir>/statm, so tests can point it at fake files. CPU time
// comes in clock ticks (sysconf(_SC_CLK_TCK), 100 per second on Linux): a sampling period of
// 0.1 s sees 10 ticks, so one sample's utilization is only good to about +-10 points, while
// the sum over a run is exact to one tick.
class ProcCpuSensor final : public CpuSensor {
 public:
  explicit ProcCpuSensor(std::string proc_dir = "/proc/self");
  // nullopt if either file is unreadable or malformed.
  std::optional<CpuReading> read() override;

 private:
  std::string proc_dir_;
  double ticks_per_s_;
  int64_t page_bytes_;
};

// ---------------------------------------------------------------------------------------
// GPU

// One read of one GPU. Each field is nullopt when the device or driver does not report it
// (MIG instances report no utilization; older GPUs have no energy counter).
struct GpuReading {
  std::optional<double> util_pct;            // time a kernel ran, over NVML's last window
  std::optional<double> power_w;             // board power draw now
  std::optional<double> sm_clock_mhz;        // streaming multiprocessor clock now
  std::optional<double> energy_j;            // the device's cumulative energy counter
  std::optional<int64_t> memory_used_bytes;  // device memory used, by all processes
};

class GpuSensor {
 public:
  virtual ~GpuSensor() = default;
  virtual GpuReading read() = 0;
  // The device's name as the driver gives it (e.g. "NVIDIA H200").
  virtual std::string name() const = 0;
};

// The few NVML types this code needs, declared here with NVML's layout so that no NVML
// header is needed at build time (nvml.h: nvmlReturn_t, nvmlDevice_t, nvmlUtilization_t,
// nvmlMemory_t, nvmlClockType_t).
using NvmlReturn = int;  // NVML_SUCCESS = 0
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent
  unsigned int memory;  // percent of time device memory was read or written
};
struct NvmlMemory {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
};
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlErrorNotSupported = 3;
constexpr int kNvmlClockSm = 1;                    // NVML_CLOCK_SM
constexpr unsigned int kNvmlDeviceNameBytes = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

// NVML's entry points as a table of function pointers with NVML's C signatures. The members
// keep NVML's own names so each maps to its documentation. load_nvml() fills them from the
// driver's library; tests fill them with their own functions. A null device query (a symbol
// an old driver lacks) reads as "not supported".
struct NvmlApi {
  NvmlReturn (*nvmlInit_v2)() = nullptr;
  NvmlReturn (*nvmlShutdown)() = nullptr;
  NvmlReturn (*nvmlDeviceGetHandleByIndex_v2)(unsigned int index, NvmlDevice* device) = nullptr;
  NvmlReturn (*nvmlDeviceGetHandleByUUID)(const char* uuid, NvmlDevice* device) = nullptr;
  NvmlReturn (*nvmlDeviceGetUtilizationRates)(NvmlDevice device,
                                              NvmlUtilization* utilization) = nullptr;
  NvmlReturn (*nvmlDeviceGetMemoryInfo)(NvmlDevice device, NvmlMemory* memory) = nullptr;
  // Milliwatts.
  NvmlReturn (*nvmlDeviceGetPowerUsage)(NvmlDevice device, unsigned int* power_mw) = nullptr;
  // MHz; the type is an enum in nvml.h, passed as an int by the C ABI.
  NvmlReturn (*nvmlDeviceGetClockInfo)(NvmlDevice device, int type,
                                       unsigned int* clock_mhz) = nullptr;
  // Millijoules since the driver was loaded (Volta and newer).
  NvmlReturn (*nvmlDeviceGetTotalEnergyConsumption)(NvmlDevice device,
                                                    unsigned long long* energy_mj) = nullptr;
  NvmlReturn (*nvmlDeviceGetName)(NvmlDevice device, char* name, unsigned int length) = nullptr;
  const char* (*nvmlErrorString)(NvmlReturn result) = nullptr;

  // Keeps the library loaded and NVML initialised while any copy of the table lives; its
  // deleter calls nvmlShutdown and dlclose. Empty for a table of fakes.
  std::shared_ptr<void> library;
};

// Loads libnvidia-ml.so.1 with dlopen (no build dependency on CUDA) and calls nvmlInit_v2.
// nullopt, with *why_not (if given) set to a one-line reason, when the library is missing,
// lacks a required symbol, or nvmlInit fails (no driver, no GPU). `library` is for tests.
std::optional<NvmlApi> load_nvml(std::string* why_not, const char* library = "libnvidia-ml.so.1");

// The GPU that CUDA calls device `cuda_index`, read through NVML. CUDA numbers only the GPUs
// listed in CUDA_VISIBLE_DEVICES when it is set, so the index is mapped through it: an entry
// that is a number is NVML's index, an entry "GPU-..." or "MIG-..." is a UUID (it must be the
// whole UUID, as nvidia-smi -L prints it; CUDA also accepts a prefix, NVML does not). Without
// CUDA_VISIBLE_DEVICES the index is used as is, which matches CUDA's numbering when
// CUDA_DEVICE_ORDER=PCI_BUS_ID or all GPUs are alike (CUDA puts the fastest first by default,
// NVML orders by PCI bus).
class NvmlSensor final : public GpuSensor {
 public:
  // Throws a runtime error naming the cause when the device cannot be found.
  NvmlSensor(NvmlApi api, int cuda_index);
  // A query that fails (NVML_ERROR_NOT_SUPPORTED on this device, or any other error) leaves its
  // field nullopt. Converted: mW -> W, mJ -> J.
  GpuReading read() override;
  std::string name() const override { return name_; }

 private:
  NvmlApi api_;
  NvmlDevice device_ = nullptr;
  std::string name_;
};

// load_nvml + NvmlSensor; nullptr, with *why_not (if given) set, when either fails.
std::unique_ptr<GpuSensor> open_nvml_sensor(int cuda_index, std::string* why_not);

// ---------------------------------------------------------------------------------------
// Energy counters

// A counter of energy used since some arbitrary origin: it only grows, and may wrap to 0 at
// wrap_j(). Only differences between reads mean anything.
class EnergyCounter {
 public:
  virtual ~EnergyCounter() = default;
  // nullopt when the counter cannot be read now.
  virtual std::optional<double> read_j() = 0;
  // Where the counter wraps; nullopt when it does not wrap (or handles wrapping itself).
  virtual std::optional<double> wrap_j() const = 0;
  // What is measured, for the record (e.g. "RAPL package-0 + package-1").
  virtual std::string source() const = 0;
};

// Intel RAPL (and AMD's, which Linux exposes the same way) through the powercap interface:
// the sum of the top-level zones <root>/intel-rapl:N named package-N. The "psys" zone (the
// whole platform, packages included) is used only when there is no package zone, since adding
// it to them would count the packages twice. Each package's energy_uj wraps at its own
// max_energy_range_uj, so the counter unwraps each package itself and read_j() never goes
// down (wrap_j() is nullopt); that needs one read per wrap period (minutes at full power).
// RAPL measures the whole package, every process on the machine, not this process alone.
//
// nullptr, with *why_not (if given) set, when there is no such zone or a file is unreadable:
// since Linux 5.10 energy_uj is readable by root only (CVE-2020-8694).
std::unique_ptr<EnergyCounter> open_rapl(std::string* why_not,
                                         const std::string& root = "/sys/class/powercap");

}  // namespace gradscope
