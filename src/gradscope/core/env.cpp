#include "gradscope/core/env.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include <torch/torch.h>
#include "gradscope/core/error.h"

#ifndef GRADSCOPE_GIT_COMMIT
#define GRADSCOPE_GIT_COMMIT "unknown"
#endif

namespace gradscope {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(' '));
        return name;
      }
    }
  }
  return "unknown CPU";
}

}  // namespace

EnvInfo current_env(const std::string& device) {
  EnvInfo env;
  env.gradscope_version = GRADSCOPE_VERSION;
  env.libtorch = TORCH_VERSION;
  env.git_commit = GRADSCOPE_GIT_COMMIT;
  env.threads = at::get_num_threads();
  env.blas_threads = blas_threads();
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) env.host = host;
#ifdef NDEBUG
  env.build_type = "release";
#else
  env.build_type = "debug";
#endif
  if (device.rfind("cuda", 0) == 0 && torch::cuda::is_available()) {
    env.device_name = "cuda";  // refined by the CUDA-aware measure code when present
  } else {
    env.device_name = cpu_model_name();
  }
  return env;
}

int blas_threads() {
  using GetThreads = int (*)();
  if (auto fn = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads")))
    return fn();
  return 0;
}

int64_t usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

int64_t max_threads_here() { return 4 * usable_cores(); }

int64_t max_local_ranks_here() { return usable_cores() + 4; }

void check_threads_here(int64_t threads) {
  const int64_t cores = usable_cores();
  check_usage(threads <= max_threads_here(),
              fmt::format("--threads {} is more than this machine allows: at most {} (4 x its {} "
                          "usable cores)",
                          threads, max_threads_here(), cores),
              fmt::format("pass at most --threads {}, or 0 for LibTorch's default (the cores)",
                          cores));
}

void check_local_ranks_here(int64_t nproc) {
  const int64_t cores = usable_cores();
  check_usage(nproc <= max_local_ranks_here(),
              fmt::format("--nproc {} starts more ranks than this machine allows: at most {} (its "
                          "{} usable cores + 4)",
                          nproc, max_local_ranks_here(), cores),
              "pass fewer ranks, or start ranks on several machines with torchrun or srun "
              "(docs/distributed.md)");
}

std::optional<int64_t> env_integer(const char* name, int64_t min, int64_t max,
                                   const std::string& hint) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  check_usage(errno == 0 && end != v && *end == '\0' && x >= min && x <= max,
              fmt::format("environment variable {}='{}' is not a whole number in [{}, {}]", name,
                          std::string(v).substr(0, 40), min, max),
              hint);
  return x;
}

std::string data_dir() {
  if (const char* dir = std::getenv("GRADSCOPE_DATA"); dir && *dir) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/gradscope";
}

int64_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    fail_usage("cannot read '" + text + "' as a byte count",
               "write a number with an optional unit: 1000000, 512MiB, 8GiB, 2GB");
  }
  std::string unit = text.substr(pos);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  double scale = 1;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "KiB" || unit == "K")
    scale = 1024.0;
  else if (unit == "MiB" || unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kB" || unit == "KB")
    scale = 1e3;
  else if (unit == "MB")
    scale = 1e6;
  else if (unit == "GB")
    scale = 1e9;
  else if (unit == "TB")
    scale = 1e12;
  else
    fail_usage("unknown byte unit '" + unit + "' in '" + text + "'",
               "use B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB (powers of 1000)");
  double bytes = value * scale;
  check_usage(std::isfinite(bytes) && bytes > 0, "byte count '" + text + "' must be positive",
              "write a positive size such as 512MiB or 8GiB");
  // 2^63 bytes and more do not fit the count (they would wrap to a negative number).
  check_usage(bytes < 9223372036854775808.0, "byte count '" + text + "' is too large",
              "write a size below 8 EiB, such as 512MiB or 8GiB");
  check_usage(bytes >= 1, "byte count '" + text + "' is less than one byte",
              "write a size of at least 1B, such as 512MiB or 8GiB");
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", v) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string format_si(double value) {
  const char* units[] = {"", " k", " M", " G", " T", " P"};
  int u = 0;
  double v = value;
  while (std::fabs(v) >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:.3g}{}", v, units[u]);
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "n/a";
  if (s < 1) return fmt::format("{:.0f}ms", s * 1000);
  if (s < 60) return fmt::format("{:.1f}s", s);
  if (s < 3600)
    return fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt::format("{}h{:02d}m", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
}

}  // namespace gradscope
