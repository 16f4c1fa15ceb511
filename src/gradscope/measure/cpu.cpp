#include "gradscope/measure/cpu.h"

#include <time.h>

#include "gradscope/measure/clock.h"

namespace gradscope {

double process_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double cpu_utilization_pct(double cpu_s, double wall_s, int threads) {
  if (wall_s <= 0.0 || threads < 1) return 0.0;
  return cpu_s / (wall_s * threads) * 100.0;
}

CpuUtilization::CpuUtilization(int threads) : threads_(threads) { restart(); }

void CpuUtilization::restart() {
  start_wall_s_ = SteadyClock().now_s();
  start_cpu_s_ = process_cpu_seconds();
}

double CpuUtilization::cpu_s() const { return process_cpu_seconds() - start_cpu_s_; }

double CpuUtilization::wall_s() const { return SteadyClock().now_s() - start_wall_s_; }

double CpuUtilization::pct() const {
  // CPU time first: reading the wall clock second can only make the result smaller, never
  // above what was really used.
  const double cpu = cpu_s();
  return cpu_utilization_pct(cpu, wall_s(), threads_);
}

}  // namespace gradscope
