#include "gradscope/measure/sensors.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>

#include "gradscope/core/error.h"

namespace gradscope {
namespace {

// The whole file, or nullopt when it cannot be opened or read; errno is left as the failure
// set it, for messages.
std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

// A whole decimal token as an unsigned integer; nullopt for anything else (signs, garbage,
// overflow), so a malformed file is refused rather than read as 0.
std::optional<unsigned long long> parse_unsigned(const std::string& token) {
  if (token.empty() ||
      !std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(token.c_str(), &end, 10);
  if (errno == ERANGE || end != token.c_str() + token.size()) return std::nullopt;
  return value;
}

std::vector<std::string> split_whitespace(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> tokens;
  for (std::string token; in >> token;) tokens.push_back(token);
  return tokens;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// ProcCpuSensor

ProcCpuSensor::ProcCpuSensor(std::string proc_dir)
    : proc_dir_(std::move(proc_dir)),
      ticks_per_s_(static_cast<double>(sysconf(_SC_CLK_TCK))),
      page_bytes_(static_cast<int64_t>(sysconf(_SC_PAGESIZE))) {}

std::optional<CpuReading> ProcCpuSensor::read() {
  const auto stat = read_text(proc_dir_ + "/stat");
  const auto statm = read_text(proc_dir_ + "/statm");
  if (!stat || !statm || ticks_per_s_ <= 0 || page_bytes_ <= 0) return std::nullopt;

  // "pid (comm) state ppid ...": comm is the executable's name, which may hold spaces and
  // parentheses, so the fields are counted from the last ')'. After it, field 3 (state) is
  // token 0, so field n is token n - 3.
  const auto close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const auto fields = split_whitespace(stat->substr(close + 1));
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kNumThreads = 20 - 3;
  if (fields.size() <= kNumThreads) return std::nullopt;
  const auto utime = parse_unsigned(fields[kUtime]);
  const auto stime = parse_unsigned(fields[kStime]);
  const auto threads = parse_unsigned(fields[kNumThreads]);

  // statm: "size resident shared text lib data dt", in pages.
  const auto pages = split_whitespace(*statm);
  if (pages.size() < 2) return std::nullopt;
  const auto resident = parse_unsigned(pages[1]);
  if (!utime || !stime || !threads || !resident) return std::nullopt;

  CpuReading reading;
  reading.cpu_s = static_cast<double>(*utime + *stime) / ticks_per_s_;
  reading.threads = static_cast<int>(*threads);
  reading.rss_bytes = static_cast<int64_t>(*resident) * page_bytes_;
  return reading;
}

// ---------------------------------------------------------------------------------------
// NVML

namespace {

std::string nvml_error(const NvmlApi& api, NvmlReturn rc) {
  const char* text = api.nvmlErrorString ? api.nvmlErrorString(rc) : nullptr;
  return text ? fmt::format("{} (NVML error {})", text, rc) : fmt::format("NVML error {}", rc);
}

// What CUDA_VISIBLE_DEVICES makes of CUDA device `cuda_index`: an NVML index or a UUID.
struct NvmlTarget {
  std::optional<unsigned int> index;
  std::string uuid;
};

NvmlTarget nvml_target(int cuda_index) {
  check_usage(cuda_index >= 0, fmt::format("CUDA device index {} must be >= 0", cuda_index));
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return {static_cast<unsigned int>(cuda_index), ""};

  // CUDA reads the list up to its first entry that names no device ("-1" is the usual way to
  // hide every GPU) and ignores the rest, so the list is cut there too.
  std::vector<NvmlTarget> targets;
  std::stringstream list(visible);
  for (std::string entry; std::getline(list, entry, ',');) {
    entry = trim(entry);
    if (const auto index = parse_unsigned(entry)) {
      targets.push_back({static_cast<unsigned int>(*index), ""});
    } else if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
      targets.push_back({std::nullopt, entry});
    } else {
      break;
    }
  }
  if (static_cast<size_t>(cuda_index) >= targets.size())
    fail_runtime(
        fmt::format("CUDA device {} is not among CUDA_VISIBLE_DEVICES=\"{}\"", cuda_index, visible),
        "pick a device index below the number of GPUs CUDA_VISIBLE_DEVICES lists");
  return targets[cuda_index];
}

}  // namespace

std::optional<NvmlApi> load_nvml(std::string* why_not, const char* library) {
  auto refuse = [&](const std::string& reason) -> std::optional<NvmlApi> {
    if (why_not) *why_not = reason;
    return std::nullopt;
  };
  // RTLD_LOCAL: NVML's symbols stay out of the global namespace, where a CUDA LibTorch might
  // meet them.
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = dlerror();
    return refuse(fmt::format("{} not found (no NVIDIA driver): {}", library,
                              error ? error : "dlopen failed"));
  }

  NvmlApi api;
  // dlsym returns void*; POSIX guarantees that it converts to a function pointer.
  auto bind = [&](auto& slot, const char* symbol) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(handle, symbol));
  };
  bind(api.nvmlInit_v2, "nvmlInit_v2");
  bind(api.nvmlShutdown, "nvmlShutdown");
  bind(api.nvmlDeviceGetHandleByIndex_v2, "nvmlDeviceGetHandleByIndex_v2");
  bind(api.nvmlDeviceGetHandleByUUID, "nvmlDeviceGetHandleByUUID");
  bind(api.nvmlDeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  bind(api.nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  bind(api.nvmlDeviceGetPowerUsage, "nvmlDeviceGetPowerUsage");
  bind(api.nvmlDeviceGetClockInfo, "nvmlDeviceGetClockInfo");
  bind(api.nvmlDeviceGetTotalEnergyConsumption, "nvmlDeviceGetTotalEnergyConsumption");
  bind(api.nvmlDeviceGetName, "nvmlDeviceGetName");
  bind(api.nvmlErrorString, "nvmlErrorString");
  for (const auto& [present, symbol] :
       {std::pair<bool, const char*>{api.nvmlInit_v2 != nullptr, "nvmlInit_v2"},
        {api.nvmlShutdown != nullptr, "nvmlShutdown"},
        {api.nvmlDeviceGetHandleByIndex_v2 != nullptr, "nvmlDeviceGetHandleByIndex_v2"}}) {
    if (!present) {
      dlclose(handle);
      return refuse(fmt::format("{} lacks {} (NVIDIA driver too old)", library, symbol));
    }
  }
  const NvmlReturn rc = api.nvmlInit_v2();
  if (rc != kNvmlSuccess) {
    const std::string reason = fmt::format("nvmlInit failed: {}", nvml_error(api, rc));
    dlclose(handle);
    return refuse(reason);
  }
  auto shutdown = api.nvmlShutdown;
  api.library = std::shared_ptr<void>(handle, [shutdown](void* h) {
    shutdown();
    dlclose(h);
  });
  return api;
}

NvmlSensor::NvmlSensor(NvmlApi api, int cuda_index) : api_(std::move(api)) {
  const NvmlTarget target = nvml_target(cuda_index);
  NvmlReturn rc = kNvmlErrorNotSupported;
  if (target.index) {
    if (api_.nvmlDeviceGetHandleByIndex_v2)
      rc = api_.nvmlDeviceGetHandleByIndex_v2(*target.index, &device_);
  } else if (api_.nvmlDeviceGetHandleByUUID) {
    rc = api_.nvmlDeviceGetHandleByUUID(target.uuid.c_str(), &device_);
  }
  if (rc != kNvmlSuccess) {
    const std::string which =
        target.index ? fmt::format("index {}", *target.index) : fmt::format("UUID {}", target.uuid);
    fail_runtime(
        fmt::format("NVML has no device {} (CUDA device {}): {}", which, cuda_index,
                    nvml_error(api_, rc)),
        "check CUDA_VISIBLE_DEVICES against nvidia-smi -L (whole UUIDs, or NVML's indices)");
  }
  char name[kNvmlDeviceNameBytes] = {};
  if (api_.nvmlDeviceGetName &&
      api_.nvmlDeviceGetName(device_, name, kNvmlDeviceNameBytes) == kNvmlSuccess) {
    name[kNvmlDeviceNameBytes - 1] = '\0';
    name_ = name;
  } else {
    name_ = fmt::format("cuda:{}", cuda_index);
  }
}

GpuReading NvmlSensor::read() {
  GpuReading r;
  NvmlUtilization util{};
  if (api_.nvmlDeviceGetUtilizationRates &&
      api_.nvmlDeviceGetUtilizationRates(device_, &util) == kNvmlSuccess)
    r.util_pct = static_cast<double>(util.gpu);
  NvmlMemory memory{};
  if (api_.nvmlDeviceGetMemoryInfo &&
      api_.nvmlDeviceGetMemoryInfo(device_, &memory) == kNvmlSuccess)
    r.memory_used_bytes = static_cast<int64_t>(memory.used);
  unsigned int power_mw = 0;
  if (api_.nvmlDeviceGetPowerUsage &&
      api_.nvmlDeviceGetPowerUsage(device_, &power_mw) == kNvmlSuccess)
    r.power_w = static_cast<double>(power_mw) / 1000.0;
  unsigned int clock_mhz = 0;
  if (api_.nvmlDeviceGetClockInfo &&
      api_.nvmlDeviceGetClockInfo(device_, kNvmlClockSm, &clock_mhz) == kNvmlSuccess)
    r.sm_clock_mhz = static_cast<double>(clock_mhz);
  unsigned long long energy_mj = 0;
  if (api_.nvmlDeviceGetTotalEnergyConsumption &&
      api_.nvmlDeviceGetTotalEnergyConsumption(device_, &energy_mj) == kNvmlSuccess)
    r.energy_j = static_cast<double>(energy_mj) / 1000.0;
  return r;
}

std::unique_ptr<GpuSensor> open_nvml_sensor(int cuda_index, std::string* why_not) {
  auto api = load_nvml(why_not);
  if (!api) return nullptr;
  try {
    return std::make_unique<NvmlSensor>(std::move(*api), cuda_index);
  } catch (const Error& e) {
    // No sensor is a normal outcome here (the record says null), not a failed run.
    if (why_not) *why_not = e.what();
    return nullptr;
  }
}

// ---------------------------------------------------------------------------------------
// RAPL

namespace {

class RaplCounter final : public EnergyCounter {
 public:
  struct Zone {
    std::string energy_path;  // .../energy_uj
    std::string name;         // package-0, psys
    double range_j = 0.0;     // where energy_uj wraps
    std::optional<double> last_j;
    double wrapped_j = 0.0;  // range_j times the wraps seen so far
  };

  RaplCounter(std::vector<Zone> zones, std::string root)
      : zones_(std::move(zones)), root_(std::move(root)) {}

  std::optional<double> read_j() override {
    // Every zone is read before any state changes, so a failed read leaves none half updated.
    std::vector<double> now_j;
    for (const auto& zone : zones_) {
      const auto text = read_text(zone.energy_path);
      const auto uj = text ? parse_unsigned(trim(*text)) : std::nullopt;
      if (!uj) return std::nullopt;
      now_j.push_back(static_cast<double>(*uj) * 1e-6);
    }
    double total_j = 0.0;
    for (size_t i = 0; i < zones_.size(); ++i) {
      Zone& zone = zones_[i];
      if (zone.last_j && now_j[i] < *zone.last_j) zone.wrapped_j += zone.range_j;
      zone.last_j = now_j[i];
      total_j += now_j[i] + zone.wrapped_j;
    }
    return total_j;
  }

  std::optional<double> wrap_j() const override { return std::nullopt; }

  std::string source() const override {
    std::string names;
    for (const auto& zone : zones_) names += (names.empty() ? "" : " + ") + zone.name;
    return fmt::format("RAPL {} ({})", names, root_);
  }

 private:
  std::vector<Zone> zones_;
  std::string root_;
};

}  // namespace

std::unique_ptr<EnergyCounter> open_rapl(std::string* why_not, const std::string& root) {
  auto refuse = [&](const std::string& reason) -> std::unique_ptr<EnergyCounter> {
    if (why_not) *why_not = reason;
    return nullptr;
  };
  namespace fs = std::filesystem;
  std::error_code ec;
  // (zone number, zone): top-level zones are intel-rapl:N; intel-rapl:N:M are their parts
  // (cores, dram), already inside the package's figure.
  std::vector<std::pair<unsigned long long, RaplCounter::Zone>> packages, platform;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string dir = it->path().filename().string();
    const std::string prefix = "intel-rapl:";
    if (dir.rfind(prefix, 0) != 0) continue;
    const auto number = parse_unsigned(dir.substr(prefix.size()));
    if (!number) continue;
    const std::string path = it->path().string();
    RaplCounter::Zone zone;
    zone.energy_path = path + "/energy_uj";
    const auto name = read_text(path + "/name");
    zone.name = name ? trim(*name) : dir;
    const auto range_text = read_text(path + "/max_energy_range_uj");
    const auto range_uj = range_text ? parse_unsigned(trim(*range_text)) : std::nullopt;
    if (!range_uj || *range_uj == 0)
      return refuse(fmt::format("cannot read {}/max_energy_range_uj", path));
    zone.range_j = static_cast<double>(*range_uj) * 1e-6;
    (zone.name == "psys" ? platform : packages).emplace_back(*number, std::move(zone));
  }
  if (packages.empty()) packages = std::move(platform);
  if (packages.empty())
    return refuse(fmt::format("no RAPL zones under {} (no powercap driver, or a VM)", root));
  std::sort(packages.begin(), packages.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  std::vector<RaplCounter::Zone> zones;
  for (auto& [number, zone] : packages) {
    // Probe now: a counter that cannot be read is better refused here than reported as
    // unreadable for the whole run.
    errno = 0;
    std::ifstream probe(zone.energy_path);
    const int error = errno;
    if (!probe) {
      return refuse(fmt::format("cannot read {}: {}{}", zone.energy_path, std::strerror(error),
                                error == EACCES ? " (root only since Linux 5.10)" : ""));
    }
    zones.push_back(std::move(zone));
  }
  auto counter = std::make_unique<RaplCounter>(std::move(zones), root);
  if (!counter->read_j()) return refuse(fmt::format("cannot parse RAPL counters under {}", root));
  return counter;
}

}  // namespace gradscope
