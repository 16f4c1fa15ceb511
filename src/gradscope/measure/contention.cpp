#include "gradscope/measure/contention.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace gradscope {
namespace {

std::string read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

double ticks_per_second() {
  static const double ticks = [] {
    const long t = sysconf(_SC_CLK_TCK);
    return t > 0 ? static_cast<double>(t) : 100.0;
  }();
  return ticks;
}

}  // namespace

ProcStat parse_proc_stat(const std::string& text, double ticks_per_s) {
  ProcStat out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name == "cpu") {
      // user nice system idle iowait irq softirq steal ...
      double v[8];
      int n = 0;
      while (n < 8 && words >> v[n]) ++n;
      if (n == 8 && v[7] >= 0 && ticks_per_s > 0) out.steal_s = v[7] / ticks_per_s;
    } else if (name.size() > 3 && name.compare(0, 3, "cpu") == 0 &&
               std::all_of(name.begin() + 3, name.end(), ::isdigit)) {
      ++out.cpus;
    } else if (name == "procs_running") {
      long long v = 0;
      if (words >> v && v >= 0) out.procs_running = v;
    }
  }
  return out;
}

ContentionReading read_contention() {
  ContentionReading r;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) r.involuntary_switches = usage.ru_nivcsw;
  const ProcStat stat = parse_proc_stat(read_text("/proc/stat"), ticks_per_second());
  r.steal_s = stat.steal_s;
  r.procs_running = stat.procs_running;
  return r;
}

int64_t machine_cpus() {
  static const int64_t cpus = [] {
    const ProcStat stat = parse_proc_stat(read_text("/proc/stat"), ticks_per_second());
    if (stat.cpus > 0) return stat.cpus;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return static_cast<int64_t>(std::max(1L, online));
  }();
  return cpus;
}

StepContention step_contention(const ContentionReading& start, const ContentionReading& end,
                               int64_t threads) {
  StepContention s;
  if (start.involuntary_switches && end.involuntary_switches)
    s.involuntary_switches = std::max<int64_t>(0, *end.involuntary_switches -
                                                      *start.involuntary_switches);
  if (start.steal_s && end.steal_s) s.steal_s = std::max(0.0, *end.steal_s - *start.steal_s);
  // Each reading counts the reading thread itself and any of the run's threads still spinning
  // (OpenMP's workers wait busily for a while): the run's own share is at most its threads.
  const auto beyond = [threads](const std::optional<int64_t>& running) -> std::optional<double> {
    if (!running) return std::nullopt;
    return std::max<double>(0.0, static_cast<double>(*running - std::max<int64_t>(threads, 1)));
  };
  const std::optional<double> a = beyond(start.procs_running), b = beyond(end.procs_running);
  if (a && b)
    s.competing_tasks = (*a + *b) / 2;
  else if (a || b)
    s.competing_tasks = a ? *a : *b;
  return s;
}

MachineLoad measure_machine_load(int readings, double interval_s) {
  MachineLoad load;
  load.cpus = machine_cpus();
  double sum = 0;
  int n = 0;
  for (int i = 0; i < readings; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
    const ProcStat stat = parse_proc_stat(read_text("/proc/stat"), ticks_per_second());
    if (!stat.procs_running) continue;
    sum += static_cast<double>(std::max<int64_t>(*stat.procs_running - 1, 0));  // not the reader
    ++n;
  }
  if (n > 0) {
    load.measured = true;
    load.other_tasks_mean = sum / n;
    load.busy = load.other_tasks_mean >= 0.5;
  }
  std::istringstream avg(read_text("/proc/loadavg"));
  double one = 0;
  if (avg >> one) load.loadavg_1min = one;
  return load;
}

}  // namespace gradscope
